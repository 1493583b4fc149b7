"""Concurrency limits, decided without I/O: the key template and the slot rules.

A job may set ``concurrencyKey``, a template over its parameters (``"tenant-{customer}"``), and
``maxConcurrent``: across every worker, at most that many runs whose key renders to the same text
*for the same owner* run at once (keys are per user: another user choosing the same text shares
nothing). A run that finds every slot taken waits in order (``concurrencyPolicy: queue``) or is
recorded SKIPPED with reason ``concurrency`` (``skip``).

Template syntax (no evaluation of any kind): literal text, and ``{name}`` placeholders naming a
top-level parameter whose value is a string, an integer or a boolean (``{{`` and ``}}`` are
literal braces). A name is ``[A-Za-z_][A-Za-z0-9_]*``, at most 64 characters; a template is at
most :data:`MAX_TEMPLATE_CHARS` characters and renders to at most :data:`MAX_KEY_CHARS`.

Slots: one :class:`SlotState` per (owner, key), kept by the adapter in a NATS KV entry written
by revision-checked create/update (compare-and-set); :func:`acquire`, :func:`release` and
:func:`renew` are the only rules, applied to the entry read, their result written back at that
revision (a lost race reads and decides again). Every holder and waiter carries a lease
(``expiresAtMs``, wall clock of the writer) renewed while its worker lives: a worker that dies
holding a slot stops renewing it and the slot is free again once the lease expires, so a crash
costs the key at most one lease of capacity (README "Concurrency limits").
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from core.errors import FieldError, InvalidRequest

MAX_TEMPLATE_CHARS = 200
MAX_KEY_CHARS = 256
MAX_CONCURRENT_LIMIT = 10_000
"""The largest ``maxConcurrent``."""
DEFAULT_SLOT_LEASE_SECONDS = 30.0
"""How long a slot (or a place in the queue) outlives its worker's last renewal (seconds)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
SKIP_REASON = "concurrency"
"""The start of the ``skipReason`` of a run skipped by ``concurrencyPolicy: skip``."""


class ConcurrencyPolicy(enum.StrEnum):
    """What a run does when every slot of its key is taken."""

    QUEUE = "queue"
    SKIP = "skip"


# --- the key template -------------------------------------------------------------------------


def parse_template(template: str) -> list[tuple[bool, str]]:
    """The parts of ``template``: ``(False, literal)`` and ``(True, parameter name)``.

    Raises:
        ValueError: the reason it is not a template (for a 422 naming ``concurrencyKey``).
    """
    if not template:
        raise ValueError("must not be empty")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"must be at most {MAX_TEMPLATE_CHARS} characters")
    parts: list[tuple[bool, str]] = []
    literal: list[str] = []
    i = 0
    while i < len(template):
        ch = template[i]
        if ch in "{}" and template[i : i + 2] in ("{{", "}}"):
            literal.append(ch)
            i += 2
            continue
        if ch == "}":
            raise ValueError(f"unmatched '}}' at position {i} (write '}}}}' for a brace)")
        if ch == "{":
            end = template.find("}", i + 1)
            if end < 0:
                raise ValueError(f"unclosed '{{' at position {i}")
            name = template[i + 1 : end]
            if not _NAME.fullmatch(name):
                raise ValueError(
                    f"{{{name}}} is not a placeholder: write {{name}} with a parameter name "
                    "(letters, digits, _; not starting with a digit)"
                )
            if literal:
                parts.append((False, "".join(literal)))
                literal = []
            parts.append((True, name))
            i = end + 1
            continue
        if not ch.isprintable():
            raise ValueError(f"must be printable text (character {i} is not)")
        literal.append(ch)
        i += 1
    if literal:
        parts.append((False, "".join(literal)))
    return parts


