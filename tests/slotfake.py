"""An in-memory :class:`core.ports.ConcurrencySlots`: the rules of :mod:`core.concurrency` on a
dict, every write waking the waiters of its key (as the KV watch does)."""

from __future__ import annotations

import asyncio

from core.concurrency import SlotDecision, SlotRequest, SlotState, acquire, release, renew, slot_id


class MemorySlots:
    def __init__(self, lease_seconds: float = 30.0) -> None:
        self.lease_seconds = lease_seconds
        self.states: dict[str, SlotState] = {}
        self._events: dict[str, set[asyncio.Event]] = {}

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    def _write(self, sid: str, state: SlotState) -> None:
        self.states[sid] = state
        for event in self._events.get(sid, ()):
            event.set()

    async def acquire(self, request: SlotRequest, now_ms: int) -> SlotDecision:
        sid = slot_id(request.owner, request.key)
        decision = acquire(self.states.get(sid), request, now_ms, self.lease_ms)
        if decision.state != self.states.get(sid):
            self._write(sid, decision.state)
        return decision

    async def renew(self, request: SlotRequest, now_ms: int) -> None:
        sid = slot_id(request.owner, request.key)
        self._write(sid, renew(self.states.get(sid), request, now_ms, self.lease_ms))

    async def release(self, owner: str, key: str, execution_id: str, now_ms: int) -> None:
        sid = slot_id(owner, key)
        after = release(self.states.get(sid), execution_id, now_ms)
        if after is not None:
            self._write(sid, after)

    async def read(self, owner: str, key: str) -> SlotState | None:
        return self.states.get(slot_id(owner, key))

    async def changed(
        self, owner: str, key: str, timeout_seconds: float
    ) -> tuple[bool, SlotState | None]:
        sid = slot_id(owner, key)
        event = asyncio.Event()
        self._events.setdefault(sid, set()).add(event)
        try:
            async with asyncio.timeout(timeout_seconds):
                await event.wait()
        except TimeoutError:
            return False, None
        finally:
            self._events[sid].discard(event)
        return True, self.states.get(sid)

    async def watch(self) -> None:
        await asyncio.Event().wait()

    def holders(self, owner: str, key: str) -> list[str]:
        state = self.states.get(slot_id(owner, key))
        return [h.execution_id for h in state.holders] if state else []

    def waiters(self, owner: str, key: str) -> list[str]:
        state = self.states.get(slot_id(owner, key))
        return [w.execution_id for w in state.waiters] if state else []
