"""A task's default concurrency limit (core.tasks.TaskConcurrency): checked when the task is
registered, taken by a job that sets no limit of its own."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from core.concurrency import ConcurrencyPolicy
from core.errors import InvalidRequest
from core.tasks import TaskCatalog, TaskConcurrency, TaskContext, TaskSpec


class Tenant(msgspec.Struct, rename="camel"):
    tenant_id: str | None = None
    region: str = "eu"


async def run(params: Tenant, ctx: TaskContext) -> None:
    return None


def task(**limit: Any) -> TaskSpec:
    catalog = TaskCatalog()
    catalog.task("t", params=Tenant, **limit)(run)
    return catalog.get("t")


def test_a_task_without_a_limit_has_none() -> None:
    assert task().concurrency is None


def test_the_limit_is_kept_with_the_task() -> None:
    spec = task(concurrency_key="t-{tenantId}", max_concurrent=3, concurrency_policy="skip")
    assert spec.concurrency == TaskConcurrency("t-{tenantId}", 3, ConcurrencyPolicy.SKIP)


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ({"concurrency_key": "t-{tenant_id}"}, "names 'tenant_id', which is not one of its"),
        ({"concurrency_key": "t-{"}, "unclosed '{'"),
        ({"concurrency_key": ""}, "must not be empty"),
        ({"concurrency_key": "k", "max_concurrent": 0}, "max_concurrent must be 1 to 10000"),
        (
            {"concurrency_key": "k", "concurrency_policy": "drop"},
            "must be one of queue, skip, not 'drop'",
        ),
    ],
)
def test_an_invalid_limit_fails_the_registration(limit: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match="task 't'") as raised:
        task(**limit)
    assert reason in str(raised.value)


QUEUE = ConcurrencyPolicy.QUEUE
LIMITED = {"concurrency_key": "t-{tenantId}", "max_concurrent": 2, "concurrency_policy": "skip"}


def test_a_job_without_a_limit_of_its_own_takes_the_tasks() -> None:
    spec = task(**LIMITED)
    assert spec.job_concurrency(None, None, None, {"tenantId": "acme"}) == (
        "t-{tenantId}",
        2,
        ConcurrencyPolicy.SKIP,
    )


def test_a_policy_the_job_sets_is_kept_with_the_tasks_key() -> None:
    spec = task(**LIMITED)  # the task skips; this job asks to queue
    assert spec.job_concurrency(None, None, QUEUE, {"tenantId": "acme"}) == (
        "t-{tenantId}",
        2,
        QUEUE,
    )


def test_a_job_setting_nothing_of_its_own_queues_by_default() -> None:
    assert task().job_concurrency("mine", 2, None, {}) == ("mine", 2, QUEUE)


def test_a_job_with_a_key_of_its_own_keeps_its_own_limit() -> None:
    spec = task(**LIMITED)
    assert spec.job_concurrency("mine", None, QUEUE, {}) == ("mine", None, QUEUE)


def test_max_concurrent_without_a_key_is_still_the_jobs_mistake() -> None:
    with pytest.raises(InvalidRequest) as raised:
        task(**LIMITED).job_concurrency(None, 3, QUEUE, {"tenantId": "acme"})
    assert raised.value.errors[0].field == "maxConcurrent"


def test_a_job_of_a_task_without_a_limit_has_none() -> None:
    assert task().job_concurrency(None, None, None, {}) == (None, None, QUEUE)


def test_a_job_missing_the_tasks_key_parameter_is_a_422_naming_the_way_out() -> None:
    with pytest.raises(InvalidRequest) as raised:
        task(**LIMITED).job_concurrency(None, None, None, {"region": "us"})
    [error] = raised.value.errors
    assert error.field == "concurrencyKey"
    assert "the default of task 't', 't-{tenantId}', names parameter 'tenantId'" in error.reason
    assert "give the job a concurrencyKey of its own" in error.reason
