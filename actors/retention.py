"""Pruner actor: deletes finished runs past each job's retention, in the background.

A job keeps its most recently finished runs up to its history limit and those finished within
its maximum age (:mod:`core.history`); unfinished runs and its latest run stay. The pruner runs
in every scheduler process and works on the partitions that scheduler owns (its leases), so two
schedulers do not prune the same jobs. It works two ways:

- **Marked jobs** (the main path). A job whose run just finished is marked: by the recorder's
  ``RunsFinished`` notice (core NATS, to every scheduler; the owner of the job's partition takes
  it) and by the scheduler itself for the SKIPPED records it writes. The pruner wakes, looks the
  marked jobs up and prunes them, up to ``jobs_per_step`` jobs and ``batch`` runs per store call.
  Marks coalesce: a job that finished ten runs while waiting is pruned once.
- **The sweep** (the safety net). Every ``sweep_interval_seconds`` it walks every job of its
  partitions, a page at a time, and prunes each: the age rule for jobs without new runs (a
  paused or ended job's history still ages out), and whatever a lost notice, a failover or an
  upgrade left behind. A partition it gains is swept as soon as it notices (within
  ``ownership_check_seconds``).

Work is bounded: one store call deletes at most ``batch`` runs, and a job that had more to
delete (a backlog after an upgrade, a lowered limit) stays marked, so it is pruned again at the
next step and other store work interleaves. The set of marked jobs is bounded too
(``max_marked``); marks beyond it are dropped and left to the sweep.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from actors.metrics import Metrics
from actors.ownership import Ownership
from core.clock import Clock
from core.errors import StoreRejected, StoreUnavailable
from core.history import prune_target
from core.ids import partition_of
from core.model import Job, RunsFinished
from core.ports import JobStore, Notices, PruneResult, PruneTarget
from core.retry import raise_if_cancelling
from core.settings import RetentionConfig

log = logging.getLogger(__name__)


class Pruner:
    """Applies the retention rules to the jobs of the owned partitions (see module docstring).

    Args:
        store: the job store.
        bus: finished-run notices (NATS: :class:`bus.nats.Bus`).
        clock: wall clock (a fake one in tests): the age rule's "now" and the sweep's period.
        config: see :class:`RetentionConfig`.
        ownership: the partitions this process's scheduler owns (read, never driven, here).
        metrics: where it counts pruned runs; default: a registry of its own.
    """

    def __init__(
        self,
        store: JobStore,
        bus: Notices,
        clock: Clock,
        config: RetentionConfig,
        *,
        ownership: Ownership,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.config = config
        self.ownership = ownership
        self.metrics = metrics or Metrics()
        self.name = "pruner"
        self.ready = asyncio.Event()
        self.pruned = 0
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._marked: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._dropped = 0
        self._cycle_due = clock.now()
        self._swept: set[int] = set()
        self._cursor: tuple[int, str | None] | None = None

    @property
    def idle(self) -> bool:
        """No marked job waits and the sweep of every owned partition is done (for now)."""
        return not self._marked and self._sweep_partition() is None

    def stop(self) -> None:
        """Stop after the current store call (idempotent)."""
        self._stopping.set()
        self._wake.set()

    def mark(self, job_ids: Iterable[str]) -> None:
        """These jobs got finished runs: prune them soon (the caller owns their partitions)."""
        for job_id in job_ids:
            if job_id in self._marked:
                continue
            if len(self._marked) >= self.config.max_marked:
                self._dropped += 1
                continue
            self._marked[job_id] = None
        self.metrics.prune_backlog.set(len(self._marked))
        self._wake.set()

    async def run(self) -> None:
        """Prune until :meth:`stop`. Store and NATS outages are retried, never fatal."""
        finished = await self.bus.subscribe_finished(self._on_finished)
        self.ready.set()
        try:
            while not self._stopping.is_set():
                raise_if_cancelling()
                try:
                    await self._step()
                except StoreUnavailable as e:
                    log.warning("%s: %s; retrying in 1 s", self.name, e)
                    await self._pause(1.0)
                    continue
                await self.clock.sleep_until(self._next_deadline(), self._wake)
                self._wake.clear()
        finally:
            await finished.close()

    async def _on_finished(self, notice: RunsFinished) -> None:
        owned = self.ownership.owned
        n = self.config.partitions
        self.mark(j for j in notice.job_ids if partition_of(j, n) in owned)

    def _next_deadline(self) -> datetime:
        now = self.clock.now()
        if not self.idle:
            return now
        check = now + timedelta(seconds=self.config.ownership_check_seconds)
        return min(self._cycle_due, check)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _step(self) -> None:
        """One store call's worth of work: marked jobs first, then one page of the sweep."""
        now = self.clock.now()
        if self._dropped:
            log.warning(
                "%s: %d mark(s) dropped (backlog full); the sweep will find them",
                self.name,
                self._dropped,
            )
            self._dropped = 0
        if self._marked:
            take = min(len(self._marked), self.config.jobs_per_step)
            ids = [self._marked.popitem(last=False)[0] for _ in range(take)]
            self.metrics.prune_backlog.set(len(self._marked))
            try:
                owned = self.ownership.owned
                jobs = [j for j in await self.store.get_jobs(ids) if j.partition in owned]
                await self._prune(jobs, now)
            except StoreUnavailable:
                self.mark(ids)  # not done: again once the store is back
                raise
            except StoreRejected as e:  # refused for good: left to the next sweep, no loop
                log.error("%s: the store refuses to prune %d job(s): %s", self.name, len(ids), e)
        if now >= self._cycle_due:
            self._cycle_due = now + timedelta(seconds=self.config.sweep_interval_seconds)
            self._swept.clear()
            self._cursor = None
        partition = self._sweep_partition()
        if partition is not None:
            try:
                await self._sweep_page(partition, now)
            except StoreRejected as e:  # refused for good: this cycle skips the partition
                log.error(
                    "%s: the store refuses the sweep of partition %d: %s", self.name, partition, e
                )
                self._swept.add(partition)
                self._cursor = None

    def _sweep_partition(self) -> int | None:
        """The owned partition the sweep works on, or None when every one is swept."""
        owned = self.ownership.owned
        if self._cursor is not None and self._cursor[0] in owned:
            return self._cursor[0]
        todo = sorted(owned - self._swept)
        return todo[0] if todo else None

    async def _sweep_page(self, partition: int, now: datetime) -> None:
        after = self._cursor[1] if self._cursor and self._cursor[0] == partition else None
        page = await self.store.partition_jobs(
            partition, after=after, limit=self.config.jobs_per_step
        )
        await self._prune(page, now)
        if len(page) < self.config.jobs_per_step:
            self._swept.add(partition)
            self._cursor = None
        else:
            self._cursor = (partition, page[-1].id)

    async def _prune(self, jobs: list[Job], now: datetime) -> None:
        targets = [
            t for t in (prune_target(j, self.config.default, now) for j in jobs) if t is not None
        ]
        if not targets:
            return
        try:
            results = await self.store.prune_executions(targets, limit=self.config.batch)
        except StoreRejected:
            if len(targets) == 1:
                raise
            results = await self._one_by_one(targets)
        deleted = sum(r.deleted for r in results)
        self.pruned += deleted
        self.metrics.pruned_runs.inc(deleted)
        more = [t.job_id for t, r in zip(targets, results, strict=True) if not r.complete]
        if more:
            self.mark(more)
        if deleted:
            log.debug("%s: deleted %d finished run(s)", self.name, deleted)

    async def _one_by_one(self, targets: list[PruneTarget]) -> list[PruneResult]:
        """A bulkhead: the store refused a batch for good, so each job is pruned alone and the
        ones it refuses are logged and left (no job holds back the others)."""
        results: list[PruneResult] = []
        for t in targets:
            try:
                [result] = await self.store.prune_executions([t], limit=self.config.batch)
            except StoreRejected as e:
                log.error("%s: the store refuses to prune job %s: %s", self.name, t.job_id, e)
                result = PruneResult(deleted=0, complete=True)
            results.append(result)
        return results
