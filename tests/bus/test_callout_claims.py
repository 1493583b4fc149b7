"""The auth callout's JWTs and decisions (bus/callout.py), without a server: encoding and
verification round trips, the checks on a request, and the claims of each answer (ADR-26)."""

from __future__ import annotations

import base64
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt as pyjwt
import nkeys
import pytest

from bus.auth import Credentials, authorization_block, role_permissions
from bus.callout import (
    PREFIX_ACCOUNT,
    PREFIX_SERVER,
    PREFIX_USER,
    REQUEST_AUDIENCE,
    AuthRequest,
    CalloutError,
    Grant,
    Issuer,
    answer,
    api_inbox_prefix,
    callout_config,
    decode_jwt,
    encode_jwt,
    inbox_hash,
    new_issuer_seed,
    parse_request,
    public_key_bytes,
    read_issuer,
    user_inbox_prefix,
)
from core.errors import ConfigError, Unauthorized
from gateway.auth import mint_token, principal_and_expiry

PREFIX = "jobsched"
TOKEN = "the-bearer-token-itself"


def keypair(prefix: int) -> Issuer:
    """An nkey pair of any kind, signing like an issuer (a server's, a user's)."""
    return Issuer(nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix)))


ISSUER = Issuer.from_seed(new_issuer_seed())
SERVER = keypair(PREFIX_SERVER)
USER_NKEY = keypair(PREFIX_USER).public_key


def server_request(**overrides: Any) -> bytes:
    """An authorization request as nats-server 2.12+ builds it (auth_callout.go)."""
    claims: dict[str, Any] = {
        "sub": ISSUER.public_key,
        "aud": REQUEST_AUDIENCE,
        "exp": int(time.time()) + 2,
        "nats": {
            "server_id": {"name": "A", "host": "127.0.0.1", "id": SERVER.public_key},
            "user_nkey": USER_NKEY,
            "client_info": {"host": "127.0.0.1", "id": 7, "user": "[REDACTED]"},
            "connect_opts": {"auth_token": TOKEN, "lang": "python3", "protocol": 1},
            "type": "authorization_request",
            "version": 2,
        },
    }
    signer = overrides.pop("signer", SERVER)
    nats_overrides = overrides.pop("nats", {})
    claims.update(overrides)
    claims["nats"].update(nats_overrides)
    return encode_jwt(claims, signer).encode()


def payload(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


def test_a_jwt_round_trips_and_carries_the_nats_header_and_issuer() -> None:
    token = encode_jwt({"sub": USER_NKEY, "nats": {"type": "user"}}, ISSUER, now=1_000)
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}
    assert "=" not in token
    claims = decode_jwt(token, issuer_prefix=PREFIX_ACCOUNT, now=1_000)
    assert claims["iss"] == ISSUER.public_key
    assert claims["iat"] == 1_000
    assert claims["sub"] == USER_NKEY
    assert len(claims["jti"]) == 52  # base32 of 32 bytes, no padding (nats-io/jwt)


def test_a_tampered_or_foreign_jwt_is_rejected() -> None:
    token = encode_jwt({"sub": USER_NKEY}, ISSUER)
    head, body, sig = token.split(".")
    forged = base64.urlsafe_b64encode(
        json.dumps({**payload(token), "sub": "UATTACKER"}).encode()
    ).rstrip(b"=")
    with pytest.raises(CalloutError, match="signature"):
        decode_jwt(f"{head}.{forged.decode()}.{sig}", issuer_prefix=PREFIX_ACCOUNT)
    with pytest.raises(CalloutError, match="server key"):
        decode_jwt(token, issuer_prefix=PREFIX_SERVER)  # signed by an account, not a server
    none_header = base64.urlsafe_b64encode(b'{"typ":"JWT","alg":"none"}').rstrip(b"=").decode()
    with pytest.raises(CalloutError, match="alg"):
        decode_jwt(f"{none_header}.{body}.", issuer_prefix=PREFIX_ACCOUNT)
    for garbage in ["", "a.b", "x.y.z", TOKEN]:
        with pytest.raises(CalloutError):
            decode_jwt(garbage, issuer_prefix=PREFIX_ACCOUNT)


