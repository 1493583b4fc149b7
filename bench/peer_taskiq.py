"""taskiq + taskiq-nats for ``bench.peers``: a JetStream broker and a NATS KV schedule source.

taskiq's own CLI runs them (``BENCH_NATS_URL`` names the benchmark's private nats-server):

    python -m taskiq worker bench.peer_taskiq:broker --workers 1
    python -m taskiq scheduler bench.peer_taskiq:scheduler --update-interval 1

The benchmark adds one ``time`` schedule per job to :data:`source`; taskiq's scheduler loop sends
each to the broker's stream when due (it wakes on whole seconds), the worker runs ``noop``.
"""

from __future__ import annotations

import os

from taskiq import TaskiqScheduler
from taskiq_nats import NATSKeyValueScheduleSource, PullBasedJetStreamBroker

from bench.peer_tasks import TASKIQ_BUCKET, TASKIQ_STREAM, record_async

NATS_URL = os.environ.get("BENCH_NATS_URL", "")

broker = PullBasedJetStreamBroker(
    servers=NATS_URL, stream_name=TASKIQ_STREAM, durable=TASKIQ_STREAM
)
broker.register_task(record_async, task_name="noop")
source = NATSKeyValueScheduleSource(servers=NATS_URL, bucket_name=TASKIQ_BUCKET)
scheduler = TaskiqScheduler(broker, sources=[source])
