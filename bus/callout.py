"""NATS auth callout for API clients: the HTTP API's bearer token becomes per-user NATS permissions.

The protocol is NATS ADR-26 ("NATS Authorization Callouts", nats-server 2.10+) in server
configuration mode, as nats-server's ``server/auth_callout.go`` implements it:

1. A client connects with its bearer token as its NATS token (``CONNECT {"auth_token": ...}``;
   nats-py ``connect(token=...)``). Its user is not one of the static users that
   ``auth_callout { auth_users }`` lets through, so the server publishes an *authorization
   request* to ``$SYS.REQ.USER.AUTH``: a JWT signed by the server's own nkey (``iss`` = the
   server's public key, also ``nats.server_id.id``), ``sub`` = the configured issuer account,
   ``aud`` = ``nats-authorization-request``, ``nats.type`` = ``authorization_request``,
   ``nats.user_nkey`` = a user nkey the server made for this connection only (against replay),
   ``nats.connect_opts`` = what the client sent.
2. :class:`AuthCallout` (every gateway process runs one, in one queue group) checks that
   signature and those claims, verifies the token exactly as the HTTP API does (same secret,
   expiry, roles and scopes) and answers with an *authorization response* JWT signed by the
   issuer account nkey: ``sub`` = the ``user_nkey``, ``aud`` = the server's id, ``nats.type`` =
   ``authorization_response`` and either ``nats.jwt`` (a *user* JWT: ``sub`` = the
   ``user_nkey``, ``aud`` = ``$G`` (the account to bind the client to; server mode places the
   user by ``aud``), ``exp`` = the token's ``exp``, publish only ``<prefix>.api.>``, subscribe
   only the user's own inbox ``_INBOX_<h>.>``) or ``nats.error`` (a refusal; the server then
   closes the connection with an authorization violation). ``issuer_account`` is not set: the
   server rejects it outside operator mode.
3. The server checks the response (signature, ``sub``, ``aud``, the user JWT's issuer = the
   configured ``issuer``) and applies the permissions; it disconnects the client when the user
   JWT expires, so a connection never outlives its token.

The inbox ``_INBOX_<h>``: ``h`` is the first 128 bits of BLAKE2b (personalised
``jobsched-inbox``) of the token's ``sub``, in hex. It is a single valid subject token whatever
the user id holds (``.``, ``*``, ``>``, spaces, any Unicode), cannot be chosen to reach another
user's inbox (a collision needs a 2^64 birthday search), and can never equal a static user's
inbox ``_INBOX_<prefix>-<role>`` (those hold a ``-``). Every connection of one user shares it;
nats-py adds a random token per connection under it. :func:`api_inbox_prefix` computes it from
a token, for clients.

JWT wire format (nats-io/jwt v2, ``v2/claims.go`` and ``v2/header.go``): header
``{"typ":"JWT","alg":"ed25519-nkey"}``, base64url without padding, ``header.payload`` signed
with ed25519 by the nkey named in ``iss``; ``jti`` is the base32 (no padding) SHA-512/256 of
the claims without it. There is no well-kept Python package for it (PyPI ``nats-jwt`` 0.2.2
calls itself "not well-tested" and has no authorization request/response claims), so the few
lines are here; the keys are the nats-io ``nkeys`` package's.

Not done: encryption with xkeys (``auth_callout { xkey }``): ``nkeys`` 0.2 has no curve keys.
A request that arrives encrypted (header ``Nats-Server-Xkey``) is not answered, so its client
is refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from nats.aio.msg import Msg

from bus.auth import ROLES, generate_users
from bus.nats import Bus
from core.errors import ConfigError, Unauthorized

log = logging.getLogger(__name__)

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
"""Where the server sends authorization requests (ADR-26)."""
QUEUE_GROUP = "jobsched-callout"
REQUEST_AUDIENCE = "nats-authorization-request"
"""The ``aud`` of every authorization request (``AuthRequestSubject`` in auth_callout.go)."""
GLOBAL_ACCOUNT = "$G"
"""nats-server's default account: where the static users and the API clients live."""
XKEY_HEADER = "Nats-Server-Xkey"
ALGORITHM = "ed25519-nkey"
JWT_VERSION = 2
MAX_TOKEN_BYTES = 1024 * 1024
"""Largest JWT decoded (nats-io/jwt's ``MaxTokenSize``)."""
CLOCK_SKEW_SECONDS = 5
"""Tolerance of the request's ``exp`` and ``nbf`` (seconds) for clocks that differ."""
ISSUER_SEED_FILE = "nats-callout-issuer.nk"
CALLOUT_ROLES = tuple(r for r in ROLES if r != "api")
"""The static users of a server with the callout: every role but ``api`` (API clients come
through the callout, so none of them shares a static user's inbox)."""