def test_an_expired_jwt_is_rejected() -> None:
    token = encode_jwt({"sub": USER_NKEY, "exp": 1_000}, ISSUER, now=900)
    assert decode_jwt(token, issuer_prefix=PREFIX_ACCOUNT, now=1_004)
    with pytest.raises(CalloutError, match="expired"):
        decode_jwt(token, issuer_prefix=PREFIX_ACCOUNT, now=1_006)


def test_a_public_nkey_decodes_only_with_its_kind_and_checksum() -> None:
    assert len(public_key_bytes(USER_NKEY, PREFIX_USER)) == 32
    with pytest.raises(CalloutError):
        public_key_bytes(USER_NKEY, PREFIX_ACCOUNT)
    broken = USER_NKEY[:-1] + ("A" if USER_NKEY[-1] != "A" else "B")
    with pytest.raises(CalloutError):
        public_key_bytes(broken, PREFIX_USER)


def test_a_server_request_is_read() -> None:
    request = parse_request(server_request(), ISSUER.public_key)
    assert (request.server_id, request.user_nkey, request.token) == (
        SERVER.public_key,
        USER_NKEY,
        TOKEN,
    )
    assert TOKEN not in repr(request)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"signer": ISSUER}, "server"),  # not signed by a server key
        ({"sub": keypair(PREFIX_ACCOUNT).public_key}, "issuer"),  # for another callout
        ({"aud": "someone-else"}, "issuer"),
        ({"nats": {"type": "authorization_response"}}, "not an authorization request"),
        ({"nats": {"server_id": {"id": keypair(PREFIX_SERVER).public_key}}}, "server it names"),
        ({"nats": {"user_nkey": ISSUER.public_key}}, "user_nkey"),
        ({"exp": int(time.time()) - 60}, "expired"),
    ],
)
def test_a_request_that_is_not_the_servers_is_rejected(
    overrides: dict[str, Any], reason: str
) -> None:
    with pytest.raises(CalloutError, match=reason):
        parse_request(server_request(**overrides), ISSUER.public_key)


def grant_for(user: str, ttl_seconds: float = 600) -> Grant:
    return Grant(user, datetime.now(UTC) + timedelta(seconds=ttl_seconds))


def request() -> AuthRequest:
    return AuthRequest(server_id=SERVER.public_key, user_nkey=USER_NKEY, token=TOKEN, client="c")


def test_an_admitted_client_gets_its_own_inbox_and_the_api_only_until_its_token_expires() -> None:
    grant = grant_for("alice")
    response, user, refusal = answer(request(), lambda token: grant, ISSUER, PREFIX)
    assert (user, refusal) == ("alice", "")
    outer = decode_jwt(response, issuer_prefix=PREFIX_ACCOUNT)
    assert (outer["sub"], outer["aud"], outer["iss"]) == (
        USER_NKEY,
        SERVER.public_key,
        ISSUER.public_key,
    )
    assert outer["nats"]["type"] == "authorization_response"
    assert outer["nats"]["version"] == 2
    assert "error" not in outer["nats"] and "issuer_account" not in outer["nats"]
    inner = decode_jwt(outer["nats"]["jwt"], issuer_prefix=PREFIX_ACCOUNT)
    assert (inner["sub"], inner["aud"], inner["iss"], inner["name"]) == (
        USER_NKEY,
        "$G",
        ISSUER.public_key,
        "alice",
    )
    assert inner["exp"] == int(grant.expires_at.timestamp())
    assert inner["nats"]["pub"] == {"allow": [f"{PREFIX}.api.>"]}
    assert inner["nats"]["sub"] == {"allow": [f"{user_inbox_prefix('alice')}.>"]}
    assert "resp" not in inner["nats"]
    assert (inner["nats"]["type"], inner["nats"]["version"]) == ("user", 2)
    assert TOKEN not in response


def refusal_of(authenticate: Any, req: AuthRequest | None = None) -> str:
    response, user, refusal = answer(req or request(), authenticate, ISSUER, PREFIX)
    assert user is None
    claims = decode_jwt(response, issuer_prefix=PREFIX_ACCOUNT)
    assert "jwt" not in claims["nats"]
    assert (claims["sub"], claims["aud"]) == (USER_NKEY, SERVER.public_key)
    assert TOKEN not in response
    assert claims["nats"]["error"] == refusal
    return refusal


