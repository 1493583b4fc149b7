"""``GET /ws``: live status of a user's jobs over a WebSocket (RFC 6455).

Protocol (JSON text frames):

- authenticate with the upgrade request's ``Authorization: Bearer <token>`` header, or — for
  browsers, which cannot set it — with a first message ``{"type": "auth", "token": "<token>"}``
  within 5 seconds, which the server acknowledges with ``{"type": "authenticated", "user": …}``;
  no auth message in time closes with 4000, a bad token with 4001;
- subscribe: ``{"type": "subscribe", "jobIds": ["…"], "lastEventId": 123}`` — ``jobIds`` omitted
  for all of the user's jobs; ``lastEventId`` omitted for "from now", or the id of the last event
  received, to resume without a gap (events are kept ``JOBSCHED_STATUS_RETENTION_SECONDS``);
- the server answers ``{"type": "subscribed", "jobIds": …, "from": <first event id or null>}``
  then sends ``{"type": "event", "id": <event id>, "event": {…}}`` for every job and run
  transition, in order. The event id is the status stream's sequence: strictly increasing.

Flow: the process reads the status stream once (:class:`gateway.live.LiveStatus`, on the
gateway's own live-status NATS connection) and hands each event to the connections of its user
only (by the subject's user token), so a user never receives another user's events. Each
connection has a bounded outbox (``max_buffer`` frames) drained by its own writer task. A
connection that resumes from a ``lastEventId``, or whose outbox is full when a live event comes,
*catches up*: it reads its own events from the stream in batches of at most
:data:`gateway.live.REPLAY_BATCH_EVENTS`, the next only once its writer has sent half of the
last, each read holding one of the process's ``replay_concurrency`` replay slots, and then
rejoins the live feed without a gap or a duplicate (:class:`Follower`). So a client is served at
its own pace and never costs the process more than its outbox; a client that takes nothing for
``stall_seconds`` seconds while events wait for it is closed with code 4008 ("slow consumer";
reconnect with the last event id), and nobody else is slowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import socket
import weakref
from collections import deque
from typing import Annotated, Any, Literal, Protocol

import msgspec
from aiohttp import WSMsgType, web

from core.errors import BusUnavailable, Unauthorized
from core.ids import owner_key
from core.live import EventBatch, StoredEvent
from gateway.auth import user_from_authorization, user_from_token
from gateway.live import REPLAY_BATCH_EVENTS, LiveStatus

log = logging.getLogger(__name__)

CLOSE_AUTH = 4001
CLOSE_BAD_REQUEST = 4000
CLOSE_SLOW = 4008
CLOSE_UNAVAILABLE = 1013
CLOSE_GOING_AWAY = 1001


class AuthMessage(msgspec.Struct, tag="auth", tag_field="type", forbid_unknown_fields=True):
    token: str


EventId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 2)]
"""A status stream sequence number, 0 to 2^63 - 2: the replay starts at the next one, which
must fit a signed 64-bit integer; no stream gets near it."""


class SubscribeMessage(
    msgspec.Struct,
    tag="subscribe",
    tag_field="type",
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    job_ids: list[str] | None = None
    last_event_id: EventId | None = msgspec.field(default=None)


ClientMessage = AuthMessage | SubscribeMessage
_client_decoder = msgspec.json.Decoder(ClientMessage)
_encoder = msgspec.json.Encoder()


class Outbound(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    type: Literal["event", "subscribed", "error", "authenticated"]
    user: str | None = None
    id: int | None = None
    event: Any = None
    job_ids: list[str] | None = None
    from_id: int | None = msgspec.field(default=None, name="from")
    message: str | None = None


_SUBJECT_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
"""A job id that can stand in a subject filter as it is (every id jobsched makes)."""

SEND_BUFFER_BYTES = 16 * 1024
"""The kernel's send buffer of a WebSocket (``SO_SNDBUF``; Linux doubles it). Small: it is what
a client that stopped reading absorbs before its writer blocks and the stall shows."""
WRITE_BUFFER_BYTES = 8 * 1024
"""Bytes a WebSocket's writer buffers in the process before it waits for the socket."""


