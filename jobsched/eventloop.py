"""The event loop the jobsched processes run on: uvloop when it is installed, else asyncio's.

uvloop (libuv under asyncio's API) is a drop-in: it makes the socket writes and callbacks of
every NATS message cheaper (``bench/README.md``, "Where the time goes"). It is an optional
dependency (``pip install 'jobsched[uvloop]'``, part of ``dev``); without it, or with
``JOBSCHED_EVENT_LOOP=asyncio``, the processes run on the standard library's loop, which the
test suite itself uses.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from core.errors import ConfigError

T = TypeVar("T")
EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop ``choice`` names; None for asyncio's default loop.

    ``auto``: uvloop if it can be imported, else asyncio's. ``uvloop``: uvloop or an error.

    Raises:
        ConfigError: ``uvloop`` was asked for and cannot be imported.
    """
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "JOBSCHED_EVENT_LOOP=uvloop, but uvloop is not installed "
                "(pip install 'jobsched[uvloop]')"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names (see :func:`loop_factory`).

    Raises:
        ConfigError: as :func:`loop_factory` (``main`` is then closed without running).
    """
    try:
        factory = loop_factory(choice)
    except ConfigError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
