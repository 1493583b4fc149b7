"""Real OS processes: a worker killed mid-task, and `jobsched dev` killed and restarted."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from bus.auth import read_credentials
from core.model import ExecutionStatus
from core.settings import load_settings
from jobsched.client import JobschedClient, NatsJobschedClient
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.support import Child, EventLog, env_for, start_stack, wait_executions, wait_job

pytestmark = pytest.mark.slow


async def test_worker_killed_mid_task_is_redelivered_after_the_ack_wait(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(ack_wait_seconds=1.5)
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        first = Child(["worker"], env_for(settings, JOBSCHED_WORKER_ID="w1"), tmp_path / "w1.log")
        second: Child | None = None
        try:
            client = stack.client()
            job = await client.create_job({"taskId": "sleep", "parameters": {"seconds": 2}})
            await log.wait_status(job.id, ExecutionStatus.RUNNING, timeout_seconds=20)
            first.kill()
            killed_at = datetime.now(UTC)
            second = Child(
                ["worker"], env_for(settings, JOBSCHED_WORKER_ID="w2"), tmp_path / "w2.log"
            )
            await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=30)
        finally:
            first.close()
            if second is not None:
                second.close()
        running = [e for e in log.of(job.id) if e.status == ExecutionStatus.RUNNING]
        assert [(e.attempt, e.worker_id) for e in running] == [(1, "w1"), (2, "w2")]
        assert (running[1].at - killed_at).total_seconds() >= 0
        # The ack wait runs from the first delivery, which w1 stamps as RUNNING a little later
        # (and both stamps are truncated to milliseconds): allow that lag, far below the wait.
        lag_seconds = 0.25
        gap_seconds = (running[1].at - running[0].at).total_seconds()
        assert gap_seconds >= settings.nats.ack_wait_seconds - lag_seconds
        [run] = await wait_executions(
            client, job.id, lambda rs: bool(rs) and rs[0].status == "SUCCEEDED"
        )
        assert (run.attempt, run.worker_id) == (2, "w2")
        lost, redelivered = run.attempts
        assert (lost.attempt, lost.worker_id, lost.started_at) == (1, "w1", running[0].started_at)
        assert (lost.outcome, lost.finished_at, lost.redelivered) == (None, None, False)
        assert (redelivered.attempt, redelivered.worker_id) == (2, "w2")
        assert redelivered.started_at == running[1].started_at
        assert (redelivered.outcome, redelivered.redelivered) == (ExecutionStatus.SUCCEEDED, True)
        assert run.started_at == lost.started_at  # the run's first start, kept


async def dev_exports(env: dict[str, str], data: Path) -> dict[str, str]:
    """What `eval "$(jobsched dev-env --data-dir DATA)"` sets in a shell, by name, as the
    banner of a `jobsched dev --data-dir DATA` prints it (JOBSCHED_DATA_DIR unset)."""
    names = ("URL", "TOKEN", "NATS_URL", "NATS_INBOX_PREFIX", "JOBSCHED_DATA_DIR")
    command = f"{sys.executable} -m jobsched dev-env --data-dir {shlex.quote(str(data))}"
    script = f'eval "$({command})" && echo ' + " ".join(f'"${name}"' for name in names)
    clean = {k: v for k, v in env.items() if k != "JOBSCHED_DATA_DIR"}
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", script],
        env=clean,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    exported = dict(zip(names, done.stdout.split(), strict=True))
    assert exported["JOBSCHED_DATA_DIR"] == str(data.resolve())  # the other commands find it
    return exported


def dev_env(make_settings: SettingsFactory, data: Path) -> dict[str, str]:
    """The environment of a `jobsched dev` child: the test's settings minus the ones dev
    chooses itself (its own nats-server and store in ``data``, a secret, the port)."""
    env = env_for(make_settings(data_dir=str(data)))
    for key in (
        "JOBSCHED_NATS_URL",
        "JOBSCHED_NATS_CREDENTIALS_DIR",
        "JOBSCHED_STORE_URL",
        "JOBSCHED_AUTH_SECRET",
        "JOBSCHED_HTTP_PORT",
    ):
        env.pop(key)
    return env


async def read_dev_file(
    data_dir: Path, child: Child, previous: str | None = None
) -> tuple[str, str]:
    """Wait until `jobsched dev` announced itself in <data>/dev.json (a new one after a restart)."""
    path = data_dir / "dev.json"
    async with asyncio.timeout(30):
        while True:
            if child.proc.poll() is not None:
                raise AssertionError(f"jobsched dev exited:\n{child.output()}")
            if path.exists():
                text = path.read_text()
                if text and text != previous:
                    info = json.loads(text)
                    return info["url"], info["token"]
            await asyncio.sleep(0.05)


async def test_restarting_dev_loses_no_job_and_recurring_jobs_continue(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """Case S02 (restart variant): once jobs due while the process is down run exactly once."""
    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    dev = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev1.log")
    try:
        url, token = await read_dev_file(data, dev)
        async with JobschedClient(url, token) as client:
            due = datetime.now(UTC) + timedelta(seconds=3)
            once = [
                await client.create_job(
                    {"taskId": "noop", "schedule": {"type": "once", "executeAt": due.isoformat()}}
                )
                for _ in range(20)
            ]
            now_jobs = [await client.create_job({"taskId": "noop"}) for _ in range(5)]
            interval = await client.create_job(
                {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": 1}}
            )
            for j in now_jobs:
                await wait_job(client, j.id, {"SUCCEEDED"})
            await wait_executions(
                client, interval.id, lambda rs: len(rs) >= 2, what="2 interval runs"
            )
        stale = (data / "dev.json").read_text()
        dev.kill()
        killed_at = datetime.now(UTC)
        await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 1.0)

        dev2 = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev2.log")
        try:
            url, token = await read_dev_file(data, dev2, previous=stale)
            async with JobschedClient(url, token) as client:
                for j in once:
                    done = await wait_job(client, j.id, {"SUCCEEDED", "FAILED"}, timeout_seconds=30)
                    assert done.status == "SUCCEEDED"
                    runs = await wait_executions(client, j.id, lambda rs: len(rs) >= 1)
                    assert len(runs) == 1, f"once job {j.id} ran {len(runs)} times"
                    assert runs[0].started_at is not None and runs[0].started_at > killed_at
                for j in now_jobs:
                    assert len(await wait_executions(client, j.id, lambda rs: len(rs) >= 1)) == 1
                runs = await wait_executions(
                    client,
                    interval.id,
                    lambda rs: any(
                        r.scheduled_for > killed_at and r.status == "SUCCEEDED" for r in rs
                    ),
                    timeout_seconds=30,
                    what="an interval run after the restart",
                )
                assert len({r.id for r in runs}) == len(runs)
                everything = await client.list_jobs(limit=100)
                assert len(everything.items) == 26
            assert dev2.terminate() == 0, dev2.output()
        finally:
            dev2.close()
    finally:
        dev.close()


async def test_sigterm_stops_dev_cleanly(make_settings: SettingsFactory, tmp_path: Path) -> None:
    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    dev = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev.log")
    try:
        url, token = await read_dev_file(data, dev)
        exports = await dev_exports(env, data)
        assert [exports["URL"], exports["TOKEN"]] == [url, token]
        nc = await nats.connect(  # dev's own nats-server, as an API client (the auth callout)
            exports["NATS_URL"], token=token, inbox_prefix=exports["NATS_INBOX_PREFIX"]
        )
        await nc.close()
        dev.proc.send_signal(signal.SIGTERM)
        assert dev.proc.wait(30) == 0, dev.output()
        assert not (data / "dev.json").exists()
        pid_file = data / "nats" / "nats-server.pid"
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        assert (
            pid is None
            or not Path(f"/proc/{pid}").exists()
            or b"nats-server" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        ), "nats-server must stop with dev"
    finally:
        dev.close()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _dev_files(data: Path) -> dict[str, tuple[bytes, int]]:
    """Content and mtime of every file `jobsched dev` itself writes in its data dir."""
    paths = [
        data / "dev.json",
        *(data / "nats").glob("nats-server.*"),
        *(data / "nats").glob("ports/*"),
    ]
    return {str(p.relative_to(data)): (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


async def test_a_second_dev_on_the_same_data_dir_is_refused_and_touches_nothing(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    first = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev1.log")
    try:
        url, token = await read_dev_file(data, first)
        nats_pid = int((data / "nats" / "nats-server.pid").read_text())
        before = _dev_files(data)
        assert "dev.json" in before and "nats/nats-server.pid" in before

        second = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev2.log")
        try:
            code = await asyncio.to_thread(second.proc.wait, 30)
        finally:
            second.close()
        lines = [line for line in second.output().splitlines() if line.strip()]
        assert code == 1, second.output()
        assert len(lines) == 1, second.output()
        assert str(data.resolve()) in lines[0]
        assert f"pid {first.proc.pid}" in lines[0] and url in lines[0]

        assert _dev_files(data) == before
        assert _running(nats_pid), "the first instance's nats-server was stopped"
        async with JobschedClient(url, token) as client:
            job = await client.create_job({"taskId": "noop"})
            assert (
                await wait_job(client, job.id, {"SUCCEEDED"}, timeout_seconds=20)
            ).status == "SUCCEEDED"
        assert first.terminate() == 0, first.output()
    finally:
        first.close()


async def test_after_a_sigkill_the_next_dev_takes_the_lock_and_stops_the_orphaned_nats_server(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    first = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev1.log")
    try:
        await read_dev_file(data, first)
        orphan = int((data / "nats" / "nats-server.pid").read_text())
        stale = (data / "dev.json").read_text()
        first.kill()
        assert _running(orphan), "SIGKILL of dev leaves its nats-server running"

        second = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev2.log")
        try:
            url, token = await read_dev_file(data, second, previous=stale)
            assert not _running(orphan), "the orphaned nats-server was left running"
            assert int((data / "nats" / "nats-server.pid").read_text()) != orphan
            async with JobschedClient(url, token) as client:
                job = await client.create_job({"taskId": "noop"})
                await wait_job(client, job.id, {"SUCCEEDED"}, timeout_seconds=20)
            assert second.terminate() == 0, second.output()
        finally:
            second.close()
    finally:
        first.close()


async def test_dev_on_a_busy_port_fails_in_one_line_and_leaves_nothing_behind(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    import socket

    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        dev = Child(
            ["dev", "--data-dir", str(data), "--port", str(port)], env, tmp_path / "dev.log"
        )
        try:
            code = await asyncio.to_thread(dev.proc.wait, 60)
        finally:
            dev.close()
    out = dev.output()
    assert code == 1, out
    assert "already in use" in out and "Traceback" not in out
    pid = int((data / "nats" / "nats-server.pid").read_text())
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"nats-server" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )


async def test_sigterm_while_nats_is_unreachable_stops_at_once(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    with socket_closed_port() as port:
        env = env_for(make_settings(nats_url=f"nats://127.0.0.1:{port}"))
        child = Child(["scheduler"], env, tmp_path / "scheduler.log")
        try:
            async with asyncio.timeout(20):
                while "NATS error" not in child.output():
                    await asyncio.sleep(0.05)
            child.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(child.proc.wait, 10)
        finally:
            child.close()
    assert code == 0, child.output()


def socket_closed_port() -> Any:
    """A context manager yielding a port nothing listens on."""
    import contextlib
    import socket

    @contextlib.contextmanager
    def closed() -> Any:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield port

    return closed()


async def test_dev_bus_is_authenticated_and_its_secrets_private_and_never_logged(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """Issue 12: `jobsched dev` generates its NATS users into the data dir (0600), every
    connection authenticates, an API client connects with its token (the auth callout) and can
    do nothing else, and no secret (token, signing key, NATS password, the callout's issuer
    seed) reaches a log."""
    data = tmp_path / "dev-data"
    env = dev_env(make_settings, data)
    dev = Child(["dev", "--data-dir", str(data), "--port", "0"], env, tmp_path / "dev.log")
    try:
        url, token = await read_dev_file(data, dev)
        exports = await dev_exports(env, data)
        anonymous = Client()
        try:
            with pytest.raises((nats.errors.Error, nats.errors.NoServersError)):
                await anonymous.connect(
                    exports["NATS_URL"], allow_reconnect=False, connect_timeout=2
                )
        finally:  # nats-py leaves the socket of a refused connection open otherwise
            await anonymous.close()
        prefix = load_settings(env).nats.subject_prefix
        async with NatsJobschedClient(exports["NATS_URL"], token, prefix=prefix) as api:
            job = await api.create_job({"taskId": "noop"})
        async with JobschedClient(url, token) as client:
            assert (await wait_job(client, job.id, {"SUCCEEDED", "FAILED"})).status == "SUCCEEDED"
        errors: list[str] = []

        async def on_error(e: Exception) -> None:
            errors.append(str(e))

        nc = await nats.connect(
            exports["NATS_URL"],
            token=token,
            inbox_prefix=exports["NATS_INBOX_PREFIX"],
            error_cb=on_error,
        )
        try:
            await nc.subscribe(f"{prefix}.>")
            await nc.flush()
            async with asyncio.timeout(10):
                while not errors:
                    await asyncio.sleep(0.02)
        finally:
            await nc.close()
        assert "permissions violation" in errors[0].lower()
        secret_files = [data / "dev.json", data / "auth-secret", data / "nats/nats-server.conf"]
        secret_files += sorted((data / "nats-creds").iterdir())
        assert {f.name: f.stat().st_mode & 0o777 for f in secret_files} == {
            f.name: 0o600 for f in secret_files
        }
        assert (data / "nats-creds").stat().st_mode & 0o777 == 0o700
        secrets = [token, (data / "auth-secret").read_text().strip()]
        secrets += [read_credentials(f).password for f in (data / "nats-creds").glob("*.json")]
        secrets.append((data / "nats-creds" / "nats-callout-issuer.nk").read_text().strip())
    finally:
        dev.terminate()
        dev.close()
    logs = dev.output() + (data / "nats-server.log").read_text()
    assert "jobsched dev is ready" in logs
    leaked = [s[:6] + "…" for s in secrets if s in logs]
    assert not leaked, f"secrets in the logs: {leaked}"
