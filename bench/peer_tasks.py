"""The peers' side of ``bench.peers``: the no-op task each peer runs, and their worker processes.

Every peer runs the same task: it appends ``"<due> <started>\\n"`` (epoch seconds) to the file
named by ``BENCH_PEER_LOG`` and returns, so the benchmark reads when each job started from one
place, whatever the peer. Worker processes (one per peer that has them):

    python -m bench.peer_tasks celery --redis URL   # a Celery worker, solo pool
    python -m bench.peer_tasks arq --redis URL      # an arq worker

The taskiq worker and scheduler are taskiq's own CLI on :mod:`bench.peer_taskiq`. The peers'
libraries are the ``peers`` extra (pyproject.toml); each is imported only where it is used.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from typing import IO, Any

ARQ_POLL_DELAY_SECONDS = 0.05
"""arq's ``poll_delay`` (its default 0.5 s would put half a second on every start)."""
ARQ_MAX_JOBS = 1000
"""arq's ``max_jobs`` (concurrent jobs per worker; its default is 10)."""
TASKIQ_STREAM = "bench_taskiq"
TASKIQ_BUCKET = "bench_taskiq_schedules"
"""The JetStream stream and the NATS KV bucket of the taskiq peer (:mod:`bench.peer_taskiq`)."""
CELERY_WORKER_ARGS = ["--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat"]


@functools.cache
def _log(path: str) -> IO[str]:
    # line-buffered: one write per job; open for the process's life
    return open(path, "a", buffering=1)


def record(due: float) -> None:
    """The no-op job: note when it started (``due`` is when it was due, epoch seconds)."""
    _log(os.environ["BENCH_PEER_LOG"]).write(f"{due!r} {time.time()!r}\n")


async def record_async(due: float) -> None:
    """:func:`record` as a coroutine function, for the asyncio peers."""
    record(due)


def celery_app(redis_url: str) -> Any:
    """A Celery app on Redis with the ``noop`` task (:func:`record`)."""
    from celery import Celery  # noqa: PLC0415

    app = Celery("bench", broker=redis_url)
    app.conf.update(broker_connection_retry_on_startup=True, task_ignore_result=True)
    app.task(name="noop")(record)
    return app


async def arq_noop(ctx: dict[str, Any], due: float) -> None:
    record(due)


async def run_arq_worker(redis_url: str) -> None:
    from arq.connections import RedisSettings  # noqa: PLC0415
    from arq.worker import Worker, func  # noqa: PLC0415

    worker = Worker(
        functions=[func(arq_noop, name="noop")],
        redis_settings=RedisSettings.from_dsn(redis_url),
        poll_delay=ARQ_POLL_DELAY_SECONDS,
        max_jobs=ARQ_MAX_JOBS,
        keep_result=0,
    )
    try:
        await worker.main()
    finally:
        await worker.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("peer", choices=["celery", "arq"])
    p.add_argument("--redis", required=True, help="redis://host:port/db")
    args = p.parse_args()
    if args.peer == "celery":
        celery_app(args.redis).worker_main(["worker", "--loglevel=WARNING", *CELERY_WORKER_ARGS])
    else:
        asyncio.run(run_arq_worker(args.redis))


if __name__ == "__main__":
    main()
