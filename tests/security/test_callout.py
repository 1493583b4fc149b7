"""NATS-API clients through the auth callout (issue 12: "a NATS-API client can never see another
client's replies or tokens"), on a real nats-server whose config is :func:`bus.callout.
callout_config`'s: each client is admitted by its bearer token, reads only its own inbox and
publishes only API requests; the server refuses everything else and every bad token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from bus.auth import read_credentials
from bus.callout import AuthCallout, callout_config, read_issuer, user_inbox_prefix
from bus.nats import Bus, BusConfig
from core.errors import ConfigError
from core.model import Problem
from gateway.auth import mint_token
from jobsched.client import (
    ApiError,
    NatsApiConnectOptions,
    NatsJobschedClient,
    nats_api_connect_options,
)
from jobsched.natsserver import NatsServer
from jobsched.runtime import token_authenticator
from tests.security.test_bus_security import attacker, refused

PREFIX = "jobsched"
QUEUES = ("default",)
SECRET = secrets.token_hex(32)


@dataclass
class Deployment:
    server: NatsServer
    files: dict[str, Path]
    seed_file: Path
    log_file: Path


@pytest.fixture
def deployment(nats_binary: str, tmp_path: Path) -> Iterator[Deployment]:
    files, block, seed_file = callout_config(tmp_path / "creds", PREFIX, QUEUES)
    log_file = tmp_path / "nats.log"
    server = NatsServer(nats_binary, tmp_path / "nats", log_file=log_file, authorization=block)
    server.start()
    yield Deployment(server, files, seed_file, log_file)
    server.stop()


def role_bus(d: Deployment, role: str) -> Bus:
    creds = read_credentials(d.files[role])
    return Bus(BusConfig(servers=[d.server.url], prefix=PREFIX, credentials=creds), name=role)


@contextlib.asynccontextmanager
async def running_callout(d: Deployment, secret: str = SECRET) -> AsyncIterator[AuthCallout]:
    """An auth callout service, as a gateway runs it, until the block ends."""
    bus = role_bus(d, "callout")
    await bus.connect()
    callout = AuthCallout(bus, read_issuer(d.seed_file), token_authenticator(secret))
    task = asyncio.create_task(callout.run(), name="test-callout")
    try:
        async with asyncio.timeout(10):
            await callout.ready.wait()
        yield callout
    finally:
        callout.stop()
        async with asyncio.timeout(10):
            await task
        await bus.close()


@contextlib.asynccontextmanager
async def api_responder(d: Deployment) -> AsyncIterator[None]:
    """The gateway's side of ``<prefix>.api.get``: a 404 problem naming the requested id (the
    real service is tests/e2e/test_nats_api.py's; here only the reply path matters)."""
    bus = role_bus(d, "gateway")
    await bus.connect()

    async def respond(msg: Msg) -> None:
        job_id = msgspec.json.decode(msg.data)["id"]
        problem = Problem(
            type="about:blank", title="JobNotFound", status=404, detail=job_id, code="job_not_found"
        )
        headers = {"Nats-Service-Error-Code": "404", "Nats-Service-Error": f"no job {job_id}"}
        await bus.nc.publish(msg.reply, msgspec.json.encode(problem), headers=headers)

    sub = await bus.nc.subscribe(f"{PREFIX}.api.>", queue="jobsched-api", cb=respond)
    await bus.nc.flush()
    try:
        yield
    finally:
        await sub.unsubscribe()
        await bus.close()


def token(user: str, ttl: timedelta = timedelta(hours=1), secret: str = SECRET) -> str:
    return mint_token(secret, user, ttl=ttl)