PREFIX_SERVER = nkeys.PREFIX_BYTE_SERVER
PREFIX_ACCOUNT = nkeys.PREFIX_BYTE_ACCOUNT
PREFIX_USER = nkeys.PREFIX_BYTE_USER


class CalloutError(ValueError):
    """A JWT or an authorization request that is malformed, badly signed or not for us. Its
    message never holds the token."""


class Grant(NamedTuple):
    """Who a valid bearer token names, and until when (timezone-aware)."""

    user: str
    expires_at: datetime


Authenticate = Callable[[str], Grant]
"""Verify a bearer token; raise :class:`core.errors.Unauthorized` when it is not valid."""


# -- nkeys ---------------------------------------------------------------------------------


def public_key_bytes(key: str, prefix: int) -> bytes:
    """The raw ed25519 public key of an encoded public nkey (base32 of prefix byte, 32 key
    bytes and a CRC-16 little-endian; nkeys' ``FromPublicKey``).

    Raises:
        CalloutError: not such a key, or of another kind than ``prefix`` (e.g. an account key
            where a server key is expected).
    """
    try:
        raw = base64.b32decode(key + "=" * (-len(key) % 8))
    except (binascii.Error, ValueError):
        raise CalloutError("not a base32 nkey") from None
    if len(raw) != 35 or raw[0] != prefix:
        raise CalloutError(f"not a public {_KINDS.get(prefix, 'nkey')} key")
    if int.from_bytes(raw[33:], "little") != nkeys.crc16(bytearray(raw[:33])):
        raise CalloutError("bad nkey checksum")
    return raw[1:33]


_KINDS = {PREFIX_SERVER: "server", PREFIX_ACCOUNT: "account", PREFIX_USER: "user"}


def is_public_key(key: object, prefix: int) -> bool:
    if not isinstance(key, str):
        return False
    try:
        public_key_bytes(key, prefix)
    except CalloutError:
        return False
    return True


class Issuer:
    """The issuer account's nkey pair, which signs the responses and the user JWTs.

    ``repr`` never shows the seed. Build it with :meth:`from_seed` or :func:`read_issuer`.
    """

    def __init__(self, keys: Any) -> None:
        self._keys = keys
        self.public_key: str = keys.public_key.decode()

    @classmethod
    def from_seed(cls, seed: bytes) -> Issuer:
        """The issuer of an encoded account seed.

        Raises:
            ConfigError: not an account nkey seed (``SA...``); the message never holds it.
        """
        try:
            prefix, _ = nkeys.decode_seed(seed)
            keys = nkeys.from_seed(seed)
        except (nkeys.NkeysError, ValueError, TypeError):
            raise ConfigError("the NATS callout issuer seed is not an nkey seed") from None
        if prefix != PREFIX_ACCOUNT:
            raise ConfigError("the NATS callout issuer seed is not an account seed (SA...)")
        return cls(keys)

    def sign(self, data: bytes) -> bytes:
        return bytes(self._keys.sign(data))

    def __repr__(self) -> str:
        return f"Issuer(public_key={self.public_key!r}, seed=<hidden>)"


def new_issuer_seed() -> bytes:
    """A fresh account nkey seed (``SA...``, 32 random bytes)."""
    return bytes(nkeys.encode_seed(os.urandom(32), PREFIX_ACCOUNT))


