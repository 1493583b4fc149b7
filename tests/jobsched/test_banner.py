"""The `jobsched dev` banner tells a shell how to run this very jobsched (no activated venv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobsched.cli import _ready_banner, _self_command, main


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


def test_the_banner_says_how_to_get_the_sign_in_and_admin_tokens() -> None:
    banner = _ready_banner("http://127.0.0.1:8080", Path("/srv/data"), "nats://127.0.0.1:4333")
    assert "dev-env --token --data-dir /srv/data` prints" in banner
    assert "token --user root --role admin --data-dir /srv/data`" in banner
    # outside the default data dir, the CLI finds the server only through the eval line
    assert "after the eval line the CLI finds this server" in banner


def test_dev_env_token_prints_the_token_alone(tmp_path: Path) -> None:
    (tmp_path / "dev.json").write_text(
        json.dumps({"url": "http://127.0.0.1:1", "token": "abc.def.ghi", "nats": "nats://x"})
    )
    result = CliRunner().invoke(main, ["dev-env", "--token", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output == "abc.def.ghi\n"
    exports = CliRunner().invoke(main, ["dev-env", "--data-dir", str(tmp_path)])
    assert exports.output.startswith("export URL=") and "TOKEN=abc.def.ghi" in exports.output
