"""Bearer-token authentication: HS256 JWTs (RFC 7519, RFC 6750) verified with PyJWT.

The user is the token's ``sub`` claim, never a client-supplied id; ``exp`` is required. The
optional ``role`` (``user``, ``admin``) and ``scope`` (``jobs:read jobs:write``) claims decide
what the user may do (:mod:`core.access`); a token naming an unknown one is rejected.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jwt

from core.access import SCOPES, Principal, Role, parse_role, parse_scope
from core.errors import Unauthorized

ALGORITHM = "HS256"
LEEWAY_SECONDS = 30
MAX_USER_LENGTH = 256
"""Longest user id (a token's ``sub``), in characters: it is part of NATS subjects, whose
control line nats-server limits to 4,096 bytes."""


def mint_token(
    secret: str,
    user: str,
    *,
    ttl: timedelta = timedelta(days=1),
    role: Role = Role.USER,
    scopes: frozenset[str] = SCOPES,
) -> str:
    """A signed token for ``user`` valid for ``ttl``: RFC 7519 claims ``sub``, ``iat``, ``exp``,
    and jobsched's ``role`` and ``scope`` (space-separated, sorted)."""
    now = datetime.now(UTC)
    claims = {
        "sub": user,
        "iat": now,
        "exp": now + ttl,
        "role": role.value,
        "scope": " ".join(sorted(scopes)),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def user_from_authorization(header: str | None, secret: str) -> str:
    """The ``sub`` of a valid ``Authorization: Bearer <jwt>`` header value.

    Raises:
        Unauthorized: see :func:`principal_from_authorization`.
    """
    return principal_from_authorization(header, secret).user


def user_from_token(token: str, secret: str) -> str:
    """The ``sub`` of a valid token. Raises Unauthorized (see :func:`principal_from_token`)."""
    return principal_from_token(token, secret).user


def principal_from_authorization(header: str | None, secret: str) -> Principal:
    """The caller named by a valid ``Authorization: Bearer <jwt>`` header value.

    Raises:
        Unauthorized: header missing or not a bearer token, or the token is invalid (see
            :func:`principal_from_token`).
    """
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    return principal_from_token(token.strip(), secret)


def principal_from_token(token: str, secret: str) -> Principal:
    """The caller a valid token names: its ``sub``, ``role`` and ``scope``.

    Raises:
        Unauthorized: bad signature, expired, no ``sub`` or no ``exp`` (a token without one
            would never expire), a ``sub`` longer than :data:`MAX_USER_LENGTH` or not valid
            Unicode, an unknown ``role`` or ``scope``.
    """
    return principal_and_expiry(token, secret)[0]


def principal_and_expiry(token: str, secret: str) -> tuple[Principal, datetime]:
    """The caller a valid token names (as :func:`principal_from_token`) and its ``exp`` (UTC),
    for what must not outlive the token (the NATS auth callout's user, :mod:`bus.callout`).

    Raises:
        Unauthorized: as :func:`principal_from_token`.
    """
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            leeway=LEEWAY_SECONDS,
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
    try:
        role = parse_role(claims.get("role"))
        scopes = parse_scope(claims.get("scope"))
    except ValueError as e:
        raise Unauthorized(f"invalid token: {e}") from None
    return Principal(user=sub, role=role, scopes=scopes), _expiry(claims["exp"])


def _expiry(exp: object) -> datetime:
    """``exp`` as PyJWT accepted it (whatever ``int()`` takes), as a UTC time; one past the
    year 9999 is that year's end."""
    try:
        return datetime.fromtimestamp(int(exp), UTC)  # type: ignore[call-overload]
    except (OverflowError, ValueError, OSError):
        return datetime.max.replace(tzinfo=UTC)