def render_key(template: str, parameters: dict[str, Any]) -> str:
    """The key ``template`` names for these parameters.

    Raises:
        ValueError: the template is invalid, a parameter is missing or not a string, integer or
            boolean, or the key is longer than :data:`MAX_KEY_CHARS`.
    """
    out: list[str] = []
    for is_name, text in parse_template(template):
        if not is_name:
            out.append(text)
            continue
        if text not in parameters:
            raise ValueError(f"names parameter {text!r}, which the job does not set")
        value = parameters[text]
        if isinstance(value, bool):
            out.append("true" if value else "false")
        elif isinstance(value, int | str):
            out.append(str(value))
        else:
            raise ValueError(
                f"parameter {text!r} is a {type(value).__name__}; a key takes strings, integers "
                "and booleans only"
            )
    key = "".join(out)
    if len(key) > MAX_KEY_CHARS:
        raise ValueError(f"renders to {len(key)} characters; at most {MAX_KEY_CHARS}")
    return key


def check_concurrency(
    concurrency_key: str | None, max_concurrent: int | None, parameters: dict[str, Any]
) -> None:
    """Validate a job's concurrency options against its parameters (create and PATCH).

    Raises:
        InvalidRequest: naming ``concurrencyKey`` (invalid template, missing parameter) or
            ``maxConcurrent`` (set without a key).
    """
    if concurrency_key is None:
        if max_concurrent is not None:
            raise InvalidRequest(FieldError("maxConcurrent", "needs a concurrencyKey"))
        return
    try:
        render_key(concurrency_key, parameters)
    except ValueError as e:
        raise InvalidRequest(FieldError("concurrencyKey", str(e))) from None


def slot_id(owner: str, key: str) -> str:
    """The KV key of (owner, key): ``c.<blake2b-128 hex of owner NUL key>`` (a key may hold any
    text; KV keys may not). Stable across processes and versions."""
    digest = hashlib.blake2b(f"{owner}\0{key}".encode(), digest_size=16).hexdigest()
    return f"c.{digest}"


# --- slots ------------------------------------------------------------------------------------


