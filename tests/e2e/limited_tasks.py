"""A task catalog for tests: the built-in tasks plus ``tenant_sleep``, whose jobs get a default
concurrency limit from the task (``JOBSCHED_TASKS=tests.e2e.limited_tasks:catalog``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec

from core.tasks import TaskCatalog, TaskContext
from jobsched.tasks import Params, build_catalog

TASKS = "tests.e2e.limited_tasks:catalog"
TASK_KEY = "tenant-{tenant}"
TASK_MAX = 2


class TenantSleep(Params, frozen=True):
    seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)]
    tenant: str | None = None


def catalog() -> TaskCatalog:
    tasks = build_catalog()

    @tasks.task(
        "tenant_sleep",
        params=TenantSleep,
        timeout_seconds=60,
        description="Sleep `seconds` seconds, at most 2 runs of one tenant at once.",
        concurrency_key=TASK_KEY,
        max_concurrent=TASK_MAX,
    )
    async def tenant_sleep(params: TenantSleep, ctx: TaskContext) -> None:
        await asyncio.sleep(params.seconds)

    return tasks
