"""Bearer-token authentication: HS256 JWTs (RFC 7519, RFC 6750) verified with PyJWT.

The user is the token's ``sub`` claim, never a client-supplied id. ``exp`` is checked when
present (tokens minted by ``jobsched token`` always carry one).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jwt

from core.errors import Unauthorized

ALGORITHM = "HS256"
LEEWAY_S = 30
MAX_USER_LENGTH = 256
"""Longest user id (a token's ``sub``), in characters: it is part of NATS subjects, whose
control line nats-server limits to 4,096 bytes."""


def mint_token(secret: str, user: str, *, ttl: timedelta = timedelta(days=1)) -> str:
    """A signed token for ``user`` valid for ``ttl`` (RFC 7519 claims ``sub``, ``iat``, ``exp``)."""
    now = datetime.now(UTC)
    return jwt.encode({"sub": user, "iat": now, "exp": now + ttl}, secret, algorithm=ALGORITHM)


def user_from_authorization(header: str | None, secret: str) -> str:
    """The ``sub`` of a valid ``Authorization: Bearer <jwt>`` header value.

    Raises:
        Unauthorized: header missing or not a bearer token, bad signature, expired, no ``sub``
            or no ``exp`` (a token without one would never expire), a ``sub`` longer than
            :data:`MAX_USER_LENGTH` or not valid Unicode.
    """
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    return user_from_token(token.strip(), secret)


def user_from_token(token: str, secret: str) -> str:
    """The ``sub`` of a valid token. Raises Unauthorized (see :func:`user_from_authorization`)."""
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            leeway=LEEWAY_S,
            options={"require": ["sub", "exp"]},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthorized("the token has expired") from None
    except jwt.InvalidTokenError as e:
        raise Unauthorized(f"invalid token: {e}") from None
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise Unauthorized("invalid token: 'sub' must be a non-empty string")
    if len(sub) > MAX_USER_LENGTH:
        raise Unauthorized(f"invalid token: 'sub' is longer than {MAX_USER_LENGTH} characters")
    try:
        sub.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON allows "\ud800")
        raise Unauthorized("invalid token: 'sub' is not valid Unicode text") from None
    return sub