class Holder(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A run holding a slot (or waiting for one: :class:`SlotState` ``waiters``).

    Attributes:
        execution_id: the run.
        worker_id: the worker that holds it (or holds its message while it waits).
        order_ms: its place in line: its scheduled time (epoch ms); ties by execution id.
        since_ms: when it took the slot or joined the queue (epoch ms).
        expires_at_ms: its lease (epoch ms, writer's wall clock): past it, the entry is dropped.
    """

    execution_id: str
    worker_id: str
    order_ms: int
    since_ms: int
    expires_at_ms: int


class SlotState(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The slots of one (owner, key): the value of its KV entry (JSON; a public interface,
    README "Concurrency limits").

    Attributes:
        owner / key: whose key and its rendered text.
        max_concurrent: the limit the last writer applied.
        holders: runs holding a slot.
        waiters: runs waiting, in no particular order (:func:`queue_order` sorts them).
    """

    owner: str
    key: str
    max_concurrent: int = 1
    holders: tuple[Holder, ...] = ()
    waiters: tuple[Holder, ...] = ()


class Outcome(enum.StrEnum):
    ACQUIRED = "acquired"
    WAITING = "waiting"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class SlotRequest:
    """A run asking for a slot of (``owner``, ``key``)."""

    owner: str
    key: str
    execution_id: str
    worker_id: str
    order_ms: int
    max_concurrent: int
    policy: ConcurrencyPolicy = ConcurrencyPolicy.QUEUE


@dataclass(frozen=True, slots=True)
class SlotDecision:
    """The result of :func:`acquire`.

    Attributes:
        outcome: acquired (run now), waiting (in the queue: wait for a change of the entry or
            :attr:`wake_at_ms`), skipped (policy ``skip`` and no slot).
        state: the entry to write (equal to the one read when nothing changed: no write).
        position: 0-based place in line while waiting (0: next), else 0.
        wake_at_ms: waiting: when to decide again even if nobody writes the entry (the first
            lease ahead of it that expires, or when its own place must be renewed).
    """

    outcome: Outcome
    state: SlotState
    position: int = 0
    wake_at_ms: int | None = None


def queue_order(waiters: tuple[Holder, ...]) -> list[Holder]:
    """Waiters in the order slots go to them: scheduled time, then execution id."""
    return sorted(waiters, key=lambda w: (w.order_ms, w.execution_id))


def live(state: SlotState, now_ms: int) -> SlotState:
    """``state`` without the holders and waiters whose lease expired by ``now_ms``."""
    holders = tuple(h for h in state.holders if h.expires_at_ms > now_ms)
    waiters = tuple(w for w in state.waiters if w.expires_at_ms > now_ms)
    if len(holders) == len(state.holders) and len(waiters) == len(state.waiters):
        return state
    return msgspec.structs.replace(state, holders=holders, waiters=waiters)


def acquire(
    state: SlotState | None, request: SlotRequest, now_ms: int, lease_ms: int
) -> SlotDecision:
    """Decide whether ``request`` takes a slot now.

    Expired entries are dropped first. A run that already holds a slot (a redelivery of it, to
    this or another worker) keeps it, re-leased for ``request.worker_id``. Otherwise the run
    joins the queue (or renews its place) and takes a slot when fewer than ``max_concurrent``
    runs hold one and fewer than the free slots wait ahead of it. With policy ``skip`` a run that
    cannot take a slot at once is skipped and leaves no place in the queue.
    """
    base = SlotState(owner=request.owner, key=request.key) if state is None else state
    current = live(base, now_ms)
    me = request.execution_id
    limit = max(1, request.max_concurrent)
    expires = now_ms + lease_ms
    others = tuple(h for h in current.holders if h.execution_id != me)
    waiters = tuple(w for w in current.waiters if w.execution_id != me)
    held = len(others) < len(current.holders)
    mine = next((w for w in current.waiters if w.execution_id == me), None)
    entry = Holder(
        execution_id=me,
        worker_id=request.worker_id,
        order_ms=request.order_ms,
        since_ms=now_ms if mine is None else mine.since_ms,
        expires_at_ms=expires,
    )
    free = limit - len(others)
    ahead = [w for w in queue_order(waiters) if (w.order_ms, w.execution_id) < (entry.order_ms, me)]
    if held or (free > 0 and len(ahead) < free):
        if held:
            old = next(h for h in current.holders if h.execution_id == me)
            entry = msgspec.structs.replace(entry, since_ms=old.since_ms)
        new = msgspec.structs.replace(
            current, max_concurrent=limit, holders=(*others, entry), waiters=waiters
        )
        return SlotDecision(Outcome.ACQUIRED, new)
    if request.policy == ConcurrencyPolicy.SKIP:
        return SlotDecision(Outcome.SKIPPED, current)
    new = msgspec.structs.replace(current, max_concurrent=limit, waiters=(*waiters, entry))
    return SlotDecision(
        Outcome.WAITING, new, position=len(ahead), wake_at_ms=_wake_at(new, entry, lease_ms)
    )


def _wake_at(state: SlotState, me: Holder, lease_ms: int) -> int:
    """The first instant the decision for ``me`` can change without a write by anyone: a lease
    ahead of it expires, or its own place is due for renewal (a third of the lease left)."""
    renew_at = me.expires_at_ms - lease_ms // 3 * 2
    ahead = [h.expires_at_ms for h in state.holders] + [
        w.expires_at_ms
        for w in state.waiters
        if (w.order_ms, w.execution_id) < (me.order_ms, me.execution_id)
    ]
    return min([renew_at, *ahead])


def should_retry(state: SlotState | None, request: SlotRequest, now_ms: int, lease_ms: int) -> bool:
    """Whether a waiting run should try :func:`acquire` (and write) after seeing ``state``: it
    could take a slot now, or its place is missing or due for renewal. Waiters woken by every
    write of the entry call this first, so that a write does not make every waiter write."""
    if state is None:
        return True
    decision = acquire(state, request, now_ms, lease_ms)
    if decision.outcome != Outcome.WAITING:
        return True
    mine = next((w for w in state.waiters if w.execution_id == request.execution_id), None)
    return mine is None or mine.expires_at_ms - now_ms <= lease_ms * 2 // 3


def release(state: SlotState | None, execution_id: str, now_ms: int) -> SlotState | None:
    """``state`` without ``execution_id`` (holding or waiting) and without expired entries;
    None when the run is in neither (nothing to write)."""
    if state is None:
        return None
    holders = tuple(h for h in state.holders if h.execution_id != execution_id)
    waiters = tuple(w for w in state.waiters if w.execution_id != execution_id)
    if len(holders) == len(state.holders) and len(waiters) == len(state.waiters):
        return None
    return live(msgspec.structs.replace(state, holders=holders, waiters=waiters), now_ms)


def renew(state: SlotState | None, request: SlotRequest, now_ms: int, lease_ms: int) -> SlotState:
    """``state`` with the slot of ``request`` re-leased until ``now_ms + lease_ms``.

    A holder whose entry is gone (its lease expired while its worker could not reach NATS) is
    put back: the run is already running, and leaving it out would let one more run start.
    """
    base = SlotState(owner=request.owner, key=request.key) if state is None else state
    current = live(base, now_ms)
    old = next((h for h in current.holders if h.execution_id == request.execution_id), None)
    entry = Holder(
        execution_id=request.execution_id,
        worker_id=request.worker_id,
        order_ms=request.order_ms,
        since_ms=now_ms if old is None else old.since_ms,
        expires_at_ms=now_ms + lease_ms,
    )
    others = tuple(h for h in current.holders if h.execution_id != request.execution_id)
    return msgspec.structs.replace(current, holders=(*others, entry))


# --- what explain shows -----------------------------------------------------------------------


class ConcurrencyWait(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Why a run of a job with a concurrency key is (not) running, for ``explain``.

    Attributes:
        key: the rendered key.
        max_concurrent: its limit.
        running: execution ids holding a slot.
        waiting: execution ids in line, first first.
        position: the run's place in line (0-based), or None when it is not waiting.
        holding: the run holds a slot.
        reason: one sentence for a human.
    """

    key: str
    max_concurrent: int
    running: list[str]
    waiting: list[str]
    position: int | None = None
    holding: bool = False
    reason: str


def explain_wait(
    state: SlotState | None, key: str, max_concurrent: int, execution_id: str | None, now_ms: int
) -> ConcurrencyWait:
    """What the slots of ``key`` say about ``execution_id`` (None: about the key alone) at
    ``now_ms`` (expired leases are not counted)."""
    current = live(state, now_ms) if state is not None else None
    running = [h.execution_id for h in current.holders] if current else []
    waiting = [w.execution_id for w in queue_order(current.waiters)] if current else []
    limit = current.max_concurrent if current else max_concurrent
    holding = execution_id in running
    position = waiting.index(execution_id) if execution_id in waiting else None
    if holding:
        reason = f"holds one of the {limit} slot(s) of concurrency key {key!r}"
    elif position is not None:
        reason = (
            f"waiting for a slot of concurrency key {key!r}: {len(running)}/{limit} running, "
            f"{position} waiting ahead of it"
        )
    else:
        reason = f"concurrency key {key!r}: {len(running)}/{limit} running, {len(waiting)} waiting"
    return ConcurrencyWait(
        key=key,
        max_concurrent=limit,
        running=running,
        waiting=waiting,
        position=position,
        holding=holding,
        reason=reason,
    )


def skip_reason(key: str, max_concurrent: int) -> str:
    """The ``skipReason`` of a run skipped by ``concurrencyPolicy: skip``."""
    return f"{SKIP_REASON}: all {max_concurrent} slot(s) of key {key!r} were taken"
