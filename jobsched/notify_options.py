"""The ``--notify-*`` options of ``jobsched submit`` and ``jobsched notify-default`` (README
"Notifications"), kept apart from the commands (:mod:`jobsched.cli_notify`) so that
:mod:`jobsched.cli_jobs` can use them.

The secret is best passed through the environment (``JOBSCHED_NOTIFY_SECRET``), not on a
command line other users of the machine can read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

OUTCOMES = ("failure", "success")
NOTIFY_KEYS = ("notify_url", "notify_on", "notify_secret")
"""The keyword arguments :func:`notify_options` adds (popped by :func:`notify_field`)."""


def notify_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--notify-url``, ``--notify-on`` (repeatable), ``--notify-secret``."""
    for option in reversed(
        [
            click.option(
                "--notify-url",
                default=None,
                help="POST a signed webhook here when a run ends (README Notifications).",
            ),
            click.option(
                "--notify-on",
                multiple=True,
                type=click.Choice(OUTCOMES),
                help="Which outcomes notify (repeatable) [default: failure].",
            ),
            click.option(
                "--notify-secret",
                envvar="JOBSCHED_NOTIFY_SECRET",
                default=None,
                help="Signing secret whsec_<base64> [env JOBSCHED_NOTIFY_SECRET].",
            ),
        ]
    ):
        f = option(f)
    return f


def notify_body(url: str | None, on: tuple[str, ...], secret: str | None) -> dict[str, Any] | None:
    """The API's ``notify`` object of these options (None: no ``--notify-url``).

    Raises:
        click.UsageError: ``--notify-on`` or ``--notify-secret`` without ``--notify-url``.
    """
    if url is None:
        if on:
            raise click.UsageError("--notify-on goes with --notify-url")
        return None
    body: dict[str, Any] = {"url": url}
    if on:
        body["on"] = sorted(set(on))
    if secret:
        body["secret"] = secret
    return body


def notify_field(options: dict[str, Any]) -> dict[str, Any]:
    """``{"notify": ...}`` for a job body from the popped :data:`NOTIFY_KEYS` ({} without)."""
    notify = notify_body(*(options.pop(k) for k in NOTIFY_KEYS))
    return {} if notify is None else {"notify": notify}
