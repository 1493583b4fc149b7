"""STYLE.md's layering rule: ``core`` imports the standard library, msgspec and croniter only.

Checked in a fresh interpreter, so what this test process already imported does not hide an
import.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import core

REPO = Path(__file__).resolve().parents[2]
NAMED = ["core.model", "core.schedule", "core.ports", "core.heap", "core.cron", "core.settings"]
NAMED += ["core.tasks"]
FORBIDDEN = ["nats", "aiohttp", "pymongo", "bson", "motor", "aiosqlite"]
OUTER_LAYERS = ["store", "bus", "actors", "gateway", "jobsched", "tests"]


def _loaded_after_importing(modules: list[str]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def _offending(loaded: list[str]) -> list[str]:
    roots = {name.partition(".")[0] for name in loaded}
    return sorted(roots & {*FORBIDDEN, *OUTER_LAYERS})


def test_core_imports_no_adapter_library() -> None:
    loaded = _loaded_after_importing(NAMED)

    assert set(NAMED) <= set(loaded)
    assert _offending(loaded) == []


def test_no_core_module_imports_an_adapter_library() -> None:
    every = [f"core.{m.name}" for m in pkgutil.iter_modules(core.__path__)]
    assert set(NAMED) <= set(every)

    assert _offending(_loaded_after_importing(every)) == []


def test_the_check_sees_a_forbidden_import() -> None:
    assert _offending(_loaded_after_importing(["core.model", "aiohttp"])) == ["aiohttp"]


ACTORS_AND_GATEWAY = ["actors.scheduler", "actors.worker", "actors.recorder", "gateway.app"]


def test_the_actors_and_the_gateway_see_the_bus_only_through_core_ports() -> None:
    """``jobsched/runtime.py`` wires the NATS adapter in; nothing else of theirs loads it."""
    loaded = _loaded_after_importing(ACTORS_AND_GATEWAY)

    assert set(ACTORS_AND_GATEWAY) <= set(loaded)
    roots = {name.partition(".")[0] for name in loaded}
    assert sorted(roots & {"bus", "nats", "store", "pymongo", "aiosqlite", "jobsched"}) == []