def write_issuer_seed(path: Path, seed: bytes) -> None:
    """Write ``seed`` to ``path``, created 0600, in a directory created 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(seed + b"\n")
    path.chmod(0o600)


def read_issuer(path: str | Path) -> Issuer:
    """The issuer whose seed ``path`` holds (``JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE``).

    Raises:
        ConfigError: the file cannot be read or holds no account seed (the message names the
            file, never its content).
    """
    try:
        seed = Path(path).read_bytes().strip()
    except OSError as e:
        raise ConfigError(
            f"JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE={path} cannot be read: {type(e).__name__}"
        ) from None
    try:
        return Issuer.from_seed(seed)
    except ConfigError as e:
        raise ConfigError(f"JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE={path}: {e}") from None


# -- JWT -----------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise CalloutError("not base64url") from None


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


_HEADER = _b64(_json({"typ": "JWT", "alg": ALGORITHM}))


def encode_jwt(claims: Mapping[str, Any], issuer: Issuer, *, now: float | None = None) -> str:
    """A NATS JWT of ``claims`` signed by ``issuer``, which also sets ``iss``, ``iat`` (seconds)
    and ``jti`` (nats-io/jwt ``ClaimsData.doEncode``)."""
    body = {**claims, "iss": issuer.public_key, "iat": int(time.time() if now is None else now)}
    body.pop("jti", None)
    digest = hashlib.new("sha512_256", _json(body)).digest()
    body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    signing_input = f"{_HEADER}.{_b64(_json(body))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode_jwt(token: str, *, issuer_prefix: int, now: float | None = None) -> dict[str, Any]:
    """The claims of a NATS JWT whose signature verifies with the key its ``iss`` names, an
    nkey of kind ``issuer_prefix``; ``exp`` and ``nbf`` (seconds) are checked against ``now``
    with :data:`CLOCK_SKEW_SECONDS` of tolerance (nats-io/jwt ``Decode`` and
    ``ClaimsData.Validate``).

    Raises:
        CalloutError: malformed, another algorithm, badly signed, expired or not yet valid.
    """
    if len(token) > MAX_TOKEN_BYTES:
        raise CalloutError("the JWT is too large")
    parts = token.split(".")
    if len(parts) != 3:
        raise CalloutError("a JWT has three parts")
    header, claims = _json_object(parts[0]), _json_object(parts[1])
    if str(header.get("typ", "")).upper() != "JWT" or str(header.get("alg", "")).lower() != (
        ALGORITHM
    ):
        raise CalloutError(f"not a NATS JWT (typ JWT, alg {ALGORITHM})")
    key = public_key_bytes(str(claims.get("iss", "")), issuer_prefix)
    try:
        VerifyKey(key).verify(f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2]))
    except (BadSignatureError, ValueError):
        raise CalloutError("bad JWT signature") from None
    t = time.time() if now is None else now
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if isinstance(exp, int) and exp > 0 and t > exp + CLOCK_SKEW_SECONDS:
        raise CalloutError("the JWT has expired")
    if isinstance(nbf, int) and nbf > 0 and nbf > t + CLOCK_SKEW_SECONDS:
        raise CalloutError("the JWT is not yet valid")
    return claims


def _json_object(part: str) -> dict[str, Any]:
    try:
        value = json.loads(_unb64(part))
    except (ValueError, RecursionError):
        raise CalloutError("a JWT part is not JSON") from None
    if not isinstance(value, dict):
        raise CalloutError("a JWT part is not a JSON object")
    return value


# -- the exchange --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What an authorization request says (``repr`` hides the token).

    Attributes:
        server_id: the public nkey of the server that signed it (``aud`` of the response).
        user_nkey: the subject the response and its user JWT must have.
        token: ``connect_opts.auth_token``; empty when the client sent none.
        client: the client's host and id, for the log (``client_info``).
    """

    server_id: str
    user_nkey: str
    token: str
    client: str

    def __repr__(self) -> str:
        return f"AuthRequest(server_id={self.server_id!r}, client={self.client!r}, token=<hidden>)"


