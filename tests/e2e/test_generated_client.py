"""A client that nobody on this project wrote: ``openapi-python-client`` (PyPI, in the dev extra)
generates a Python package from the gateway's OpenAPI document, and its typed methods round-trip
every operation against a real stack (real nats-server, SQLite and HTTP).

The package is generated once per module into a temporary folder and imported under
:data:`PACKAGE`. Each call goes through :meth:`Generated.call`, which checks the HTTP status and
records the operation id; the last test checks that every operation of the document was called
(see :data:`PENDING`). An operation added later is one small test function here that calls it.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import attrs
import pytest

from core.access import Role
from core.model import ExecutionStatus
from gateway.auth import mint_token
from gateway.openapi import openapi_document
from jobsched.tasks import builtin_catalog
from tests.conftest import SettingsFactory
from tests.support import EventLog, Stack, start_stack, wait_executions

PACKAGE = "jobsched_generated_client"

PENDING: frozenset[str] = frozenset()
"""Operations not called here (none: every operation has a call below)."""


def _generator() -> Path:
    """The ``openapi-python-client`` beside this Python (the dev extra installs it)."""
    path = Path(sys.executable).parent / "openapi-python-client"
    if not path.exists():
        pytest.fail(f"no {path}: pip install -e '.[dev]' (the dev extra has openapi-python-client)")
    return path


@dataclass
class Generated:
    """The generated package and the operations called through it."""

    package: ModuleType
    doc: dict[str, Any]
    called: set[str] = field(default_factory=set)
    tests: set[str] = field(default_factory=set)
    """The tests of this module that ran in this process (pytest-xdist may run some elsewhere)."""

    @property
    def models(self) -> Any:
        return importlib.import_module(f"{PACKAGE}.models")

    def client(self, url: str, token: str) -> Any:
        return self.package.AuthenticatedClient(
            base_url=url, token=token, raise_on_unexpected_status=True
        )

    def operation(self, operation_id: str) -> Any:
        """The module of one operation: ``api/<tag>/<operation id in snake case>.py``."""
        [tag] = [
            op["tags"][0]
            for ops in self.doc["paths"].values()
            for op in ops.values()
            if op["operationId"] == operation_id
        ]
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", operation_id).lower()
        return importlib.import_module(f"{PACKAGE}.api.{tag}.{snake}")

    async def call(
        self, operation_id: str, status: int, client: Any, /, *args: Any, **kwargs: Any
    ) -> Any:
        """Call ``operation_id`` with the generated ``asyncio_detailed``; check the status and
        return the parsed (typed) answer."""
        response = await self.operation(operation_id).asyncio_detailed(
            *args, client=client, **kwargs
        )
        assert response.status_code == status, (
            operation_id,
            response.status_code,
            response.content,
        )
        self.called.add(operation_id)
        return response.parsed


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generated]:
    """The package generated from the document the gateway serves (checked against the served
    one in :func:`test_the_client_is_generated_from_the_served_document`)."""
    folder = tmp_path_factory.mktemp("generated")
    doc = openapi_document(task_ids=[t.name for t in builtin_catalog()])
    (folder / "openapi.json").write_text(json.dumps(doc))
    (folder / "config.json").write_text(
        json.dumps({"package_name_override": PACKAGE, "post_hooks": []})
    )
    proc = subprocess.run(
        [str(_generator()), "generate", "--path", str(folder / "openapi.json"),
         "--config", str(folder / "config.json"), "--meta", "none",
         "--output-path", str(folder / PACKAGE)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    sys.path.insert(0, str(folder))
    try:
        yield Generated(importlib.import_module(PACKAGE), doc)
    finally:
        sys.path.remove(str(folder))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


@pytest.fixture(autouse=True)
def _ran_here(request: pytest.FixtureRequest, generated: Generated) -> None:
    generated.tests.add(request.node.name)


async def listed(generated: Generated, client: Any, **filters: Any) -> list[str]:
    """The ids of every job ``listJobs`` answers for ``filters``, following ``nextCursor``
    two at a time."""
    ids: list[str] = []
    cursor: Any = generated.package.types.UNSET
    while True:
        page = await generated.call("listJobs", 200, client, limit=2, cursor=cursor, **filters)
        assert isinstance(page, generated.models.PageJob)
        ids += [job.id for job in page.items]
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


async def test_the_client_is_generated_from_the_served_document(
    generated: Generated, stack: Stack
) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{stack.url}/openapi.json") as resp:
        assert resp.status == 200
        assert await resp.json() == generated.doc


async def test_jobs_of_every_schedule_type_round_trip_with_real_types(
    generated: Generated, make_settings: SettingsFactory, prefix: str
) -> None:
    m = generated.models
    settings = make_settings()
    async with (
        start_stack(settings) as stack,
        EventLog(settings.nats.url, prefix) as log,
        generated.client(stack.url, stack.token("alice")) as client,
    ):
        before = datetime.now(UTC) - timedelta(seconds=1)
        now_job = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.NOOP),
            idempotency_key="gen-immediate",
        )  # fmt: skip
        replay = await generated.call(
            "createJob", 200, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.NOOP),
            idempotency_key="gen-immediate",
        )  # fmt: skip
        at = datetime(2030, 12, 1, 8, 0, tzinfo=UTC)
        once = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.CLEANUP_EXPORT,
                             parameters=m.JobCreateParameters.from_dict({"exportId": "E-1"}),
                             schedule=m.OnceScheduleIn(type_=m.OnceScheduleInType.ONCE, execute_at=at)),
        )  # fmt: skip
        cron = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(
                task_id=m.JobCreateTaskId.NOOP,
                schedule=m.CronScheduleIn(type_=m.CronScheduleInType.CRON, expression="0 8 * * 1-5",
                                          timezone="Europe/Berlin", end_at=at),
                misfire_policy=m.MisfirePolicy.SKIP, overlap_policy=m.OverlapPolicy.ALLOW,
            ),
        )  # fmt: skip
        interval = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(
                task_id=m.JobCreateTaskId.NOOP,
                schedule=m.IntervalScheduleIn(type_=m.IntervalScheduleInType.INTERVAL,
                                              every_seconds=3600.0, jitter_seconds=1.5),
                max_attempts=5, timeout_seconds=60.0,
            ),
        )  # fmt: skip

        assert isinstance(now_job, m.Job) and replay.id == now_job.id
        assert isinstance(now_job.schedule, m.ImmediateSchedule)
        assert isinstance(once.schedule, m.OnceSchedule) and once.schedule.execute_at == at
        assert once.next_run_at == at and isinstance(once.status, m.JobStatus)
        assert (
            isinstance(cron.schedule, m.CronSchedule) and cron.schedule.timezone == "Europe/Berlin"
        )
        assert cron.schedule.end_at == at and cron.misfire_policy == m.MisfirePolicy.SKIP
        assert isinstance(interval.schedule, m.IntervalSchedule)
        assert (interval.schedule.every_seconds, interval.schedule.jitter_seconds) == (3600.0, 1.5)
        assert (interval.max_attempts, interval.timeout_seconds) == (5, 60.0)
        for model in (m.Job, m.Execution, m.Attempt, m.CronSchedule, m.PageJob):
            # Every field of a job, a run, a page... is always in the answer: required, so
            # typed "X", not "X | Unset".
            maybe_unset = [f.name for f in attrs.fields(model) if "Unset" in str(f.type)]
            assert maybe_unset == [], (model, maybe_unset)
        for job in (now_job, once, cron, interval):
            assert isinstance(job.created_at, datetime) and job.created_at.tzinfo is not None
            assert job.created_at >= before and job.owner == "alice"
            assert isinstance(job.next_run_at, datetime | None)
            assert isinstance(job.run_count, int)

        got = await generated.call("getJob", 200, client, once.id)
        assert got.id == once.id and got.parameters.to_dict() == {"exportId": "E-1"}
        await log.wait_status(now_job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=20)
        page = await generated.call("listExecutions", 200, client, now_job.id)
        [run] = page.items
        assert isinstance(run, m.Execution) and run.status == m.ExecutionStatus.SUCCEEDED
        assert isinstance(run.scheduled_for, datetime) and isinstance(run.finished_at, datetime)
        assert [isinstance(a, m.Attempt) for a in run.attempts] == [True]
        one = await generated.call("getExecution", 200, client, now_job.id, run.id)
        assert one.id == run.id and one.attempts[0].outcome == m.ExecutionStatus.SUCCEEDED

        newest_first = [interval.id, cron.id, once.id, now_job.id]
        assert await listed(generated, client) == newest_first
        assert await listed(generated, client, task_id="cleanup_export") == [once.id]
        assert await listed(generated, client, status=m.ListJobsStatus.SUCCEEDED) == [now_job.id]
        # An aware datetime in the query (its '+00:00' percent-encoded by the client).
        assert await listed(generated, client, start_time=cron.created_at) == newest_first[:2]
        assert await listed(generated, client, end_time=before) == []
        assert await listed(
            generated, client, last_run_status=m.ListJobsLastRunStatus.SUCCEEDED
        ) == [now_job.id]


async def test_patch_control_and_schedules(
    generated: Generated, make_settings: SettingsFactory, prefix: str
) -> None:
    m = generated.models
    settings = make_settings()
    async with (
        start_stack(settings) as stack,
        EventLog(settings.nats.url, prefix) as log,
        generated.client(stack.url, stack.token("alice")) as client,
    ):
        job = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.NOOP, schedule=m.IntervalScheduleIn(
                type_=m.IntervalScheduleInType.INTERVAL, every_seconds=3600.0)),
        )  # fmt: skip
        patched = await generated.call(
            "patchJob", 200, client, job.id,
            body=m.JobPatch(
                schedule=m.CronScheduleIn(type_=m.CronScheduleInType.CRON, expression="30 6 * * *"),
                max_attempts=2, history_limit=None,
            ),
        )  # fmt: skip
        assert isinstance(patched.schedule, m.CronSchedule) and patched.max_attempts == 2
        assert isinstance(patched.next_run_at, datetime) and patched.next_run_at.minute == 30

        upcoming = await generated.call("listUpcoming", 200, client, job.id, count=3)
        assert isinstance(upcoming, m.JobFireTimes) and len(upcoming.fire_times) == 3
        assert all(
            isinstance(t, datetime) and (t.hour, t.minute) == (6, 30) for t in upcoming.fire_times
        )

        after = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
        preview = await generated.call(
            "previewSchedule", 200, client, expression="30 2 * * *", timezone="Europe/Berlin",
            after=after, count=2, gap=m.PreviewScheduleGap.SKIP,
        )  # fmt: skip
        # 2026-03-29 02:30 does not exist in Berlin (spring forward): skipped.
        assert preview.fire_times == [
            datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
            datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
        ]

        paused = await generated.call("pauseJob", 200, client, job.id)
        assert paused.status == m.JobStatus.PAUSED and paused.next_run_at is None
        conflict = await generated.call("pauseJob", 409, client, job.id)
        assert isinstance(conflict, m.Problem) and conflict.code == "job_state_conflict"
        resumed = await generated.call("resumeJob", 200, client, job.id)
        assert resumed.status == m.JobStatus.SCHEDULED

        run = await generated.call("triggerJob", 201, client, job.id)
        assert isinstance(run, m.Execution) and run.trigger == m.RunTrigger.MANUAL
        await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=20)

        cancelled = await generated.call("cancelJob", 200, client, job.id)
        assert cancelled.status == m.JobStatus.CANCELLED

        records = await generated.call("listJobAudit", 200, client, job.id)
        actions = [r.action for r in records.items]
        assert isinstance(records, m.PageAuditRecord) and isinstance(records.items[0].at, datetime)
        assert {m.AuditAction.CREATED, m.AuditAction.CHANGED, m.AuditAction.PAUSED} <= set(actions)
        mine = await generated.call("listAudit", 200, client, job_id=job.id)
        assert [r.action for r in mine.items] == actions

        assert await generated.call("deleteJob", 204, client, job.id) is None
        gone = await generated.call("getJob", 404, client, job.id)
        assert isinstance(gone, m.Problem) and gone.status == 404

        bad = await generated.call(
            "previewSchedule", 422, client, expression="61 * * * *",
        )  # fmt: skip
        assert isinstance(bad, m.Problem) and [e.field for e in bad.errors] == ["expression"]

        catalog = await generated.call("listTasks", 200, client)
        assert {"noop", "generate_report"} <= {t.task_id for t in catalog.items}
        assert isinstance(await generated.call("getHealth", 200, client), m.Health)
        ready = await generated.call("getReadiness", 200, client)
        assert ready.status == m.HealthStatus.OK


async def test_names_labels_and_explain(
    generated: Generated, make_settings: SettingsFactory, prefix: str
) -> None:
    m = generated.models
    settings = make_settings()
    async with (
        start_stack(settings) as stack,
        generated.client(stack.url, stack.token("alice")) as client,
    ):
        hourly = m.IntervalScheduleIn(type_=m.IntervalScheduleInType.INTERVAL, every_seconds=3600.0)
        made = {}
        for name, labels in [
            ("billing-prod", {"team": "billing", "env": "prod"}),
            ("billing-dev", {"team": "billing", "env": "dev"}),
            ("ml", {"team": "ml"}),
        ]:
            made[name] = await generated.call(
                "createJob", 201, client,
                body=m.JobCreate(task_id=m.JobCreateTaskId.NOOP, schedule=hourly, name=name,
                                 labels=m.JobCreateLabels.from_dict(labels)),
            )  # fmt: skip
        assert made["ml"].name == "ml" and made["ml"].labels.to_dict() == {"team": "ml"}
        taken = await generated.call(
            "createJob", 409, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.NOOP, schedule=hourly, name="ml"),
        )  # fmt: skip
        assert isinstance(taken, m.Problem) and taken.code == "name_taken"

        assert await listed(generated, client, name="ml") == [made["ml"].id]
        billing_not_dev = await listed(generated, client, labels="team=billing,env!=dev")
        assert billing_not_dev == [made["billing-prod"].id]
        assert await listed(generated, client, labels="team in (billing,ml),!env") == [
            made["ml"].id
        ]
        bad = await generated.call("listJobs", 422, client, labels="team in (")
        assert [e.field for e in bad.errors] == ["labels"]

        paused = await generated.call("pauseJob", 200, client, made["ml"].id)
        why = await generated.call("explainJob", 200, client, paused.id)
        assert isinstance(why, m.Explanation) and isinstance(why.at, datetime)
        assert why.reasons[0].code == "paused"
        assert why.reasons[0].severity == m.ReasonSeverity.BLOCKING


async def test_dead_letters_replay_backfill_bulk_notifications_stats_and_cluster(
    generated: Generated, make_settings: SettingsFactory, prefix: str
) -> None:
    m = generated.models
    settings = make_settings()
    async with (
        start_stack(settings) as stack,
        EventLog(settings.nats.url, prefix) as log,
        generated.client(stack.url, stack.token("alice")) as client,
        generated.client(stack.url, mint_token(
            settings.gateway.auth_secret, "root", ttl=timedelta(hours=1), role=Role.ADMIN
        )) as admin,
    ):  # fmt: skip
        failing = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.FAIL, max_attempts=1,
                             parameters=m.JobCreateParameters.from_dict({"times": 5})),
        )  # fmt: skip
        await log.wait_status(failing.id, ExecutionStatus.FAILED, timeout_seconds=20)
        await wait_executions(  # the recorder has stored it
            stack.client(), failing.id, lambda rs: [r.status for r in rs] == ["FAILED"]
        )
        dead = await generated.call("listRuns", 200, client, status=m.ListRunsStatus.FAILED)
        [letter] = dead.items
        assert isinstance(letter, m.Execution) and letter.job_id == failing.id
        replay = await generated.call("replayRun", 201, client, failing.id, letter.id)
        assert replay.replay_of == letter.id and replay.id != letter.id
        attempts = await generated.call(
            "listNotificationAttempts", 200, client, failing.id, letter.id
        )
        assert isinstance(attempts, m.NotificationAttemptList) and attempts.items == []

        bulk = await generated.call(
            "bulkReplay", 202, client, body=m.BulkCreate(task_id="fail", error="on purpose")
        )
        assert isinstance(bulk, m.BulkAction) and bulk.kind == m.BulkKind.REPLAY
        again = await generated.call("getBulk", 200, client, bulk.id)
        assert again.id == bulk.id and isinstance(again.created_at, datetime)
        cancel = await generated.call("bulkCancel", 202, client, body=m.BulkCreate(task_id="sleep"))
        assert cancel.kind == m.BulkKind.CANCEL

        cron = await generated.call(
            "createJob", 201, client,
            body=m.JobCreate(task_id=m.JobCreateTaskId.NOOP, schedule=m.CronScheduleIn(
                type_=m.CronScheduleInType.CRON, expression="0 * * * *")),
        )  # fmt: skip
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        plan = await generated.call(
            "backfillJob", 200, client, cron.id,
            body=m.BackfillRequest(from_=hour - timedelta(hours=3), to=hour, dry_run=True),
        )  # fmt: skip
        assert isinstance(plan, m.BackfillResult)
        assert plan.fire_times == [hour - timedelta(hours=h) for h in (3, 2, 1)]

        hook = m.NotifyIn(url="https://hooks.example.com/jobsched", on=[m.NotifyInOnItem.FAILURE])
        mine = await generated.call(
            "setNotificationDefault", 200, client, body=m.NotificationDefaultIn(notify=hook)
        )
        assert isinstance(mine, m.NotificationDefault)
        got = await generated.call("getNotificationDefault", 200, client)
        assert got.notify.url == "https://hooks.example.com/jobsched"

        overview = await generated.call("getStatsOverview", 200, client)
        assert isinstance(overview, m.StatsOverview) and overview.totals.to_dict()["FAILED"] >= 1
        upcoming = await generated.call("getStatsUpcoming", 200, client, timezone="Europe/Berlin")
        assert isinstance(upcoming, m.UpcomingHeatmap)
        refused = await generated.call("getCluster", 403, client)
        assert isinstance(refused, m.Problem)
        cluster = await generated.call("getCluster", 200, admin)
        assert isinstance(cluster, m.ClusterView) and isinstance(cluster.at, datetime)


def test_every_operation_was_called(generated: Generated) -> None:
    """Runs after the tests above (file order): each operation of the document was called
    through the generated client at least once, except :data:`PENDING`. Under pytest-xdist
    the module's tests may run on two workers; then none of them has seen every call, and the
    check is skipped (it runs whenever they ran together: ``make test TEST_WORKERS=0``, and
    most parallel runs)."""
    module = sys.modules[__name__]
    mine = {name for name in vars(module) if name.startswith("test_")}
    if not mine <= generated.tests:
        pytest.skip(f"run on another pytest-xdist worker: {sorted(mine - generated.tests)}")
    operations = {
        op["operationId"] for ops in generated.doc["paths"].values() for op in ops.values()
    }
    assert operations - generated.called <= PENDING, sorted(operations - generated.called - PENDING)
