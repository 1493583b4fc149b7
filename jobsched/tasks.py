"""The tasks jobsched ships: ``http`` (call a URL, :mod:`jobsched.http_task`),
``generate_report``, ``cleanup_export``, and the test tasks ``noop``, ``sleep`` and ``fail``.

A deployment points the ``tasks`` setting at its own ``module:callable`` returning a
:class:`core.tasks.TaskCatalog` (it may start from :func:`builtin_catalog`).
"""

from __future__ import annotations

import asyncio
import csv
import os
import random
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from core.tasks import TaskCatalog, TaskContext
from jobsched.http_task import HttpParams, call_url

SafeName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]


class Params(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """Base of task parameter types: unknown fields are an error (they come from clients)."""


class NoParams(Params, frozen=True):
    pass


class ReportParams(Params, frozen=True):
    report_type: Literal["sales", "usage", "billing"]
    region: SafeName


class ExportParams(Params, frozen=True):
    export_id: SafeName


class SleepParams(Params, frozen=True):
    seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)]


class FailParams(Params, frozen=True):
    times: Annotated[int, msgspec.Meta(ge=0, le=1000)]


class TaskFailed(Exception):
    """A task reports failure on purpose."""


def generate_report(params: ReportParams, ctx: TaskContext) -> dict[str, Any]:
    """Write ``<data_dir>/reports/<type>-<region>-<scheduled time>.csv`` (cpu task).

    The file name derives from the run's scheduled time, so every attempt of a run writes the
    same file (atomically, via a temporary file and rename): retries are idempotent.
    """
    out_dir = Path(ctx.data_dir) / "reports"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = ctx.scheduled_for.strftime("%Y%m%dT%H%M%S%f")[:-3] + "Z"
    path = out_dir / f"{params.report_type}-{params.region}-{stamp}.csv"
    rng = random.Random(ctx.idempotency_key)
    rows = [
        (f"{params.region}-{i:04d}", params.report_type, round(rng.uniform(10, 10_000), 2))
        for i in range(1_000)
    ]
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["account", "reportType", "amount"])
        writer.writerows(rows)
        writer.writerow(["TOTAL", params.report_type, round(sum(r[2] for r in rows), 2)])
    os.replace(tmp, path)
    return {"path": str(path), "rows": len(rows)}


def build_catalog() -> TaskCatalog:
    """A new catalog with the built-in tasks."""
    catalog = TaskCatalog()
    catalog.task(
        "http",
        params=HttpParams,
        timeout_seconds=60,
        max_attempts=5,
        description="Call a URL (method, url, headers, json or text body); the answer is stored.",
    )(call_url)
    catalog.task(
        "generate_report",
        params=ReportParams,
        kind="cpu",
        timeout_seconds=300,
        description="Write a CSV report (reportType, region) into <data dir>/reports.",
    )(generate_report)

    @catalog.task(
        "cleanup_export",
        params=ExportParams,
        timeout_seconds=60,
        description="Delete <data dir>/exports/<exportId>.csv if it exists.",
    )
    async def cleanup_export(params: ExportParams, ctx: TaskContext) -> dict[str, Any]:
        path = Path(ctx.data_dir) / "exports" / f"{params.export_id}.csv"
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            return {"deleted": False}
        return {"deleted": True}

    @catalog.task("noop", params=NoParams, timeout_seconds=60, description="Do nothing.")
    async def noop(params: NoParams, ctx: TaskContext) -> None:
        return None

    @catalog.task(
        "sleep", params=SleepParams, timeout_seconds=3600, description="Sleep `seconds` seconds."
    )
    async def sleep(params: SleepParams, ctx: TaskContext) -> None:
        await asyncio.sleep(params.seconds)

    @catalog.task(
        "fail",
        params=FailParams,
        timeout_seconds=60,
        description="Fail the first `times` attempts, then succeed.",
    )
    async def fail(params: FailParams, ctx: TaskContext) -> None:
        if ctx.attempt <= params.times:
            raise TaskFailed(
                f"failing on purpose: attempt {ctx.attempt} of the first {params.times}"
            )

    return catalog


def builtin_catalog() -> TaskCatalog:
    """Entry point of the ``tasks`` setting's default, ``jobsched.tasks:builtin_catalog``."""
    return build_catalog()
