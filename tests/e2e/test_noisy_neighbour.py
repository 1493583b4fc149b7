"""A noisy neighbour must not stall scheduling (issue 11).

Hundreds of WebSocket clients subscribe with ``lastEventId: 0`` over a long status stream and
never read, against a stack whose gateway, scheduler, recorder and worker share one process (as
in ``jobsched dev``). The scheduler must keep every lease, the process must keep every NATS
connection, and a steady recurring job must keep running: no occurrence SKIPPED. The gateway
sheds the stalled clients (that a stalled replaying client gets the 4008 close is
``test_live_status.test_a_slow_client_is_cut_off_while_a_fast_one_keeps_receiving``).
"""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from core.model import ExecutionStatus
from jobsched.natsserver import NatsServer
from tests.conftest import SettingsFactory
from tests.support import seed_events, stalled_ws, start_stack, wait_executions

STALLED_CLIENTS = 400
SEEDED_EVENTS = 20_000
"""Events of the stalled clients' user already in the status stream: each client's replay."""
EVERY_SECONDS = 2.0
"""The steady job's interval: its runs must not overlap (the default policy skips an occurrence
whose previous run is still unfinished), whatever the stalled clients cost the process."""
RUNS_WHILE_STALLED = 12
"""Occurrences that must run after the clients connected: longer than their replays last."""


async def samples(url: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of metric ``name`` at ``url``/metrics, by label set."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {
        frozenset(s.labels.items()): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_stalled_replaying_clients_cost_the_scheduler_no_lease_and_no_run(
    make_settings: SettingsFactory, own_nats: NatsServer
) -> None:
    settings = make_settings(nats_url=own_nats.url)
    async with start_stack(settings) as stack:
        client = stack.client()
        job = await client.create_job(
            {"taskId": "noop", "schedule": {"type": "interval", "everySeconds": EVERY_SECONDS}}
        )
        await wait_executions(
            client,
            job.id,
            lambda runs: any(r.status == ExecutionStatus.SUCCEEDED for r in runs),
            timeout_seconds=20,
            what="the interval job's first run",
        )
        await seed_events(own_nats.url, settings.nats.subject_prefix, "alice", SEEDED_EVENTS)
        stalled: list[socket.socket] = []
        try:
            async with asyncio.timeout(120):
                for _ in range(STALLED_CLIENTS):
                    stalled.append(await stalled_ws(stack.url, stack.token("alice")))
            connected = datetime.now(UTC)
            runs = await wait_executions(
                client,
                job.id,
                lambda runs: (
                    sum(
                        1
                        for r in runs
                        if r.scheduled_for > connected and r.status == ExecutionStatus.SUCCEEDED
                    )
                    >= RUNS_WHILE_STALLED
                ),
                timeout_seconds=120,
                what=f"{RUNS_WHILE_STALLED} runs after the stalled clients connected",
            )
            lease_losses = await samples(stack.url, "jobsched_lease_losses_total")
            disconnects = await samples(stack.url, "jobsched_nats_disconnects_total")
            async with asyncio.timeout(120):
                while (await samples(stack.url, "jobsched_ws_connections")).get(frozenset()):
                    await asyncio.sleep(0.5)
        finally:
            for sock in stalled:
                sock.close()
    skipped = [r for r in runs if r.status == ExecutionStatus.SKIPPED]
    assert skipped == [], [(r.scheduled_for, r.skip_reason) for r in skipped]
    assert sum(lease_losses.values()) == 0, lease_losses
    assert disconnects and sum(disconnects.values()) == 0, disconnects
