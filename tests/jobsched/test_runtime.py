"""``jobsched.runtime``: how a process's actors start and stop together; settings reaching them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bus.callout import new_issuer_seed, write_issuer_seed
from core.errors import ConfigError
from core.history import Retention
from core.settings import load_settings
from jobsched import cli, runtime
from jobsched.runtime import Roles, callout_issuer, run_actors
from tests.conftest import SettingsFactory
from tests.support import REPO, start_stack


class MissesOneCancellation:
    """An actor that loses one cancellation, as ``asyncio.wait_for`` inside nats-py can make it
    on Python 3.11 when the cancel races with a reply; it ends only on :meth:`stop`."""

    name = "misses-a-cancel"

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self.missed = False

    async def run(self) -> None:
        self.ready.set()
        try:
            await self._stop.wait()
        except asyncio.CancelledError:
            self.missed = True  # swallowed, the way the race swallows it
            await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()


class FailsAtStart:
    """An actor that fails once the other is running (a gateway whose port is taken)."""

    name = "fails"

    def __init__(self, after: asyncio.Event) -> None:
        self.ready = asyncio.Event()
        self._after = after

    async def run(self) -> None:
        await self._after.wait()
        raise OSError("address already in use")

    def stop(self) -> None:
        pass


async def test_a_failing_actor_stops_the_others_even_one_that_would_miss_its_cancellation() -> None:
    """The failure is raised at once, not after a hang: the others are stopped cooperatively
    (cancelling alone would leave ``MissesOneCancellation`` running forever)."""
    missing = MissesOneCancellation()
    with pytest.raises(BaseExceptionGroup) as raised:
        async with asyncio.timeout(5):
            await run_actors([missing, FailsAtStart(missing.ready)], asyncio.Event())
    assert raised.group_contains(OSError)


async def test_the_stop_event_stops_every_actor() -> None:
    missing = MissesOneCancellation()
    stop = asyncio.Event()
    async with asyncio.timeout(5):
        running = asyncio.create_task(run_actors([missing], stop))
        await missing.ready.wait()
        stop.set()
        await running
    assert not missing.missed


def test_the_retention_settings_reach_the_pruner() -> None:
    settings = load_settings(
        {
            "JOBSCHED_HISTORY_LIMIT": "7",
            "JOBSCHED_HISTORY_MAX_AGE_SECONDS": "0",
            "JOBSCHED_HISTORY_SWEEP_INTERVAL_SECONDS": "60",
            "JOBSCHED_PARTITIONS": "16",
        }
    )

    config = settings.retention

    assert config.default == Retention(keep_last=7, max_age_seconds=None)
    assert (config.sweep_interval_seconds, config.partitions) == (60.0, 16)


def test_a_gateway_reads_the_callout_issuer_before_it_connects(tmp_path: Path) -> None:
    missing = {"JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE": str(tmp_path / "missing.nk")}
    with pytest.raises(ConfigError, match="JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE"):
        callout_issuer(load_settings(missing), Roles(gateway=True))
    assert callout_issuer(load_settings(missing), Roles(worker=True)) is None
    assert callout_issuer(load_settings({}), Roles(gateway=True)) is None
    seed_file = tmp_path / "issuer.nk"
    write_issuer_seed(seed_file, new_issuer_seed())
    settings = load_settings({"JOBSCHED_NATS_CALLOUT_ISSUER_SEED_FILE": str(seed_file)})
    issuer = callout_issuer(settings, Roles(gateway=True))
    assert issuer is not None and issuer.public_key.startswith("A")


def test_freezing_the_start_up_heap_takes_its_objects_out_of_every_collection() -> None:
    """In a process of its own (a frozen pytest process would never free its cycles): after
    ``freeze_startup_heap`` the collector tracks almost nothing, so a full collection has
    almost nothing to scan, and every object alive is in the permanent generation."""
    code = (
        "import gc, json, jobsched.runtime as r; before = len(gc.get_objects()); "
        "n = r.freeze_startup_heap(); "
        "print(json.dumps([before, n, len(gc.get_objects()), gc.get_freeze_count()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    before, frozen, tracked_after, freeze_count = json.loads(out.stdout)
    assert before > 10_000  # the runtime's imports: what a full collection scanned
    assert frozen == freeze_count >= before // 2
    assert tracked_after < 1_000


async def test_serve_freezes_the_heap_once_every_actor_is_ready_and_only_when_asked(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []

    def freeze() -> int:
        calls.append(True)
        return 0

    monkeypatch.setattr(runtime, "freeze_startup_heap", freeze)
    settings = make_settings()
    async with start_stack(settings, Roles(scheduler=True, recorder=False)):
        assert calls == []
    async with start_stack(settings, Roles(scheduler=True, recorder=False), freeze_heap=True):
        assert calls == [True]  # before the stack counted as started
    assert calls == [True]


@pytest.mark.parametrize("command", ["gateway", "scheduler", "worker", "notifier"])
def test_the_service_commands_freeze_their_heap(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``jobsched gateway|scheduler|worker|notifier`` pass ``freeze_heap=True`` to ``serve``
    (the process's loop, its logging set-up and ``serve`` itself replaced: nothing starts; no
    ``JOBSCHED_*`` of the environment is read)."""
    for name in [n for n in os.environ if n.startswith("JOBSCHED_")]:
        monkeypatch.delenv(name)
    seen: list[dict[str, object]] = []

    async def fake_serve(*args: object, **kwargs: object) -> None:
        seen.append(kwargs)

    def run_at_once(
        main: Callable[[asyncio.Event], Coroutine[Any, Any, None]], **_: object
    ) -> None:
        asyncio.run(main(asyncio.Event()))

    monkeypatch.setattr(cli, "serve", fake_serve)
    monkeypatch.setattr(cli, "_run_until_signal", run_at_once)
    monkeypatch.setattr(cli, "configure_logging", lambda *_: None)
    result = CliRunner().invoke(cli.main, [command])
    assert result.exit_code == 0, result.output
    assert seen == [{"freeze_heap": True}]