def parse_request(data: bytes, issuer: str, *, now: float | None = None) -> AuthRequest:
    """Check an authorization request and read it: a JWT signed by the server it names
    (``iss`` = ``nats.server_id.id``, a server nkey), addressed to this issuer (``sub``) as a
    request (``aud`` = :data:`REQUEST_AUDIENCE`, ``nats.type`` = ``authorization_request``),
    with a ``nats.user_nkey`` that is a public user key (ADR-26; auth_callout.go).

    Raises:
        CalloutError: any of it does not hold.
    """
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise CalloutError("the request is not a JWT") from None
    claims = decode_jwt(text, issuer_prefix=PREFIX_SERVER, now=now)
    body = claims.get("nats")
    if not isinstance(body, dict) or body.get("type") != "authorization_request":
        raise CalloutError("not an authorization request")
    if claims.get("aud") != REQUEST_AUDIENCE or claims.get("sub") != issuer:
        raise CalloutError("the request is not addressed to this callout's issuer")
    server = body.get("server_id")
    if not isinstance(server, dict) or server.get("id") != claims["iss"]:
        raise CalloutError("the request is not signed by the server it names")
    user_nkey = body.get("user_nkey")
    if not is_public_key(user_nkey, PREFIX_USER):
        raise CalloutError("the request's user_nkey is not a public user key")
    opts = body.get("connect_opts")
    token = opts.get("auth_token", "") if isinstance(opts, dict) else ""
    info = body.get("client_info")
    client = f"{info.get('host', '?')}#{info.get('id', '?')}" if isinstance(info, dict) else "?"
    return AuthRequest(
        server_id=str(claims["iss"]),
        user_nkey=str(user_nkey),
        token=token if isinstance(token, str) else "",
        client=client,
    )


def inbox_hash(user: str) -> str:
    """``h`` of the user's inbox ``_INBOX_<h>`` (see the module docstring): 32 hex digits."""
    return hashlib.blake2b(user.encode(), digest_size=16, person=b"jobsched-inbox").hexdigest()


def user_inbox_prefix(user: str) -> str:
    """The only inbox an API client of ``user`` may subscribe to (nats-py ``inbox_prefix``)."""
    return f"_INBOX_{inbox_hash(user)}"


def api_inbox_prefix(token: str) -> str:
    """The inbox prefix a client connecting with ``token`` must use (``inbox_prefix=`` of
    ``nats.connect``): :func:`user_inbox_prefix` of the token's ``sub``, read without
    verifying it (the server's callout verifies it).

    Raises:
        ValueError: the token is not a JWT with a string ``sub``.
    """
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("the token is not a JWT")
    try:
        sub = _json_object(parts[1]).get("sub")
    except CalloutError as e:
        raise ValueError(f"the token is not a JWT: {e}") from None
    if not isinstance(sub, str) or not sub:
        raise ValueError("the token has no 'sub'")
    return user_inbox_prefix(sub)


def user_claims(user_nkey: str, grant: Grant, prefix: str) -> dict[str, Any]:
    """The user JWT's claims for the client of ``grant`` (nats-io/jwt ``UserClaims``; no limit
    on subscriptions, data or payload beyond the server's own: ``-1`` as ``NewUserClaims``)."""
    return {
        "sub": user_nkey,
        "aud": GLOBAL_ACCOUNT,
        "name": grant.user,
        "exp": int(grant.expires_at.timestamp()),
        "nats": {
            "pub": {"allow": [f"{prefix}.api.>"]},
            "sub": {"allow": [f"{user_inbox_prefix(grant.user)}.>"]},
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": JWT_VERSION,
        },
    }


def response_claims(request: AuthRequest, *, user_jwt: str = "", error: str = "") -> dict[str, Any]:
    """An authorization response's claims: exactly one of ``user_jwt`` and ``error``."""
    if bool(user_jwt) == bool(error):
        raise ValueError("an authorization response has a user JWT or an error")
    body: dict[str, Any] = {"type": "authorization_response", "version": JWT_VERSION}
    body["jwt" if user_jwt else "error"] = user_jwt or error
    return {"sub": request.user_nkey, "aud": request.server_id, "nats": body}


class Answer(NamedTuple):
    """A response JWT, and the user it admits or the reason it refuses (never the token)."""

    response: str
    user: str | None = None
    refusal: str = ""


def answer(
    request: AuthRequest,
    authenticate: Authenticate,
    issuer: Issuer,
    prefix: str,
    *,
    now: float | None = None,
) -> Answer:
    """The answer to ``request``: a user JWT for the token's user (:func:`user_claims`), or a
    refusal (no token, a token ``authenticate`` rejects, one that expires within a second) that
    carries the reason in ``nats.error``; nats-server logs it, so it never holds the token."""
    t = time.time() if now is None else now
    try:
        if not request.token:
            raise Unauthorized("no token; connect with the bearer token as the NATS token")
        grant = authenticate(request.token)
        if grant.expires_at.timestamp() < t + 1:
            raise Unauthorized("the token has expired")
    except Unauthorized as e:
        refusal = encode_jwt(response_claims(request, error=e.message), issuer, now=t)
        return Answer(refusal, refusal=e.message)
    user_jwt = encode_jwt(user_claims(request.user_nkey, grant, prefix), issuer, now=t)
    admission = encode_jwt(response_claims(request, user_jwt=user_jwt), issuer, now=t)
    return Answer(admission, user=grant.user)


