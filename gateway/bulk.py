"""The bulk runner: processes bulk replays and cancels (:mod:`core.bulk`) in the background of
every gateway, one batch at a time, under a lease on the action's record.

A gateway claims an open action whose lease expired (:meth:`core.ports.RunStore.claim_bulk`),
then repeats: read one page of the runs its filter selects (:data:`core.bulk.BULK_BATCH`),
replay or cancel them, save the counts, the cursor and an extended lease in one
compare-and-set (:meth:`core.ports.RunStore.save_bulk`). A gateway that dies mid-action stops
renewing; once the lease expired, another claims the action and goes on from the saved cursor;
the batch it repeats creates no second replay (ids derived from the action and the original
run) and cancels nothing twice (markers are idempotent). A gateway that finds its lease taken
over stops at once.

It sleeps on events: a bulk action created by this gateway wakes it; actions created by other
gateways, or left by a dead one, are found by a scan every ``scan_seconds`` (the safety net).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta

import msgspec

from core.access import Principal
from core.bulk import (
    BULK_BATCH,
    BULK_LEASE_SECONDS,
    BatchCounts,
    BulkAction,
    BulkKind,
    BulkStatus,
    after_batch,
    bulk_replays,
    phase_query,
)
from core.errors import JobschedError, QuotaExceeded, StoreRejected, Unavailable
from core.model import Execution, Job
from gateway.runs import RunService

log = logging.getLogger(__name__)


class BulkRunner:
    """Runs bulk actions until stopped (an actor of the gateway role).

    Args:
        runs: the run service (store, clock, bus and markers).
        holder: this gateway's id in leases (unique per process).
        lease_seconds: how long a lease lasts between two batches (seconds).
        batch: runs per batch.
        scan_seconds: how often to look for actions nobody holds (seconds).
    """

    def __init__(
        self,
        runs: RunService,
        *,
        holder: str,
        lease_seconds: float = BULK_LEASE_SECONDS,
        batch: int = BULK_BATCH,
        scan_seconds: float | None = None,
    ) -> None:
        self.runs = runs
        self.store = runs.store
        self.clock = runs.clock
        self.holder = holder
        self.lease_seconds = lease_seconds
        self.batch = batch
        self.scan_seconds = lease_seconds if scan_seconds is None else scan_seconds
        self.name = f"bulk-runner[{holder}]"
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Claim and process actions until :meth:`stop`; store outages are waited out."""
        self.ready.set()
        while not self._stop.is_set():
            try:
                action = await self.store.claim_bulk(
                    self.holder, now=self.clock.now(), lease_seconds=self.lease_seconds
                )
                if action is not None:
                    await self._process_or_fail(action)
                    continue
            except Unavailable as e:
                log.warning("bulk runner: %s; trying again", e)
            except JobschedError as e:  # e.g. a stored action this version cannot read
                log.error("bulk runner: %s; trying again at the next scan", e)
            await self._idle()

    async def _process_or_fail(self, action: BulkAction) -> None:
        """:meth:`process`; an action that cannot go on for good (an error that is not an
        outage, e.g. a cursor this version cannot read) is saved FAILED with the reason."""
        try:
            await self.process(action)
        except Unavailable:
            raise
        except JobschedError as e:
            log.error("bulk %s failed: %s", action.id, e)
            now = self.clock.now()
            failed = msgspec.structs.replace(
                action,
                status=BulkStatus.FAILED,
                error=e.message,
                updated_at=now,
                finished_at=now,
                lease_owner=None,
                lease_expires_at=now,
            )
            await self._save(action, failed)

    async def _idle(self) -> None:
        wake = self.runs.bulk_created
        waiters = [
            asyncio.ensure_future(wake.wait()),
            asyncio.ensure_future(self._stop.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=self.scan_seconds, return_when="FIRST_COMPLETED")
        finally:
            for w in waiters:
                w.cancel()
            wake.clear()

    async def process(self, action: BulkAction) -> BulkAction | None:
        """Process ``action`` (claimed by this runner) batch by batch until it is done, its
        lease is lost, or the runner stops; the action as last saved (None: lease lost)."""
        current: BulkAction | None = action
        while (
            current is not None and current.status == BulkStatus.RUNNING and not self._stop.is_set()
        ):
            current = await self.step(current)
        return current

    async def step(self, action: BulkAction) -> BulkAction | None:
        """One batch of ``action``: the next page of its runs handled and its progress saved;
        the action after it, or None when another gateway holds its lease now."""
        query = phase_query(action)
        if query is None:
            counts, next_cursor = BatchCounts(), None
        else:
            page = await self.store.list_runs(
                action.filter.owner, query, limit=self._batch_size(action), cursor=action.cursor
            )
            handled = await self._handle(action, page.items)
            if handled is None:  # a quota: keep the lease, try the same page again later
                return await self._save(action, self._extended(action, self.clock.now()))
            counts, next_cursor = handled, page.next_cursor
        now = self.clock.now()
        after = after_batch(action, next_cursor, counts, now, lease_seconds=self.lease_seconds)
        saved = await self._save(action, after)
        if saved is not None and saved.status == BulkStatus.SUCCEEDED:
            log.info(
                "bulk %s %s done: %d done, %d skipped, %d failed",
                saved.kind,
                saved.id,
                saved.done,
                saved.skipped,
                saved.failed,
            )
        return saved

    def _batch_size(self, action: BulkAction) -> int:
        """Runs per batch: at most the ``runsPerMinute`` bucket's capacity for a replay, so that
        a batch's tokens can always be granted in the end."""
        rate = self.runs.jobs.config.quotas.runs
        if action.kind != BulkKind.REPLAY or rate is None:
            return self.batch
        return max(1, min(self.batch, int(rate.capacity)))

    async def _save(self, before: BulkAction, after: BulkAction) -> BulkAction | None:
        if await self.store.save_bulk(after, holder=self.holder):
            return after
        log.warning("bulk %s: lease taken over by another gateway; stopping", before.id)
        return None

    def _extended(self, action: BulkAction, now: datetime) -> BulkAction:
        return msgspec.structs.replace(
            action, updated_at=now, lease_expires_at=now + timedelta(seconds=self.lease_seconds)
        )

    async def _handle(self, action: BulkAction, runs: list[Execution]) -> BatchCounts | None:
        """Replay or cancel one page of runs; None when a quota says to wait (then it waits
        up to half a lease, or until stopped)."""
        who = Principal(action.actor, action.actor_role)
        now = self.clock.now()
        if action.kind == BulkKind.CANCEL:
            return await self.runs.cancel_runs(who, runs, now, bulk_id=action.id)
        found, replays = await asyncio.gather(
            self.store.get_jobs({r.job_id for r in runs}),
            self.store.replays_of([r.id for r in runs]),
        )
        jobs: dict[str, Job] = {j.id: j for j in found}
        pairs = [(jobs.get(r.job_id), r) for r in runs]
        per_owner: dict[str, int] = {}  # a token for each run it will replay, not each selected
        for job, run in pairs:
            if job is not None and bulk_replays(action, job, run, replays):
                per_owner[job.owner] = per_owner.get(job.owner, 0) + 1
        try:
            await self.runs._take_runs(per_owner, now)
        except QuotaExceeded as e:
            wait = min(e.retry_after_seconds or 1.0, self.lease_seconds / 2)
            log.info("bulk %s: runsPerMinute; waiting %.1f s", action.id, wait)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._stop.wait()
            return None
        try:
            results = await self.runs.replay_runs(who, pairs, now, bulk=action)
        except StoreRejected as e:  # a run of the batch can never be recorded
            log.error("bulk %s: a batch of %d replays was refused: %s", action.id, len(pairs), e)
            return BatchCounts(failed=len(pairs))
        done = sum(1 for r in results if r.run is not None)
        return BatchCounts(done=done, skipped=len(results) - done)
