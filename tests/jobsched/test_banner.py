"""The `jobsched dev` banner tells a shell how to run this very jobsched (no activated venv)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jobsched.cli import _ready_banner, _self_command


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "venv" / "bin" / "jobsched"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return script


def test_a_jobsched_on_path_is_named_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "dev"])
    monkeypatch.setenv("PATH", str(script.parent))
    assert _self_command() == "jobsched"


def test_a_jobsched_off_path_is_named_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "dev"])
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.chdir(tmp_path)
    assert _self_command() == "venv/bin/jobsched"  # `make run` in the checkout: .venv/bin/jobsched
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _self_command() == str(script)


def test_python_m_jobsched_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/repo/jobsched/__main__.py", "dev"])
    assert _self_command().endswith(" -m jobsched")


def test_the_banner_uses_that_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "dev"])
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.chdir(tmp_path)
    banner = _ready_banner("http://127.0.0.1:8080", tmp_path / "data", "nats://127.0.0.1:4222")
    assert 'eval "$(venv/bin/jobsched dev-env)"' in banner
    assert "\n  venv/bin/jobsched list" in banner


def test_the_banner_names_the_api_and_the_dashboard_but_no_secret() -> None:
    banner = _ready_banner("http://127.0.0.1:8080", Path("/srv/data"), "nats://127.0.0.1:4333")
    lines = [line.split() for line in banner.splitlines()]
    assert ["API", "http://127.0.0.1:8080"] in lines
    assert next(line[:2] for line in lines if line[:1] == ["Dashboard"]) == [
        "Dashboard",
        "http://127.0.0.1:8080/ui/",
    ]
    assert "/srv/data/dev.json" in banner  # where the token is, not the token
    # not the default ./data: the eval line names the data dir, so it works from anywhere
    assert 'dev-env --data-dir /srv/data)"' in banner and "in this directory" not in banner