# -- the service ---------------------------------------------------------------------------


class AuthCallout:
    """Answers the server's authorization requests until stopped (an actor of the gateway).

    Every instance subscribes in the queue group :data:`QUEUE_GROUP`, so each request is
    answered by one of the gateways that are up; with none up, API clients cannot connect (the
    static role users are not affected).

    Args:
        bus: a connection of the ``callout`` user (an ``auth_users`` member allowed to
            subscribe to :data:`CALLOUT_SUBJECT` and to answer).
        issuer: the issuer account of ``auth_callout { issuer }``.
        authenticate: verifies a bearer token (the gateway's, :mod:`gateway.auth`).
    """

    def __init__(self, bus: Bus, issuer: Issuer, authenticate: Authenticate) -> None:
        self.bus = bus
        self.issuer = issuer
        self.authenticate = authenticate
        self.name = "nats-callout"
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`.

        Raises:
            ConfigError: the connection's user may not subscribe to :data:`CALLOUT_SUBJECT`
                (it is not the ``callout`` user): the server refused the subscription.
        """
        nc = self.bus.nc
        sub = await nc.subscribe(CALLOUT_SUBJECT, queue=QUEUE_GROUP, cb=self._on_request)
        try:
            # nats-py writes a flush's PING ahead of the buffered SUB, so only the second PONG
            # is sure to come after the server's answer to the SUB (a refusal, -ERR).
            await nc.flush()
            await nc.flush()
            if nc.last_error is not None and CALLOUT_SUBJECT.lower() in str(nc.last_error).lower():
                raise ConfigError(
                    f"the NATS user of connection {self.bus.name} may not subscribe to "
                    f"{CALLOUT_SUBJECT}: the auth callout needs the 'callout' user (bus.auth)"
                )
            self.ready.set()
            await self._stop.wait()
        finally:
            await sub.unsubscribe()

    async def _on_request(self, msg: Msg) -> None:
        if msg.headers and XKEY_HEADER in msg.headers:
            log.error(
                "NATS auth callout: the request is encrypted (auth_callout xkey), unsupported"
            )
            return
        try:
            request = parse_request(msg.data, self.issuer.public_key)
        except CalloutError as e:
            log.warning("NATS auth callout: ignoring a request: %s", e)
            return
        result = answer(request, self.authenticate, self.issuer, self.bus.config.prefix)
        if result.user is None:
            log.info("NATS auth callout: refused client %s: %s", request.client, result.refusal)
        else:
            log.info(
                "NATS auth callout: admitted client %s as user %r", request.client, result.user
            )
        await msg.respond(result.response.encode())


# -- the server's configuration ------------------------------------------------------------


def callout_config(
    directory: Path, prefix: str, queues: Sequence[str], roles: Sequence[str] = CALLOUT_ROLES
) -> tuple[dict[str, Path], str, Path]:
    """The static users of ``roles`` (:func:`bus.auth.generate_users`, files in ``directory``)
    with the callout on, and the issuer seed, kept in ``directory/nats-callout-issuer.nk``
    (0600; created once, reused afterwards).

    The server's block is ``authorization { users: [...], auth_callout { issuer: <the issuer's
    public key>, auth_users: [every static user] } }``: a static user connects as before, every
    other connection goes through the callout. nats-server cannot reload ``auth_callout``
    (its ``diffOptions`` refuses an unlisted option): change it with a restart.

    Returns:
        (credentials file of each role, the config text, the issuer seed file).
    """
    seed_file = directory / ISSUER_SEED_FILE
    if not seed_file.exists():
        write_issuer_seed(seed_file, new_issuer_seed())
    issuer = read_issuer(seed_file)
    files, block = generate_users(
        directory, prefix, queues, roles, callout_issuer=issuer.public_key
    )
    return files, block, seed_file