def test_a_refused_client_gets_the_reason_and_never_its_token_back() -> None:
    def reject(token: str) -> Grant:
        raise Unauthorized(f"invalid token: Signature verification failed ({len(token)})")

    assert "Signature verification failed" in refusal_of(reject)
    no_token = AuthRequest(server_id=SERVER.public_key, user_nkey=USER_NKEY, token="", client="c")
    assert "no token" in refusal_of(lambda t: grant_for("alice"), no_token)
    # a token within PyJWT's leeway after its expiry would give a user JWT already expired
    assert "expired" in refusal_of(lambda t: grant_for("alice", ttl_seconds=-10))


@pytest.mark.parametrize("user", ["alice", "a.b", "*", ">", "a b", "ünï.cødé>", "x" * 256])
def test_an_inbox_is_one_valid_subject_token_per_user(user: str) -> None:
    h = inbox_hash(user)
    assert len(h) == 32 and all(c in "0123456789abcdef" for c in h)
    assert user_inbox_prefix(user) == f"_INBOX_{h}"
    assert user_inbox_prefix(user) != user_inbox_prefix(user + "x")


def test_a_client_computes_its_inbox_from_its_token() -> None:
    token = mint_token("s" * 32, "alice")
    assert api_inbox_prefix(token) == user_inbox_prefix("alice")
    for bad in ["not-a-token", "a.b.c", ""]:
        with pytest.raises(ValueError):
            api_inbox_prefix(bad)


def test_the_server_block_lists_every_static_user_as_an_auth_user() -> None:
    users = [
        (
            Credentials(f"jobsched-{role}", "pw"),
            role_permissions(role, f"jobsched-{role}", PREFIX, ["default"]),
        )
        for role in ("scheduler", "callout")
    ]
    block = authorization_block(users, callout_issuer=ISSUER.public_key)
    assert f'issuer: "{ISSUER.public_key}"' in block
    assert 'auth_users: ["jobsched-scheduler", "jobsched-callout"]' in block
    assert "auth_callout" not in authorization_block(users)


def test_callout_config_keeps_a_private_issuer_seed_and_no_static_api_user(tmp_path: Path) -> None:
    files, block, seed_file = callout_config(tmp_path, PREFIX, ["default"])
    assert seed_file.stat().st_mode & 0o777 == 0o600
    issuer = read_issuer(seed_file)
    assert issuer.public_key in block
    assert seed_file.read_text().strip() not in repr(issuer)
    assert "api" not in files and "callout" in files
    again = callout_config(tmp_path, PREFIX, ["default"])
    assert again[1] == block, "the seed and the passwords are kept"


def test_a_bad_seed_file_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "missing.nk"
    with pytest.raises(ConfigError, match="JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE"):
        read_issuer(missing)
    user_seed = tmp_path / "user.nk"
    user_seed.write_bytes(nkeys.encode_seed(os.urandom(32), PREFIX_USER))
    with pytest.raises(ConfigError, match="account seed") as info:
        read_issuer(user_seed)
    assert user_seed.read_text() not in str(info.value)
    garbage = tmp_path / "garbage.nk"
    garbage.write_text("hello")
    with pytest.raises(ConfigError, match="not an nkey seed"):
        read_issuer(garbage)


@pytest.mark.parametrize(
    ("exp", "expected"),
    [
        (1_900_000_000, datetime(2030, 3, 17, 17, 46, 40, tzinfo=UTC)),
        ("1900000000", datetime(2030, 3, 17, 17, 46, 40, tzinfo=UTC)),  # PyJWT takes it
        (10**15, datetime.max.replace(tzinfo=UTC)),  # past year 9999: not a crash
    ],
)
def test_the_callout_reads_the_expiry_the_gateway_accepted(exp: object, expected: datetime) -> None:
    token = pyjwt.encode({"sub": "alice", "exp": exp}, "k" * 32, algorithm="HS256")
    principal, expires_at = principal_and_expiry(token, "k" * 32)
    assert (principal.user, expires_at) == ("alice", expected)
