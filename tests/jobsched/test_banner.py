"""What `jobsched dev` prints once ready."""

from __future__ import annotations

from pathlib import Path

from jobsched.cli import _ready_banner


def test_the_banner_names_the_api_and_the_dashboard_but_no_secret() -> None:
    banner = _ready_banner("http://127.0.0.1:8080", Path("/srv/data"), "nats://127.0.0.1:4333")
    lines = [line.split() for line in banner.splitlines()]
    assert ["API", "http://127.0.0.1:8080"] in lines
    assert next(line[:2] for line in lines if line[:1] == ["Dashboard"]) == [
        "Dashboard",
        "http://127.0.0.1:8080/ui/",
    ]
    assert "/srv/data/dev.json" in banner  # where the token is, not the token
