"""Decoders of the messages the bus carries, built once per type (the one schema:
:mod:`core.model`).

The actors decode what a :class:`core.ports.Delivery` holds with these, so an undecodable
message stays theirs to set aside (the worker's poison path, the recorder's dead letters); the
NATS adapter (:mod:`bus.nats`) uses the same ones.
"""

from __future__ import annotations

import msgspec

from core.model import Event, RunMessage

run_decoder = msgspec.json.Decoder(RunMessage)
"""A work-stream message: :class:`core.model.RunMessage` (JSON). Raises ``msgspec.DecodeError``."""
status_decoder = msgspec.json.Decoder(Event)
"""A status-stream message: a run's :class:`core.model.StatusEvent` or a job's
:class:`core.model.JobEvent` (JSON, tagged). Raises ``msgspec.DecodeError``."""
