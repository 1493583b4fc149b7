"""Process pool for ``cpu`` tasks (pebble), one slot per core by default.

Arguments cross the process boundary as msgspec JSON and import paths, never as pickled objects
of ours. pebble terminates the child process of a run that exceeds its timeout or is cancelled,
which a ``concurrent.futures`` pool cannot do.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import msgspec
from pebble import ProcessPool

from core.tasks import TaskContext, TaskSpec


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def run_in_child(
    fn_ref: tuple[str, str], params_ref: tuple[str, str], params: bytes, ctx: bytes
) -> bytes:
    """Entry point inside the pool's process: decode, call the task, encode its result."""
    fn = _resolve(*fn_ref)
    params_type = _resolve(*params_ref)
    result = fn(
        msgspec.json.decode(params, type=params_type),
        msgspec.json.decode(ctx, type=TaskContext),
    )
    return msgspec.json.encode(result)


class CpuTaskTimeout(TimeoutError):
    """A cpu task ran past its timeout; its process was terminated."""


class CpuPool:
    """Lazily started pebble ``ProcessPool`` (spawn context: safe beside threads).

    Args:
        slots: number of processes; 0 = ``os.cpu_count()``.
    """

    def __init__(self, slots: int = 0) -> None:
        self.slots = slots or os.cpu_count() or 1
        self._pool: ProcessPool | None = None

    async def run(
        self, spec: TaskSpec, params: msgspec.Struct, ctx: TaskContext, timeout_seconds: float
    ) -> Any:
        """Run ``spec`` in a child process; terminate it after ``timeout_seconds`` seconds.

        Raises:
            CpuTaskTimeout: after ``timeout_seconds`` seconds (the child is terminated).
            Exception: whatever the task raised.
        """
        if self._pool is None:
            self._pool = ProcessPool(
                max_workers=self.slots, context=multiprocessing.get_context("spawn")
            )
        future = self._pool.schedule(
            run_in_child,
            args=(
                (spec.fn.__module__, spec.fn.__qualname__),
                (spec.params_type.__module__, spec.params_type.__qualname__),
                msgspec.json.encode(params),
                msgspec.json.encode(ctx),
            ),
            timeout=timeout_seconds,
        )
        try:
            raw = await asyncio.wrap_future(future)
        except FutureTimeout:
            raise CpuTaskTimeout(
                f"cpu task ran past its timeout of {timeout_seconds:g} s"
            ) from None
        except (asyncio.CancelledError, FutureCancelled):
            future.cancel()  # type: ignore[no-untyped-call]
            raise
        return msgspec.json.decode(raw)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # type: ignore[no-untyped-call]
            pool.join(timeout=5)
