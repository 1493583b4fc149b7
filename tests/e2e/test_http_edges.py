"""Client mistakes at the HTTP level, against a real `jobsched gateway` process over raw sockets.

Every one is a 4xx with a problem body where a body can be sent, and at most one log line at
INFO, never an ERROR or a traceback: a client must not be able to flood the log.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from core.settings import load_settings
from gateway.auth import mint_token
from jobsched.natsserver import NatsServer
from tests.conftest import TEST_SECRET
from tests.support import Child, env_for


@dataclass
class GatewayProcess:
    child: Child
    host: str
    port: int

    def log_size(self) -> int:
        return self.child.log.stat().st_size

    def log_since(self, offset: int) -> str:
        with self.child.log.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    async def wait_log(self, offset: int, pattern: str, timeout_seconds: float = 10.0) -> str:
        """The log written since ``offset`` once it matches ``pattern`` (a regex)."""
        try:
            async with asyncio.timeout(timeout_seconds):
                while not re.search(pattern, text := self.log_since(offset)):
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise AssertionError(
                f"no log line matching {pattern!r}; the log says:\n{self.log_since(offset)}"
            ) from None
        return text


@pytest.fixture(scope="module")
def gateway(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("http-edges")
    settings = load_settings(
        {},
        data_dir=str(root / "data"),
        nats_url=nats_server.url,
        subject_prefix=f"t{uuid.uuid4().hex[:10]}",
        auth_secret=TEST_SECRET,
        http_port=0,
        partitions=8,
    )
    child = Child(["gateway"], env_for(settings), root / "gateway.log")
    try:
        deadline = time.monotonic() + 30
        while not (m := re.search(r"gateway listening on http://([\d.]+):(\d+)", child.output())):
            assert child.proc.poll() is None, child.output()
            assert time.monotonic() < deadline, child.output()
            time.sleep(0.05)
        yield GatewayProcess(child, m[1], int(m[2]))
        assert child.terminate() == 0, child.output()
    finally:
        child.close()
    log = child.output()
    assert "Traceback" not in log and " ERROR " not in log, log


def bearer() -> str:
    return f"Bearer {mint_token(TEST_SECRET, 'alice', ttl=timedelta(hours=1))}"


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def problem(self) -> dict[str, object]:
        assert self.headers["content-type"].startswith("application/problem+json"), self
        problem: dict[str, object] = json.loads(self.body)
        assert problem["status"] == self.status
        return problem


async def exchange(gw: GatewayProcess, request: bytes) -> RawResponse:
    """Send ``request`` as it is and read the answer up to the close of the connection."""
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            raw = await reader.read()
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return RawResponse(int(status_line.split()[1]), headers, body)


MALFORMED = [
    pytest.param(
        b"GET /jobs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        431,
        "header_fields_too_large",
        id="header-over-8KiB",
    ),
    pytest.param(
        b"GET /jobs HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: a\r\n" % i for i in range(200))
        + b"\r\n",
        431,
        "header_fields_too_large",
        id="too-many-headers",
    ),
    pytest.param(
        b"GET /jobs?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        414,
        "uri_too_long",
        id="url-over-8KiB",
    ),
    pytest.param(
        b"GET /jobs HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        400,
        "malformed_request",
        id="nul-in-header",
    ),
    pytest.param(
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
        "malformed_request",
        id="content-length-and-transfer-encoding",
    ),
    pytest.param(
        b"G@T /jobs HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed_request", id="bad-method"
    ),
    pytest.param(
        b"GET /jobs HTTP/1.1\r\nHost: x\r\n\r\nG(T /jobs HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
        "malformed_request",
        id="bad-method-pipelined",
    ),
    pytest.param(
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        400,
        "malformed_request",
        id="bad-chunk-size",
    ),
]


@pytest.mark.parametrize(("request_bytes", "status", "code"), MALFORMED)
async def test_a_malformed_request_is_a_4xx_problem_logged_once_at_info(
    gateway: GatewayProcess, request_bytes: bytes, status: int, code: str
) -> None:
    offset = gateway.log_size()
    resp = await exchange(gateway, request_bytes)
    assert resp.status == status, resp
    problem = resp.problem()
    assert problem["code"] == code and problem["requestId"] == resp.headers["x-request-id"]
    # The request id is random hex and may itself hold "aaaa": look past it.
    body = resp.body.replace(resp.headers["x-request-id"].encode(), b"")
    assert b"aaaa" not in body and b"\\x00" not in body, "the client's bytes echoed"
    log = await gateway.wait_log(offset, rf"INFO .*{status} {code} from 127\.0\.0\.1")
    assert len(log.splitlines()) == 1, log
    assert "Traceback" not in log and "ERROR" not in log, log


async def test_a_body_that_cannot_be_decoded_is_a_400_problem_logged_once_at_info(
    gateway: GatewayProcess,
) -> None:
    offset = gateway.log_size()
    request = (
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: " + bearer().encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 10\r\nConnection: close\r\n\r\n0123456789"
    )
    resp = await exchange(gateway, request)
    assert resp.status == 400, resp
    problem = resp.problem()
    assert problem["code"] == "malformed_request" and "gzip" in str(problem["detail"])
    log = await gateway.wait_log(offset, r"INFO .*gzip")
    assert len(log.splitlines()) == 1, log
    assert "Traceback" not in log and "ERROR" not in log, log


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
async def test_a_client_gone_mid_body_is_one_info_line_not_a_500(
    gateway: GatewayProcess, reset: bool
) -> None:
    offset = gateway.log_size()
    _, writer = await asyncio.open_connection(gateway.host, gateway.port)
    writer.write(
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: " + bearer().encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        b'{"taskId": "noop", '
    )
    await writer.drain()
    if reset:  # RST instead of FIN
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
    log = await gateway.wait_log(offset, r"POST /jobs")
    assert re.search(r"INFO .*POST /jobs: the client closed the connection", log), log
    assert len(log.splitlines()) == 1, log
    assert "Traceback" not in log and "ERROR" not in log and " 500 " not in log, log