def event_frame(event: StoredEvent) -> bytes:
    """The ``{"type": "event", "id": …, "event": …}`` frame of a stored event (UTF-8 JSON)."""
    return b'{"type":"event","id":%d,"event":%s}' % (event.seq, event.data)


class Outbox:
    """Frames waiting for one connection's writer: at most ``capacity`` (a bounded queue that
    also tells its producers when the writer took one)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._frames: deque[bytes] = deque()
        self._added = asyncio.Event()
        self._taken = asyncio.Event()

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def free(self) -> int:
        return self.capacity - len(self._frames)

    def put(self, frame: bytes) -> bool:
        """Append ``frame``; False (and nothing appended) when full."""
        if len(self._frames) >= self.capacity:
            return False
        self._frames.append(frame)
        self._added.set()
        return True

    def clear(self) -> None:
        self._frames.clear()

    async def get(self) -> bytes:
        """The oldest frame (waits for one)."""
        while not self._frames:
            self._added.clear()
            await self._added.wait()
        return self.take()

    def take(self) -> bytes:
        """The oldest frame; the outbox must not be empty."""
        self._taken.set()
        return self._frames.popleft()

    async def drained_to(self, size: int, stall_seconds: float) -> bool:
        """Wait until at most ``size`` frames are left; False if the writer took none for
        ``stall_seconds`` seconds meanwhile (a stalled client)."""
        while len(self._frames) > size:
            self._taken.clear()
            try:
                async with asyncio.timeout(stall_seconds):
                    await self._taken.wait()
            except TimeoutError:
                return False
        return True


class LiveSource(Protocol):
    """What a :class:`Follower` needs of :class:`gateway.live.LiveStatus`."""

    @property
    def position(self) -> int: ...

    async def replay(self, subject_filter: str, start_seq: int, *, batch: int) -> EventBatch: ...

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None: ...


class Stalled(Exception):
    """The client took no frame for ``stall_seconds`` seconds while events waited for it."""


class _Mode(enum.Enum):
    LIVE = "live"  # taking events from the feed
    CATCHING_UP = "catching up"  # reading from the stream; feed events ignored
    JOINING = "joining"  # caught up; feed events kept in the tail until the switch


class Follower:
    """One subscription's events, in order, without gap or duplicate, at the client's pace.

    ``cursor`` is the first stream sequence not yet taken: every earlier event of the
    subscription is in the outbox or sent. Live, the feed's events are appended as they come
    (:meth:`offer`); one that finds the outbox full switches to catching up from it. Catching up
    reads the stream from ``cursor`` (:meth:`run`) until the server that answered has nothing
    more, then joins the feed: it notes the feed's position ``P`` and, from that instant, keeps
    the feed's events in a tail; the stream's leader confirms there is nothing from ``cursor``
    up to at least ``P`` (else it goes on reading), and the tail — the events after ``P`` — goes
    into the outbox before the feed's next event. Every event up to ``P`` was stored before the
    leader was asked, every later one passes through the feed after the tail began: none is
    missed, none sent twice.

    Args:
        live: the process's feed position and replay reads.
        outbox: the connection's outbox (``capacity`` = ``JOBSCHED_WS_BUFFER_EVENTS``).
        subject_filter: the subscription's subject (one job's, or all of the user's).
        job_ids: the subscription's jobs; None for all of the user's.
        start: the first event id to send; None for "from now".
        stall_seconds: see :class:`Stalled`.
    """

    def __init__(
        self,
        live: LiveSource,
        outbox: Outbox,
        *,
        subject_filter: str,
        job_ids: set[str] | None,
        start: int | None,
        stall_seconds: float,
    ) -> None:
        self.live = live
        self.outbox = outbox
        self.subject_filter = subject_filter
        self.job_ids = job_ids
        self.stall_seconds = stall_seconds
        self.read_ahead = max(1, min(outbox.capacity, REPLAY_BATCH_EVENTS))
        self._tail: list[StoredEvent] = []
        self._tail_overflowed = False
        self._catch_up = asyncio.Event()
        if start is None:
            self.cursor = live.position + 1
            self.mode = _Mode.LIVE
        else:
            self.cursor = start
            self._start_catching_up()

    def offer(self, event: StoredEvent) -> None:
        """An event of this user from the feed (see class docstring); never blocks."""
        if self.mode is _Mode.LIVE:
            if event.seq < self.cursor:
                return
            unwanted = self.job_ids is not None and event.job_id not in self.job_ids
            if unwanted or self.outbox.put(event_frame(event)):
                self.cursor = event.seq + 1
            else:
                self._start_catching_up()
        elif self.mode is _Mode.JOINING:
            if len(self._tail) < self.outbox.capacity:
                self._tail.append(event)
            else:
                self._tail_overflowed = True

    def _start_catching_up(self) -> None:
        self.mode = _Mode.CATCHING_UP
        self._catch_up.set()

    @property
    def catching_up(self) -> bool:
        return self.mode is not _Mode.LIVE

    async def run(self) -> None:
        """Catch up whenever needed, until cancelled.

        Raises:
            Stalled: the client took nothing for ``stall_seconds`` seconds while catching up.
            BusUnavailable: a replay read failed (the client reconnects with its last id).
        """
        while True:
            await self._catch_up.wait()
            self._catch_up.clear()
            await self._catch_up_and_join()

    async def _catch_up_and_join(self) -> None:
        while True:
            if not await self.outbox.drained_to(self.read_ahead // 2, self.stall_seconds):
                raise Stalled
            batch = await self.live.replay(
                self.subject_filter, self.cursor, batch=self.read_ahead - len(self.outbox)
            )
            if not all(self._take(event) for event in batch.events) or batch.more:
                continue
            self.mode, self._tail, self._tail_overflowed = _Mode.JOINING, [], False
            position = self.live.position
            missed = await self.live.next_on_leader(self.subject_filter, self.cursor)
            if missed is not None:  # the replica that answered lags behind the leader
                self.mode, self._tail = _Mode.CATCHING_UP, []
                if not await self.outbox.drained_to(self.outbox.capacity - 1, self.stall_seconds):
                    raise Stalled
                self._take(missed)
                continue
            self.cursor = max(self.cursor, position + 1)
            tail = [e for e in self._tail if e.seq >= self.cursor]
            if self._tail_overflowed or len(tail) > self.outbox.free:
                self.mode, self._tail = _Mode.CATCHING_UP, []
                continue
            self._tail = []
            if all(self._take(event) for event in tail):
                self.mode = _Mode.LIVE
                return
            self.mode = _Mode.CATCHING_UP

    def _take(self, event: StoredEvent) -> bool:
        """Append an event read from the stream, unless the outbox is full (reads ask for no
        more than it holds, so only a bug fills it): then False, and ``cursor`` stays on it."""
        if event.seq < self.cursor:
            return True
        wanted = self.job_ids is None or event.job_id in self.job_ids
        if wanted and not self.outbox.put(event_frame(event)):
            return False
        self.cursor = event.seq + 1
        return True


async def websocket(
    request: web.Request,
    *,
    live: LiveStatus,
    secret: str,
    max_buffer: int = 1000,
    stall_seconds: float = 5.0,
    sockets: weakref.WeakSet[web.WebSocketResponse] | None = None,
) -> web.WebSocketResponse:
    """Serve one WebSocket connection (see module docstring); it joins ``sockets``, the
    connections :func:`close_all` closes when the gateway shuts down."""
    ws = web.WebSocketResponse(
        heartbeat=20.0, max_msg_size=64 * 1024, writer_limit=WRITE_BUFFER_BYTES
    )
    await ws.prepare(request)
    if sockets is not None:
        sockets.add(ws)
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    if isinstance(transport, asyncio.WriteTransport):
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
    if live.stream is None:
        await ws.close(code=CLOSE_UNAVAILABLE, message=b"live status needs NATS")
        return ws
    try:
        user, first = await _authenticate(request, ws, secret)
    except Unauthorized as e:
        await ws.close(code=CLOSE_AUTH, message=e.message.encode()[:120])
        return ws
    except TimeoutError:
        message = b'no {"type": "auth", "token": ...} within 5 s'
        await ws.close(code=CLOSE_BAD_REQUEST, message=message)
        return ws
    except (ValueError, msgspec.DecodeError, RecursionError) as e:
        await ws.close(code=CLOSE_BAD_REQUEST, message=str(e).encode()[:120])
        return ws
    connection = _Connection(ws, live, user, max_buffer, stall_seconds, request.transport)
    live.metrics.ws_connections.inc()
    try:
        await connection.serve(first)
    finally:
        live.metrics.ws_connections.dec()
    return ws


async def close_all(sockets: weakref.WeakSet[web.WebSocketResponse]) -> None:
    """Close every open connection with 1001 Going Away (RFC 6455 §7.4.1): a gateway that
    stops tells its clients to reconnect (to another gateway, with their last event id) at
    once, instead of holding its shutdown until they leave."""
    open_ = [ws for ws in list(sockets) if not ws.closed]
    await asyncio.gather(
        *(ws.close(code=CLOSE_GOING_AWAY, message=b"gateway shutting down") for ws in open_),
        return_exceptions=True,
    )


async def _authenticate(
    request: web.Request, ws: web.WebSocketResponse, secret: str
) -> tuple[str, SubscribeMessage | None]:
    """The user, and the subscribe message if it came first (header auth)."""
    header = request.headers.get("Authorization")
    if header:
        return user_from_authorization(header, secret), None
    async with asyncio.timeout(5):
        msg = await ws.receive()
    if msg.type != WSMsgType.TEXT:
        raise Unauthorized('send {"type": "auth", "token": …} first')
    first = _client_decoder.decode(msg.data)
    if not isinstance(first, AuthMessage):
        raise Unauthorized('send {"type": "auth", "token": …} first')
    user = user_from_token(first.token, secret)
    await ws.send_str(_encoder.encode(Outbound(type="authenticated", user=user)).decode())
    return user, None


class _SlowConsumer(Exception):
    """Raised to end a connection whose client stopped taking events."""


class _Connection:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        live: LiveStatus,
        user: str,
        max_buffer: int,
        stall_seconds: float,
        transport: asyncio.BaseTransport | None,
    ) -> None:
        self.ws = ws
        self.transport = transport
        self.stall_seconds = stall_seconds
        self.live = live
        self.user = user
        self.owner_key = owner_key(user)
        self.outbox = Outbox(max_buffer)
        self.overflow = asyncio.Event()
        self.follower: Follower | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._tg: asyncio.TaskGroup | None = None

    async def serve(self, first: SubscribeMessage | None) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                writer = tg.create_task(self._write(), name=f"ws[{self.user}] writer")
                watchdog = tg.create_task(
                    self._watch_overflow(writer), name=f"ws[{self.user}] overflow"
                )
                try:
                    if first is not None:
                        await self._subscribe(first)
                    await self._read()
                finally:
                    self._unfollow()
                    writer.cancel()
                    watchdog.cancel()
        except* _SlowConsumer:
            pass
        finally:
            self._unfollow()
            if not self.ws.closed and not self.overflow.is_set():
                with contextlib.suppress(ConnectionError):
                    await self.ws.close()

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                message = _client_decoder.decode(msg.data)
            except (msgspec.DecodeError, RecursionError) as e:
                await self._send(Outbound(type="error", message=f"bad message: {e}"))
                continue
            if isinstance(message, SubscribeMessage):
                await self._subscribe(message)
            else:  # an auth message on an authenticated connection: say so, change nothing
                text = f"already authenticated as {self.user!r}; open a new connection to switch"
                await self._send(Outbound(type="error", message=text))

    async def _subscribe(self, message: SubscribeMessage) -> None:
        self._unfollow()
        self.outbox.clear()
        try:
            await self.live.started()
        except BusUnavailable as e:
            with contextlib.suppress(ConnectionError):
                await self.ws.close(code=CLOSE_UNAVAILABLE, message=e.message.encode()[:120])
            return
        assert self.live.stream is not None and self._tg is not None
        job_ids = message.job_ids
        start = (message.last_event_id + 1) if message.last_event_id is not None else None
        one_job = job_ids[0] if job_ids is not None and len(set(job_ids)) == 1 else None
        if one_job is not None and not _SUBJECT_TOKEN.fullmatch(one_job):
            one_job = None  # not an id jobsched makes: read all the user's events, filter here
        follower = Follower(
            self.live,
            self.outbox,
            subject_filter=self.live.stream.status_filter(self.user, one_job),
            job_ids=set(job_ids) if job_ids is not None else None,
            start=start,
            stall_seconds=self.stall_seconds,
        )
        subscribed = Outbound(type="subscribed", job_ids=job_ids, from_id=start)
        self.outbox.put(_encoder.encode(subscribed))
        self.follower = follower
        self.live.add(self.owner_key, follower)
        self._follow_task = self._tg.create_task(
            self._follow(follower), name=f"ws[{self.user}] catch-up"
        )

    def _unfollow(self) -> None:
        if self.follower is not None:
            self.live.discard(self.owner_key, self.follower)
            self.follower = None
        if self._follow_task is not None:
            self._follow_task.cancel()
            self._follow_task = None

    async def _follow(self, follower: Follower) -> None:
        try:
            await follower.run()
        except Stalled:
            self.overflow.set()
        except BusUnavailable as e:
            log.warning("live status of %s: %s", self.user, e)
            with contextlib.suppress(ConnectionError):
                await self.ws.close(code=CLOSE_UNAVAILABLE, message=e.message.encode()[:120])

    async def _write(self) -> None:
        """Send the outbox's frames; a send that cannot finish within ``stall_seconds`` (the socket
        took nothing) marks the client slow. The deadline moves on as frames go out, at most
        every quarter of ``stall_seconds``, so a busy connection does not arm a timer per frame."""
        loop = asyncio.get_running_loop()
        while True:
            frame = await self.outbox.get()
            try:
                async with asyncio.timeout(self.stall_seconds) as deadline:
                    armed = loop.time()
                    while True:
                        await self.ws.send_frame(frame, WSMsgType.TEXT)
                        if not self.outbox:
                            break
                        frame = self.outbox.take()
                        now = loop.time()
                        if now - armed > self.stall_seconds / 4:
                            deadline.reschedule(now + self.stall_seconds)
                            armed = now
            except TimeoutError:
                self.overflow.set()
                return
            except ConnectionError:  # the client is gone; the read loop ends the connection
                return

    async def _watch_overflow(self, writer: asyncio.Task[None]) -> None:
        """Close a slow consumer; its connection ends, and the events it did not take are not
        sent (it reconnects with its last event id). Buffered data and the close frame still
        reach it if it ever reads.

        aiohttp 3.14 shares one future among the sends waiting for the socket to drain and
        keeps it once a waiting send was cancelled (the writer's stall timeout), so the close's
        wait may end at once with that future's ``CancelledError``: the close frame is then in
        the transport's buffer, and the transport is closed as after a timeout.
        """
        await self.overflow.wait()
        self.live.metrics.ws_slow_consumers.inc()
        log.info("closing the WebSocket of %s: slow consumer", self.user)
        writer.cancel()
        await asyncio.wait([writer])
        try:
            async with asyncio.timeout(self.stall_seconds):
                await self.ws.close(
                    code=CLOSE_SLOW,
                    message=b"slow consumer: buffer overflowed; reconnect with lastEventId",
                )
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this task is being cancelled: not the drain's stale future
            if self.transport is not None:
                self.transport.close()  # graceful: what is buffered, close frame included, is sent
        raise _SlowConsumer

    async def _send(self, message: Outbound) -> None:
        with contextlib.suppress(ConnectionError):
            await self.ws.send_str(_encoder.encode(message).decode())