@contextlib.asynccontextmanager
async def api_client(d: Deployment, tok: str) -> AsyncIterator[tuple[Client, list[str]]]:
    """A raw NATS-API client connected with ``tok``, and the errors the server sends it."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc = await nats.connect(
        d.server.url, error_cb=on_error, allow_reconnect=False, **nats_api_connect_options(tok)
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def connection_refusal(d: Deployment, options: NatsApiConnectOptions) -> str:
    """What the server answered a connection it refused. The client waits longer than the
    server's authorization timeout (2 s), which bounds an unanswered callout."""
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    nc = Client()
    try:
        with pytest.raises(nats.errors.Error) as refusal:
            async with asyncio.timeout(10):
                await nc.connect(
                    d.server.url,
                    error_cb=on_error,
                    allow_reconnect=False,
                    connect_timeout=5,
                    **options,
                )
    finally:
        await nc.close()  # nats-py leaves the refused socket open otherwise
    return f"{refusal.value} {errors}".lower()


async def test_an_api_client_is_admitted_by_its_token_and_gets_its_reply(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="bus.callout")
    tok = token("alice")
    async with (
        running_callout(deployment),
        api_responder(deployment),
        NatsJobschedClient(deployment.server.url, tok, prefix=PREFIX) as api,
    ):
        with pytest.raises(ApiError) as reply:
            await api.get_job("job-1")
    assert reply.value.status == 404
    assert reply.value.problem is not None and reply.value.problem.detail == "job-1"
    assert "as user 'alice'" in caplog.text
    assert tok not in caplog.text
    assert tok not in deployment.log_file.read_text()


async def test_an_api_client_reads_only_its_own_inbox_and_publishes_only_requests(
    deployment: Deployment,
) -> None:
    async with (
        running_callout(deployment),
        api_responder(deployment),
        api_client(deployment, token("alice")) as (alice, errors),
    ):
        attacks = [
            user_inbox_prefix("bob") + ".>",
            "_INBOX.>",
            "_INBOX_jobsched-gateway.>",
            ">",
            f"{PREFIX}.api.>",
            f"{PREFIX}.>",
            "$SYS.REQ.USER.AUTH",  # every other client's token
        ]
        for subject in attacks:
            await alice.subscribe(subject)
            await refused(errors, f'Subscription to "{subject}"')
        work = f"{PREFIX}.work.default.forged-1"
        await alice.publish(work, b"{}")
        await refused(errors, f'Publish to "{work}"')
        # her own requests still work after all that
        reply = await alice.request(f"{PREFIX}.api.get", b'{"id": "j"}', timeout=5)
        assert reply.headers is not None
        assert reply.headers["Nats-Service-Error-Code"] == "404"


async def test_one_client_never_receives_anothers_reply(deployment: Deployment) -> None:
    """Bob's reply goes to bob's inbox; alice, connected the whole time, cannot even subscribe
    there, and gets nothing of it."""
    async with (
        running_callout(deployment),
        api_responder(deployment),
        api_client(deployment, token("alice")) as (alice, errors),
        api_client(deployment, token("bob")) as (bob, _),
    ):
        seen: list[Msg] = []

        async def spy(msg: Msg) -> None:
            seen.append(msg)

        await alice.subscribe(user_inbox_prefix("bob") + ".>", cb=spy)
        await refused(errors, "Subscription to")
        reply = await bob.request(f"{PREFIX}.api.get", b'{"id": "bobs-job"}', timeout=5)
        assert reply.subject.startswith(user_inbox_prefix("bob") + ".")
        await alice.flush()
        assert seen == []


