"""Each kind of process of a deployment — a gateway alone, a scheduler (with its recorder), a
worker — exports the metrics of its roles only, plus the ``process_*`` and ``python_*``
collectors, and ``promtool check metrics`` passes on every endpoint. The three run side by side
on one real nats-server and SQLite store, as ``jobsched gateway``, ``jobsched scheduler`` and
``jobsched worker`` would.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from core.model import ExecutionStatus
from jobsched.runtime import Roles
from tests.conftest import SettingsFactory
from tests.e2e.test_metrics import check_with_promtool, scrape_text, scrape_until, value
from tests.support import EventLog, free_port, noop_body, start_stack

EVERY_PROCESS = {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"}
SCHEDULER_ONLY = {"jobsched_owned_partitions", "jobsched_heap_size", "jobsched_lease_losses_total"}
WORKER_ONLY = {
    "jobsched_runs_total",
    "jobsched_retries_total",
    "jobsched_run_duration_seconds_count",
}
GATEWAY_ONLY = {"http_server_request_duration_seconds_count", "http_server_active_requests"}


async def test_each_process_exports_its_roles_metrics_and_passes_promtool(
    make_settings: SettingsFactory, prefix: str
) -> None:
    ports = {"scheduler": free_port(), "worker": free_port()}
    scheduler_settings = make_settings(metrics_port=ports["scheduler"])
    async with AsyncExitStack() as processes:
        gateway = await processes.enter_async_context(
            start_stack(make_settings(), Roles(gateway=True))
        )
        await processes.enter_async_context(start_stack(scheduler_settings, Roles(scheduler=True)))
        await processes.enter_async_context(
            start_stack(make_settings(metrics_port=ports["worker"]), Roles(worker=True))
        )
        log = await processes.enter_async_context(EventLog(scheduler_settings.nats.url, prefix))
        job = await gateway.client().create_job(noop_body())
        await log.wait_status(job.id, ExecutionStatus.SUCCEEDED, timeout_seconds=20)
        urls = {
            "gateway": f"{gateway.url}/metrics",
            "scheduler": f"http://127.0.0.1:{ports['scheduler']}/metrics",
            "worker": f"http://127.0.0.1:{ports['worker']}/metrics",
        }
        samples = {
            "worker": await scrape_until(
                urls["worker"],
                lambda s: value(s, "jobsched_runs_total", task="noop", status="succeeded") == 1,
                what="the run's success on the worker",
            ),
            "scheduler": await scrape_until(
                urls["scheduler"],
                lambda s: value(s, "jobsched_dispatched_runs_total") == 1,
                what="the dispatched run on the scheduler",
            ),
            "gateway": await scrape_until(
                urls["gateway"],
                lambda s: (
                    value(
                        s,
                        "http_server_request_duration_seconds_count",
                        http_request_method="POST",
                        http_route="/jobs",
                        http_response_status_code="201",
                    )
                    == 1
                ),
                what="the POST /jobs on the gateway",
            ),
        }
        texts = {name: await scrape_text(url) for name, url in urls.items()}

    names = {process: {name for name, _ in s} for process, s in samples.items()}
    for process, exported in names.items():
        assert exported >= EVERY_PROCESS, process
        check_with_promtool(texts[process])
    assert names["scheduler"] >= SCHEDULER_ONLY
    assert names["worker"] >= WORKER_ONLY
    assert names["gateway"] >= GATEWAY_ONLY
    assert not names["gateway"] & (SCHEDULER_ONLY | WORKER_ONLY)
    assert not names["scheduler"] & (GATEWAY_ONLY | WORKER_ONLY)
    assert not names["worker"] & (GATEWAY_ONLY | SCHEDULER_ONLY)
    assert "jobsched_events_recorded_total" in names["scheduler"]  # its recorder
    assert not any(n.startswith(("jobsched_ws_", "http_")) for n in names["scheduler"])
