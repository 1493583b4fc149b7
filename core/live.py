"""What live clients read of the status stream: stored events with their ids, and replay
batches (the shapes of :class:`core.ports.StatusStream`).

An event's id is its sequence in the status stream: strictly increasing, the ``id`` of a
WebSocket event frame and the ``lastEventId`` a client resumes from (:mod:`gateway.ws`).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec


class StoredEvent(msgspec.Struct, frozen=True, gc=False):
    """One message of the status stream: its sequence (the event id), subject and JSON body
    (a :data:`core.model.Event`, undecoded: it is sent to clients as it is).

    The subject is ``<p>.status.<owner-key>.<job-id>`` (:func:`core.ids.owner_key`), so the
    event's user and job are known without decoding it.

    Not tracked by the garbage collector (``gc=False``: it holds no containers): replays make
    many of them, and tracked ones would make the collector's full passes come more often.
    """

    seq: int
    subject: str
    data: bytes

    @property
    def owner_key(self) -> str:
        """The user token of ``<p>.status.<owner-key>.<job-id>`` (:func:`core.ids.owner_key`)."""
        return self.subject.split(".", 3)[2]

    @property
    def job_id(self) -> str:
        return self.subject.rsplit(".", 1)[1]


@dataclass(frozen=True, slots=True)
class EventBatch:
    """What one replay read returned.

    Attributes:
        events: matching events in stream order, sequences increasing.
        more: the server that answered holds more matching events after the last one.
    """

    events: list[StoredEvent]
    more: bool
