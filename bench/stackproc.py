"""Run several roles of jobsched in one OS process (``jobsched dev`` without its own nats-server).

Settings come from ``JOBSCHED_*`` like ``jobsched gateway|scheduler|worker``; the benchmarks
start it as ``python -m bench.stackproc --roles gateway,scheduler,worker``. SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from core.settings import load_settings
from jobsched import eventloop
from jobsched.logs import configure_logging
from jobsched.runtime import Roles, serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roles", default="gateway,scheduler,worker")
    args = parser.parse_args()
    names = {r.strip() for r in args.roles.split(",") if r.strip()}
    unknown = names - {"gateway", "scheduler", "worker"}
    if unknown:
        parser.error(f"unknown roles: {', '.join(sorted(unknown))}")
    roles = Roles(
        gateway="gateway" in names, scheduler="scheduler" in names, worker="worker" in names
    )
    settings = load_settings(os.environ)
    configure_logging(settings.log_format, settings.log_level)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, roles, stop, freeze_heap=True)

    eventloop.run(runner(), settings.event_loop)


if __name__ == "__main__":
    main()
