"""``jobsched.runtime``: how a process's actors start and stop together; settings reaching them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bus.callout import new_issuer_seed, write_issuer_seed
from core.errors import ConfigError
from core.history import Retention
from core.settings import load_settings
from jobsched.runtime import Roles, callout_issuer, run_actors


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
