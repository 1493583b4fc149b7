"""``GET /ws``: live status of a user's jobs over a WebSocket (RFC 6455).

Protocol (JSON text frames):

- authenticate with the upgrade request's ``Authorization: Bearer <token>`` header, or — for
  browsers, which cannot set it — with a first message ``{"type": "auth", "token": "<token>"}``
  within 5 seconds;
- subscribe: ``{"type": "subscribe", "jobIds": ["…"], "lastEventId": 123}`` — ``jobIds`` omitted
  for all of the user's jobs; ``lastEventId`` omitted for "from now", or the id of the last event
  received, to resume without a gap (events are kept ``JOBSCHED_STATUS_RETENTION_SECONDS``);
- the server answers ``{"type": "subscribed", "jobIds": …, "from": <first event id or null>}``
  then sends ``{"type": "event", "id": <event id>, "event": {…}}`` for every job and run
  transition, in order. The event id is the status stream's sequence: strictly increasing.

Each connection has its own JetStream ordered consumer on the user's subjects only
(``<prefix>.status.<user>.>``), so a user never receives another user's events, and a bounded
queue with its own writer: a client that falls ``max_buffer`` events behind is closed with code
4008 ("slow consumer") and never slows anybody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import WSMsgType, web

from bus.nats import Bus, Closeable
from core.errors import BusUnavailable, Unauthorized
from core.model import Event
from gateway.auth import user_from_authorization, user_from_token

log = logging.getLogger(__name__)

CLOSE_AUTH = 4001
CLOSE_BAD_REQUEST = 4000
CLOSE_SLOW = 4008
CLOSE_UNAVAILABLE = 1013


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
_event_decoder = msgspec.json.Decoder(Event)
_encoder = msgspec.json.Encoder()


class Outbound(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    type: Literal["event", "subscribed", "error"]
    id: int | None = None
    event: Any = None
    job_ids: list[str] | None = None
    from_id: int | None = msgspec.field(default=None, name="from")
    message: str | None = None


SEND_BUFFER_BYTES = 64 * 1024


async def websocket(
    request: web.Request,
    *,
    bus: Bus | None,
    secret: str,
    max_buffer: int = 1000,
    stall_s: float = 5.0,
) -> web.WebSocketResponse:
    """Serve one WebSocket connection (see module docstring)."""
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=64 * 1024)
    await ws.prepare(request)
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    if bus is None:
        await ws.close(code=CLOSE_UNAVAILABLE, message=b"live status needs NATS")
        return ws
    try:
        user, first = await _authenticate(request, ws, secret)
    except Unauthorized as e:
        await ws.close(code=CLOSE_AUTH, message=e.message.encode()[:120])
        return ws
    except (ValueError, msgspec.DecodeError, RecursionError, TimeoutError) as e:
        await ws.close(code=CLOSE_BAD_REQUEST, message=str(e).encode()[:120])
        return ws
    connection = _Connection(ws, bus, user, max_buffer, stall_s, request.transport)
    await connection.serve(first)
    return ws


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
    return user_from_token(first.token, secret), None


class _SlowConsumer(Exception):
    """Raised to end a connection whose client stopped taking events."""


class _Connection:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        bus: Bus,
        user: str,
        max_buffer: int,
        stall_s: float,
        transport: asyncio.BaseTransport | None,
    ) -> None:
        self.ws = ws
        self.transport = transport
        self.stall_s = stall_s
        self.bus = bus
        self.user = user
        self.queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=max_buffer)
        self.overflow = asyncio.Event()
        self.job_ids: set[str] | None = None
        self.subscription: Closeable | None = None

    async def serve(self, first: SubscribeMessage | None) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                writer = tg.create_task(self._write(), name=f"ws[{self.user}] writer")
                watchdog = tg.create_task(self._watch_overflow(), name=f"ws[{self.user}] overflow")
                try:
                    if first is not None:
                        await self._subscribe(first)
                    await self._read()
                finally:
                    writer.cancel()
                    watchdog.cancel()
        except* _SlowConsumer:
            pass
        finally:
            if self.subscription is not None:
                await self.subscription.close()
            if not self.ws.closed and not self.overflow.is_set():
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

    async def _subscribe(self, message: SubscribeMessage) -> None:
        if self.subscription is not None:
            await self.subscription.close()
            self.subscription = None
        self.job_ids = set(message.job_ids) if message.job_ids is not None else None
        start = (message.last_event_id + 1) if message.last_event_id is not None else None
        try:
            self.subscription = await self.bus.follow_events(self.user, start, self._on_event)
        except BusUnavailable as e:
            await self.ws.close(code=CLOSE_UNAVAILABLE, message=e.message.encode()[:120])
            return
        await self._send(Outbound(type="subscribed", job_ids=message.job_ids, from_id=start))

    async def _on_event(self, seq: int, data: bytes) -> None:
        if self.job_ids is not None:
            try:
                event = _event_decoder.decode(data)
            except msgspec.DecodeError:
                return
            if event.job_id not in self.job_ids:
                return
        if self.overflow.is_set():
            return
        try:
            async with asyncio.timeout(self.stall_s):
                await self.queue.put((seq, data))
        except TimeoutError:
            self.overflow.set()

    async def _write(self) -> None:
        while True:
            seq, data = await self.queue.get()
            frame = b'{"type":"event","id":%d,"event":%s}' % (seq, data)
            try:
                async with asyncio.timeout(self.stall_s):
                    await self.ws.send_str(frame.decode())
            except TimeoutError:
                self.overflow.set()
                return

    async def _watch_overflow(self) -> None:
        """Close a slow consumer; its connection ends, and the events it did not take are not
        sent (it reconnects with its last event id). Buffered data and the close frame still
        reach it if it ever reads."""
        await self.overflow.wait()
        log.info("closing the WebSocket of %s: slow consumer", self.user)
        try:
            async with asyncio.timeout(self.stall_s):
                await self.ws.close(
                    code=CLOSE_SLOW,
                    message=b"slow consumer: buffer overflowed; reconnect with lastEventId",
                )
        except (TimeoutError, ConnectionResetError):
            if self.transport is not None:
                self.transport.close()  # graceful: what is buffered, close frame included, is sent
        raise _SlowConsumer

    async def _send(self, message: Outbound) -> None:
        with contextlib.suppress(ConnectionResetError):
            await self.ws.send_str(_encoder.encode(message).decode())
