"""``jobsched.eventloop``: the service processes' loop is uvloop when installed, asyncio's
otherwise or when asked for, and either runs the same coroutine."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys

import pytest

from core.errors import ConfigError
from core.settings import load_settings
from jobsched import eventloop

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


async def loop_kind() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports of uvloop fail, as where it is not installed (a None entry in ``sys.modules``)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_asyncio_runs_on_the_standard_loop() -> None:
    assert eventloop.run(loop_kind(), "asyncio") == "asyncio"


@pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed")
def test_auto_and_uvloop_run_on_uvloop_when_installed() -> None:
    assert eventloop.run(loop_kind(), "auto") == "uvloop"
    assert eventloop.run(loop_kind(), "uvloop") == "uvloop"


@pytest.mark.usefixtures("no_uvloop")
def test_auto_falls_back_to_asyncio_without_uvloop() -> None:
    assert eventloop.loop_factory("auto") is None
    assert eventloop.run(loop_kind(), "auto") == "asyncio"


@pytest.mark.usefixtures("no_uvloop")
def test_uvloop_asked_for_but_missing_is_a_config_error() -> None:
    coro = loop_kind()
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        eventloop.run(coro, "uvloop")
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # never left un-awaited


def test_the_setting_names_the_loop() -> None:
    assert load_settings({}).event_loop == "auto"
    assert load_settings({"JOBSCHED_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
    with pytest.raises(ConfigError, match="JOBSCHED_EVENT_LOOP"):
        load_settings({"JOBSCHED_EVENT_LOOP": "trio"})
