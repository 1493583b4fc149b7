"""Prometheus metrics: scraped over real HTTP from a running stack and from a worker process.

Every wait is on a condition (a status event, or the scraped values themselves) with a timeout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import prometheus_client
import pytest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from actors.metrics import Metrics
from core.clock import FakeClock
from core.model import ExecutionStatus
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.support import (
    Child,
    EventLog,
    env_for,
    executions,
    free_port,
    noop_body,
    start_stack,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

ALLOWED_LABELS = {"task", "queue", "status", "reason", "connection", "le"}
HTTP_LABELS = {"http_request_method", "http_route", "http_response_status_code", "le"}
LIBRARY_PREFIXES = ("process_", "python_", "http_server_")
"""Families that are not jobsched's own: the client library's collectors, and the HTTP server
metrics named as OpenTelemetry's conventions."""


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name{labels}``; 0 when absent (a labelled series not created yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def check_with_promtool(text: str) -> None:
    """``promtool check metrics`` (Prometheus's own linter) passes on ``text``."""
    promtool = shutil.which("promtool")
    if promtool is None:
        reason = "no promtool (Debian package prometheus; .ci/run installs it)"
        if os.environ.get("CI"):  # .ci/run installs it: missing there is a failure, not a skip
            pytest.fail(reason)
        pytest.skip(reason)
    proc = subprocess.run(
        [promtool, "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


async def scrape_text(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def scrape(url: str) -> tuple[Samples, str]:
    """``GET url``: the parsed samples and the Content-Type."""
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return parse(await resp.text()), resp.headers["Content-Type"]


async def scrape_until(
    url: str, predicate: Callable[[Samples], bool], *, timeout_seconds: float = 20.0, what: str = ""
) -> Samples:
    """Scrape ``url`` until ``predicate`` holds (connection errors count as not yet)."""
    samples: Samples = {}
    try:
        async with asyncio.timeout(timeout_seconds):
            while True:
                try:
                    samples, _ = await scrape(url)
                except aiohttp.ClientConnectionError:
                    samples = {}
                if predicate(samples):
                    return samples
                await asyncio.sleep(0.05)
    except TimeoutError:
        jobsched = {k: v for k, v in samples.items() if k[0].startswith("jobsched_")}
        raise TimeoutError(f"timed out waiting for {what}; last scrape: {jobsched}") from None


def test_every_metric_is_prefixed_documented_and_bounded() -> None:
    metrics = Metrics()
    metrics.task("noop")
    metrics.skipped("overlap: previous run x is still RUNNING")
    metrics.queue_depth.labels(queue="default").set(1)
    metrics.redeliveries.labels(queue="default").inc()
    metrics.nats_disconnected("scheduler")()

    families = [f for f in metrics.registry.collect() if not f.name.startswith(LIBRARY_PREFIXES)]
    assert len(families) == 25
    for family in families:
        assert family.name.startswith("jobsched_"), family.name
        assert family.documentation, family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds") and "Seconds" in family.documentation
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, sample


def _names(metrics: Metrics) -> set[str]:
    return {family.name for family in metrics.registry.collect()}


def test_a_process_exports_the_metrics_of_its_roles_only() -> None:
    worker, scheduler = _names(Metrics({"worker"})), _names(Metrics({"scheduler", "recorder"}))
    gateway, everything = _names(Metrics({"gateway"})), _names(Metrics())
    notifier = _names(Metrics({"notifier"}))

    assert "jobsched_runs" in worker and "jobsched_owned_partitions" not in worker
    assert "jobsched_owned_partitions" in scheduler and "jobsched_runs" not in scheduler
    assert "jobsched_events_recorded" in scheduler and "jobsched_ws_connections" not in scheduler
    assert {"http_server_request_duration_seconds", "jobsched_ws_connections"} <= gateway
    assert "jobsched_queue_depth" in worker & scheduler  # both refresh it
    assert "jobsched_notification_attempts" in notifier - worker - scheduler - gateway
    assert worker | scheduler | gateway | notifier == everything
    for names in (worker, scheduler, gateway, notifier):
        assert "jobsched_nats_disconnects" in names
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= names
        assert not any(n.startswith("http_server_") for n in names - gateway)
    with pytest.raises(ValueError, match="unknown roles"):
        Metrics({"mystery"})


def test_http_metric_labels_are_bounded() -> None:
    metrics = Metrics({"gateway"})
    metrics.http_request_duration.labels(
        http_request_method="GET", http_route="/jobs/{job_id}", http_response_status_code="200"
    ).observe(0.01)
    for family in metrics.registry.collect():
        if family.name.startswith("http_server_"):
            for sample in family.samples:
                assert set(sample.labels) <= HTTP_LABELS, sample


def test_each_metrics_object_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.task("noop").succeeded.inc()

    assert (
        first.registry.get_sample_value(
            "jobsched_runs_total", {"task": "noop", "status": "succeeded"}
        )
        == 1
    )
    assert (
        second.registry.get_sample_value(
            "jobsched_runs_total", {"task": "noop", "status": "succeeded"}
        )
        is None
    )
    assert prometheus_client.REGISTRY.get_sample_value("jobsched_heap_size") is None


def test_skip_reasons_are_bounded() -> None:
    metrics = Metrics()
    metrics.skipped("misfire", 9)
    metrics.skipped("orphan: recorded but never dispatched")
    metrics.skipped("something new")

    samples = parse(prometheus_client.generate_latest(metrics.registry).decode())
    assert value(samples, "jobsched_skipped_runs_total", reason="misfire") == 9
    assert value(samples, "jobsched_skipped_runs_total", reason="orphan") == 1
    assert value(samples, "jobsched_skipped_runs_total", reason="other") == 1
    assert value(samples, "jobsched_skipped_runs_total", reason="overlap") == 0


async def test_gateway_metrics_count_runs_retries_and_delays(
    make_settings: SettingsFactory, prefix: str
) -> None:
    settings = make_settings(queue_depth_interval_seconds=0.2)
    async with start_stack(settings) as stack, EventLog(settings.nats.url, prefix) as log:
        client = stack.client()
        noops = [await client.create_job(noop_body()) for _ in range(3)]
        fail = await client.create_job(
            {"taskId": "fail", "parameters": {"times": 2}, "maxAttempts": 3}
        )
        for job in [*noops, fail]:
            await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=20)
        url = f"{stack.url}/metrics"
        # 3 noop runs: RUNNING + SUCCEEDED; the fail run: 3 x RUNNING, 2 x RETRYING, SUCCEEDED.
        s = await scrape_until(
            url,
            lambda s: (
                value(s, "jobsched_runs_total", task="fail", status="succeeded") == 1
                and value(s, "jobsched_events_recorded_total") == 12
                and value(s, "jobsched_owned_partitions") == settings.scheduler.partitions
            ),
            what="the fail run's success, 12 recorded events, every partition owned",
        )
        _, content_type = await scrape(url)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{stack.url}/no/such/path/42") as resp:
                assert resp.status in (401, 404)
            async with session.get(
                f"{stack.url}/jobs/{fail.id}",
                headers={"Authorization": f"Bearer {stack.token('alice')}"},
            ) as resp:
                assert resp.status == 200
        text = await scrape_text(url)
        s = parse(text)

    check_with_promtool(text)
    http = "http_server_request_duration_seconds_count"
    assert (
        value(
            s, http, http_request_method="POST", http_route="/jobs", http_response_status_code="201"
        )
        == 4
    )
    assert (
        value(
            s,
            http,
            http_request_method="GET",
            http_route="/jobs/{job_id}",
            http_response_status_code="200",
        )
        >= 1
    )
    unmatched = [k for k in s if k[0] == http and ("http_route", "unmatched") in k[1]]
    assert len(unmatched) == 1 and not any("42" in v for _, v in unmatched[0][1])
    assert value(s, "http_server_active_requests", http_request_method="GET") == 1  # this scrape
    assert content_type == CONTENT_TYPE_LATEST
    assert value(s, "jobsched_runs_total", task="noop", status="succeeded") == 3
    assert value(s, "jobsched_runs_total", task="noop", status="failed") == 0
    assert value(s, "jobsched_runs_total", task="fail", status="failed") == 0
    assert value(s, "jobsched_retries_total", task="fail") == 2
    assert value(s, "jobsched_retries_total", task="noop") == 0
    assert value(s, "jobsched_redeliveries_total", queue="default") == 2
    assert value(s, "jobsched_schedule_to_start_seconds_count", task="noop") == 3
    assert value(s, "jobsched_schedule_to_start_seconds_count", task="fail") == 1
    assert value(s, "jobsched_schedule_to_start_seconds_bucket", task="fail", le="+Inf") == 1
    assert value(s, "jobsched_run_duration_seconds_count", task="noop") == 3
    assert value(s, "jobsched_run_duration_seconds_count", task="fail") == 3
    assert value(s, "jobsched_schedule_to_publish_seconds_count") == 4
    assert value(s, "jobsched_schedule_to_publish_seconds_bucket", le="60.0") == 4
    assert value(s, "jobsched_dispatched_runs_total") == 4
    assert value(s, "jobsched_redispatched_runs_total") == 0
    assert value(s, "jobsched_store_write_failures_total") == 0
    assert value(s, "jobsched_heap_size") == 0
    for reason in ("misfire", "overlap", "orphan"):
        assert value(s, "jobsched_skipped_runs_total", reason=reason) == 0
    assert ("jobsched_queue_depth", frozenset({("queue", "default")})) in s


async def test_an_overlap_skip_and_a_cancelled_run_are_counted(
    make_settings: SettingsFactory, prefix: str
) -> None:
    settings = make_settings()
    async with start_stack(settings) as stack, EventLog(settings.nats.url, prefix) as log:
        client = stack.client()
        job = await client.create_job(
            {
                "taskId": "sleep",
                "parameters": {"seconds": 60},
                "schedule": {"type": "interval", "everySeconds": 1},
                "overlapPolicy": "forbid",
            }
        )
        await log.wait_status(job.id, ExecutionStatus.SKIPPED, timeout_seconds=20)
        await client.cancel_job(job.id)
        await log.wait_status(job.id, ExecutionStatus.CANCELLED, timeout_seconds=20)
        url = f"{stack.url}/metrics"
        async with asyncio.timeout(20):
            while True:
                runs = await executions(client, job.id)
                skipped = [r for r in runs if (r.skip_reason or "").startswith("overlap")]
                s, _ = await scrape(url)
                if value(s, "jobsched_runs_total", task="sleep", status="cancelled") == 1 and (
                    value(s, "jobsched_skipped_runs_total", reason="overlap") == len(skipped)
                ):
                    break
                await asyncio.sleep(0.05)

    assert len(skipped) >= 1
    assert value(s, "jobsched_schedule_to_start_seconds_count", task="sleep") == 1
    assert value(s, "jobsched_run_duration_seconds_count", task="sleep") == 1
    assert value(s, "jobsched_runs_total", task="sleep", status="succeeded") == 0
    assert value(s, "jobsched_dispatched_runs_total") == 1


async def test_a_misfire_counts_the_missed_occurrences_and_the_late_publication(
    make_settings: SettingsFactory,
) -> None:
    """A minutely job whose scheduler was down 10:00-10:09:45: one catch-up run for 10:09,
    published and started 45 s late (fake clock), 9 occurrences missed."""
    clock = FakeClock(datetime(2026, 6, 1, 9, 59, 30, tzinfo=UTC))
    settings = make_settings()
    async with start_stack(settings, clock=clock) as stack:
        job = await stack.client().create_job(
            {
                "taskId": "noop",
                "misfirePolicy": "runOnce",
                "misfireGraceSeconds": 30,
                "schedule": {"type": "cron", "expression": "* * * * *"},
            }
        )
    await clock.set(datetime(2026, 6, 1, 10, 9, 45, tzinfo=UTC))
    async with start_stack(settings, clock=clock) as stack:
        s = await scrape_until(
            f"{stack.url}/metrics",
            lambda s: value(s, "jobsched_runs_total", task="noop", status="succeeded") == 1,
            what="the catch-up run",
        )
        [record] = [r for r in await executions(stack.client(), job.id) if r.missed]

    assert record.missed is not None and record.missed.count == 9
    assert value(s, "jobsched_skipped_runs_total", reason="misfire") == 9
    assert value(s, "jobsched_schedule_to_publish_seconds_count") == 1
    assert value(s, "jobsched_schedule_to_publish_seconds_sum") == 45.0
    assert value(s, "jobsched_schedule_to_publish_seconds_bucket", le="30.0") == 0
    assert value(s, "jobsched_schedule_to_publish_seconds_bucket", le="60.0") == 1
    assert value(s, "jobsched_schedule_to_start_seconds_sum", task="noop") == 45.0


async def test_queue_depth_follows_the_waiting_runs(
    make_settings: SettingsFactory, prefix: str
) -> None:
    settings = make_settings(worker_concurrency=1, queue_depth_interval_seconds=0.2)
    async with start_stack(settings) as stack, EventLog(settings.nats.url, prefix) as log:
        client = stack.client()
        url = f"{stack.url}/metrics"
        sleeper = await client.create_job({"taskId": "sleep", "parameters": {"seconds": 60}})
        await log.wait_status(sleeper.id, ExecutionStatus.RUNNING, timeout_seconds=20)
        for _ in range(2):
            await client.create_job(noop_body())
        await scrape_until(
            url,
            lambda s: value(s, "jobsched_queue_depth", queue="default") == 3,
            what="a depth of 3: the running sleep and two waiting noops",
        )
        await client.cancel_job(sleeper.id)
        s = await scrape_until(
            url,
            lambda s: (
                value(s, "jobsched_queue_depth", queue="default") == 0
                and value(s, "jobsched_runs_total", task="noop", status="succeeded") == 2
            ),
            what="an empty queue after the sleep was cancelled",
        )

    assert value(s, "jobsched_runs_total", task="sleep", status="cancelled") == 1
    assert value(s, "jobsched_schedule_to_start_seconds_count", task="noop") == 2


@pytest.mark.slow
async def test_a_worker_process_serves_its_metrics_on_the_metrics_port(
    make_settings: SettingsFactory, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    worker_url = f"http://127.0.0.1:{port}/metrics"
    settings = make_settings(queue_depth_interval_seconds=0.2)
    async with (
        start_stack(settings, Roles(gateway=True, scheduler=True)) as stack,
        EventLog(settings.nats.url, prefix) as log,
    ):
        env = env_for(settings, JOBSCHED_WORKER_ID="mw1", JOBSCHED_METRICS_PORT=str(port))
        child = Child(["worker"], env, tmp_path / "mw1.log")
        try:
            client = stack.client()
            noop = await client.create_job(noop_body())
            fail = await client.create_job(
                {"taskId": "fail", "parameters": {"times": 1}, "maxAttempts": 2}
            )
            for job in (noop, fail):
                await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=30)
            worker = await scrape_until(
                worker_url,
                lambda s: (
                    value(s, "jobsched_runs_total", task="fail", status="succeeded") == 1
                    and value(s, "jobsched_runs_total", task="noop", status="succeeded") == 1
                    and ("jobsched_queue_depth", frozenset({("queue", "default")})) in s
                    and value(s, "jobsched_queue_depth", queue="default") == 0
                ),
                what="both runs' success and an empty queue on the worker's metrics port",
            )
            gateway = await scrape_until(
                f"{stack.url}/metrics",
                lambda s: value(s, "jobsched_dispatched_runs_total") == 2,
                what="two dispatched runs on the gateway's /metrics",
            )
            worker_text = await scrape_text(worker_url)
            gateway_text = await scrape_text(f"{stack.url}/metrics")
            assert child.terminate() == 0, child.output()
        finally:
            child.close()

    assert value(worker, "jobsched_retries_total", task="fail") == 1
    assert value(worker, "jobsched_redeliveries_total", queue="default") == 1
    assert value(worker, "jobsched_schedule_to_start_seconds_count", task="noop") == 1
    assert value(worker, "jobsched_schedule_to_start_seconds_count", task="fail") == 1
    assert value(worker, "jobsched_run_duration_seconds_count", task="fail") == 2
    assert value(worker, "jobsched_dispatched_runs_total") == 0
    assert value(gateway, "jobsched_schedule_to_publish_seconds_count") == 2
    assert value(gateway, "jobsched_owned_partitions") == settings.scheduler.partitions
    assert not any(name == "jobsched_runs_total" for name, _ in gateway)
    assert not any(
        name.startswith(("jobsched_owned", "jobsched_ws_", "http_")) for name, _ in worker
    )
    assert value(worker, "process_cpu_seconds_total") > 0
    check_with_promtool(worker_text)
    check_with_promtool(gateway_text)