@pytest.mark.parametrize("case", ["no token", "garbage", "expired", "wrong secret", "not a JWT"])
async def test_a_client_without_a_valid_token_is_refused_and_its_token_is_never_logged(
    deployment: Deployment, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = {
        "no token": "",
        "garbage": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtYWxsb3J5In0.c2lnbmF0dXJl",
        "expired": token("alice", ttl=timedelta(seconds=-120)),
        "wrong secret": token("alice", secret=secrets.token_hex(32)),
        "not a JWT": "hunter2-hunter2",
    }
    tok = tokens[case]
    caplog.set_level(logging.DEBUG, logger="bus.callout")
    async with running_callout(deployment):
        options = NatsApiConnectOptions(token=tok) if tok else NatsApiConnectOptions()
        answer = await connection_refusal(deployment, options)
    assert "authorization violation" in answer
    if tok:
        assert tok not in caplog.text
        assert tok not in deployment.log_file.read_text()


async def test_a_client_on_the_shared_default_inbox_gets_no_reply(deployment: Deployment) -> None:
    """A valid token but nats-py's default inbox ``_INBOX``: its reply subscription is refused,
    so the inbox is per user by the server's rule, not by the client's good manners."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    async with running_callout(deployment), api_responder(deployment):
        nc = await nats.connect(
            deployment.server.url, token=token("alice"), error_cb=on_error, allow_reconnect=False
        )
        try:
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await nc.request(f"{PREFIX}.api.get", b'{"id": "j"}', timeout=1)
            await refused(errors, 'Subscription to "_INBOX.')
        finally:
            await nc.close()


async def test_the_connection_ends_when_the_token_expires(deployment: Deployment) -> None:
    closed = asyncio.Event()
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    async def on_closed() -> None:
        closed.set()

    async with running_callout(deployment):
        nc = await nats.connect(
            deployment.server.url,
            error_cb=on_error,
            closed_cb=on_closed,
            allow_reconnect=False,
            **nats_api_connect_options(token("alice", ttl=timedelta(seconds=3))),
        )
        try:
            async with asyncio.timeout(15):
                await closed.wait()
        finally:
            await nc.close()
    assert "expired" in f"{nc.last_error} {errors}".lower()


async def test_role_users_connect_without_any_callout_and_api_clients_cannot(
    deployment: Deployment,
) -> None:
    """With no gateway up, the static users work as before; API clients cannot connect."""
    scheduler = role_bus(deployment, "scheduler")
    await scheduler.connect()
    try:
        await scheduler.ensure_streams()
        assert await scheduler.status_last_seq() == 0
    finally:
        await scheduler.close()
    answer = await connection_refusal(deployment, nats_api_connect_options(token("alice")))
    assert "authorization violation" in answer


async def test_a_callout_on_another_roles_user_fails_to_start(deployment: Deployment) -> None:
    """Misconfigured, it says so instead of leaving every API client unanswered."""
    bus = role_bus(deployment, "gateway")
    await bus.connect()
    try:
        callout = AuthCallout(bus, read_issuer(deployment.seed_file), token_authenticator(SECRET))
        with pytest.raises(ConfigError, match="'callout' user"):
            async with asyncio.timeout(10):
                await callout.run()
        assert not callout.ready.is_set()
    finally:
        await bus.close()


@pytest.mark.parametrize("role", ["scheduler", "worker", "gateway"])
async def test_no_role_user_can_read_the_authorization_requests(
    deployment: Deployment, role: str
) -> None:
    """They hold every API client's token; only the callout user may subscribe to them."""
    async with attacker(deployment.server.url, deployment.files[role]) as (nc, errors):
        await nc.subscribe("$SYS.REQ.USER.AUTH")
        await refused(errors, 'Subscription to "$SYS.REQ.USER.AUTH"')


async def test_the_callout_user_may_only_answer_authorization_requests(
    deployment: Deployment,
) -> None:
    async with attacker(deployment.server.url, deployment.files["callout"]) as (nc, errors):
        await nc.publish(f"{PREFIX}.work.default.forged-1", b"{}")
        await refused(errors, f'Publish to "{PREFIX}.work.default.forged-1"')
        await nc.subscribe(f"{PREFIX}.>")
        await refused(errors, f'Subscription to "{PREFIX}.>"')


async def test_a_second_callout_keeps_admitting_clients_when_the_first_stops(
    deployment: Deployment,
) -> None:
    async with running_callout(deployment), api_responder(deployment):
        first = contextlib.AsyncExitStack()
        async with first:
            await first.enter_async_context(running_callout(deployment))
            async with api_client(deployment, token("alice")) as (alice, _):
                assert alice.is_connected
        # one of the two stopped; the other answers every new client
        for user in ("alice", "bob", "carol"):
            async with api_client(deployment, token(user)) as (nc, _):
                reply = await nc.request(f"{PREFIX}.api.get", b'{"id": "j"}', timeout=5)
                assert reply.subject.startswith(user_inbox_prefix(user) + ".")
