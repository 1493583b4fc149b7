"""The dashboard's files under /ui: public, with a strict CSP; the data behind them is not."""

from __future__ import annotations

import pytest
from yarl import URL

from gateway.dashboard import ASSETS_DIR, CSP
from tests.gateway.conftest import Api


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/ui/", "text/html"),
        ("/ui/jobs/some-id", "text/html"),
        ("/ui/jobs/some-id/runs/some-run", "text/html"),
        ("/ui/assets/app.js", "text/javascript"),
        ("/ui/assets/style.css", "text/css"),
    ],
)
async def test_the_files_are_public_with_a_strict_csp(
    api: Api, path: str, content_type: str
) -> None:
    async with api.session.get(api.url + path) as resp:
        assert resp.status == 200
        assert resp.content_type == content_type
        assert resp.headers["Content-Security-Policy"] == CSP
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe" not in CSP and "frame-ancestors 'none'" in CSP


def test_every_asset_is_served_with_a_known_type() -> None:
    assert {p.suffix for p in ASSETS_DIR.iterdir()} <= {".js", ".css"}


async def test_ui_redirects_to_the_page(api: Api) -> None:
    async with api.session.get(api.url + "/ui", allow_redirects=False) as resp:
        assert (resp.status, resp.headers["Location"]) == (308, "/ui/")


@pytest.mark.parametrize(
    "path", ["/ui/assets/nope.js", "/ui/assets/..%2Fdashboard.py", "/ui/assets/%2e%2e%2fapp.py"]
)
async def test_only_the_listed_files_are_served(api: Api, path: str) -> None:
    async with api.session.get(URL(api.url + path, encoded=True)) as resp:
        assert resp.status == 404


@pytest.mark.parametrize(
    "path", ["/jobs", "/ui/../jobs", "/ui/%2e%2e/jobs", "/ui/assets/../../jobs"]
)
async def test_no_data_without_a_token_whatever_the_path(api: Api, path: str) -> None:
    """Sent as written (no client-side normalisation): whatever the server makes of a path, a
    route that is not the dashboard's asks for the token."""
    async with api.session.get(URL(api.url + path, encoded=True)) as resp:
        body = await resp.text()
        if resp.status == 200:  # a /ui path: the page itself, never the data
            assert resp.content_type == "text/html" and "<title>jobsched</title>" in body
        else:
            assert resp.status == 401
