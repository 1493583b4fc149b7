"""The NATS adapter: connection, JetStream streams and consumers, subjects.

Layout (``<p>`` = ``subject_prefix``, ``<P>`` = the same for stream names):

======================================  =========================================================
``<p>.work.<queue>.<run-key>``          due runs (:class:`RunMessage`); stream ``<P>_WORK``,
                                        WorkQueue retention, file storage, ``Nats-Msg-Id`` =
                                        execution id; durable pull consumer ``workers-<queue>``
                                        per queue (filter ``<p>.work.<queue>.>``), shared by all
                                        workers of the queue. ``<run-key>`` is a hash of the
                                        execution id, so whether a run's message is still in the
                                        stream is one "last message by subject" lookup.
``<p>.status.<owner-key>.<job-id>``     execution transitions (:class:`StatusEvent`) and job
                                        changes (:class:`JobEvent`); stream ``<P>_STATUS``, limits
                                        retention (``max_age``), ``allow_direct`` (replays, see
                                        :mod:`bus.status`); durable pull consumer ``recorder``
                                        writes them to the store.
``<p>.notify.<partition>``              core NATS: a job was created or changed
                                        (:class:`JobNotice`), for the partition's scheduler.
======================================  =========================================================

Everything here is checked against nats-server 2.12, the oldest supported: WorkQueue retention,
``Nats-Msg-Id`` de-duplication, pull consumers, ``-NAK`` with a delay (ADR-15, server 2.7.1+),
``+WPI`` in-progress acks, ``+TERM``. Batches of runs, of events and of a worker's status
reports of at least ``ATOMIC_BATCH_MIN`` messages are published as one atomic batch (ADR-50,
nats-server 2.12+, ``allow_atomic`` on both streams; de-duplication in a batch 2.12.1+): one
PubAck per batch instead of one per message; smaller batches are pipelined (cheaper for them),
and where a batch is refused (a stream without ``allow_atomic``, nats-server 2.12.0's refusal of
``Nats-Msg-Id`` in a batch, a duplicate in the batch) it is published message by message, as
before. No nats exception escapes this package: failures surface as
:class:`core.errors.BusUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client, Srv
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue

from bus.tls import verifying_context, wants_tls
from core.errors import BusUnavailable, ConsumerMissing
from core.ids import dead_letter_id, job_event_msg_id, owner_key, run_key, status_msg_id
from core.model import Event, JobEvent, JobNotice, RunMessage, RunsFinished, StatusEvent

if TYPE_CHECKING:
    from bus.auth import Credentials

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
RECONNECT_WAIT_SECONDS = 0.5
DRAIN_TIMEOUT_SECONDS = 5
"""How long ``Bus.close`` lets subscriptions drain before it closes anyway (seconds)."""
RUN_LOOKUP_CONCURRENCY = 64
"""Message lookups in flight at once in ``Bus.runs_in_stream``."""
RECORDER_CONSUMER = "recorder"
"""Durable pull consumer of the status stream that the recorders share."""
ATOMIC_BATCH_MAX = 1000
"""Most messages in one atomic batch publish (nats-server's limit, ADR-50)."""
ATOMIC_BATCH_MIN = 16
"""Fewest messages published as an atomic batch; smaller batches are pipelined. An atomic batch
costs nats-server about 2 ms of CPU on its own (measured 2026-12-03, nats-server 2.15.1: 660 µs
per message in batches of 4 against 114 µs pipelined) and saves the client about 100 µs per
message: from about 16 messages on it costs less CPU in all (bench/README.md)."""
ATOMIC_NOT_ENABLED = 10174
"""JetStream error code: atomic batch publish is not enabled on the stream."""
ATOMIC_UNSUPPORTED_HEADER = 10177
"""JetStream error code: a header not allowed in an atomic batch; nats-server 2.12.0 answers it
for ``Nats-Msg-Id`` (de-duplication in a batch came with 2.12.1), at the batch's commit."""
PUBACK_WAIT_SECONDS = 5.0
"""How long the PubAcks of a pipelined publish are awaited, for the whole batch (seconds)."""
BATCH_ID, BATCH_SEQUENCE, BATCH_COMMIT = "Nats-Batch-Id", "Nats-Batch-Sequence", "Nats-Batch-Commit"

run_encoder = msgspec.json.Encoder()
notice_decoder = msgspec.json.Decoder(JobNotice)
finished_decoder = msgspec.json.Decoder(RunsFinished)


@dataclass(frozen=True, slots=True)
class BusConfig:
    """What the adapter needs from the settings.

    Attributes:
        servers: NATS server URLs.
        prefix: first subject token and stream-name prefix.
        ack_wait_seconds: ack wait of the work consumers (seconds).
        recorder_ack_wait_seconds: ack wait of the recorder's consumer of the status stream
            (seconds): a batch of events not acknowledged this long after its delivery (nor kept
            by an in-progress ack) is delivered again, to any recorder.
        max_deliver: max deliveries of the work consumers.
        duplicate_window_seconds: de-duplication window of the work stream (seconds).
        status_retention_seconds: max age of status events (seconds).
        replicas: stream replicas (1 for a single server, 3 in a cluster).
        credentials: the NATS user of this connection (:mod:`bus.auth`); None: anonymous.
            Its replies arrive on its own inbox prefix ``_INBOX_<user>``.
        tls: the client's TLS context (:func:`bus.tls.client_context`: the CAs that verify the
            servers, a client certificate). None: TLS only for ``tls://`` URLs, against the
            system's trust store. Either way a connection that wants TLS (:attr:`wants_tls`)
            is refused by a server that does not require it, before anything is sent.
    """

    servers: list[str]
    prefix: str = "jobsched"
    ack_wait_seconds: float = 30.0
    recorder_ack_wait_seconds: float = 30.0
    max_deliver: int = 20
    duplicate_window_seconds: float = 120.0
    status_retention_seconds: float = 86400.0
    replicas: int = 1
    credentials: Credentials | None = None
    tls: ssl.SSLContext | None = None

    @property
    def wants_tls(self) -> bool:
        return wants_tls(self.servers, self.tls)

    @property
    def work_stream(self) -> str:
        """Name of the work stream (``JOBSCHED_WORK``); KEDA's ``nats-jetstream`` trigger names
        it too (``deploy/kubernetes/keda/``, checked by ``tests/test_kubernetes.py``)."""
        return f"{self.prefix.upper()}_WORK"

    @property
    def status_stream(self) -> str:
        return f"{self.prefix.upper()}_STATUS"

    def work_subject(self, queue: str, execution_id: str) -> str:
        return f"{self.prefix}.work.{queue}.{run_key(execution_id)}"

    def work_filter(self, queue: str) -> str:
        return f"{self.prefix}.work.{queue}.>"

    def status_subject(self, owner: str, job_id: str) -> str:
        return f"{self.prefix}.status.{owner_key(owner)}.{job_id}"

    def status_filter(self, owner: str, job_id: str | None = None) -> str:
        """The subject of ``owner``'s events: of one job, or of all (``<p>.status.<key>.>``)."""
        return self.status_subject(owner, job_id or ">")

    def notify_subject(self, partition: int) -> str:
        return f"{self.prefix}.notify.{partition}"

    @staticmethod
    def work_consumer(queue: str) -> str:
        """Durable name of the pull consumer that every worker of ``queue`` shares; KEDA's
        trigger of the queue names it (see :attr:`work_stream`)."""
        return f"workers-{queue}"


class translated:  # lower case: used like a function, ``with translated("publish"):``
    """Context manager turning NATS client errors into :class:`BusUnavailable` naming ``what``
    failed (a class, not a generator: it wraps every publish and ack)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, nats.errors.Error | TimeoutError | ConnectionError | OSError):
            raise BusUnavailable(f"NATS: {self.what} failed: {type(exc).__name__}: {exc}") from exc


class Delivery:
    """One message delivered by a pull consumer, with its acknowledgement verbs."""

    __slots__ = ("_msg",)

    def __init__(self, msg: Msg) -> None:
        self._msg = msg

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def sequences(self) -> tuple[int, int]:
        """(consumer sequence, stream sequence) of this delivery (from its ``$JS.ACK`` reply)."""
        sequence = self._msg.metadata.sequence
        return int(sequence.consumer), int(sequence.stream)

    @property
    def msg_id(self) -> str | None:
        return (self._msg.headers or {}).get(MSG_ID)

    @property
    def num_delivered(self) -> int:
        """1 for the first delivery, +1 for each redelivery (ack-wait expiry or nak)."""
        return int(self._msg.metadata.num_delivered)

    @property
    def stored_id(self) -> str:
        """``<stream>:<stream sequence>:<stored at, ms since the epoch>``: the identity of the
        stored message, the same on every redelivery (and not reused by a re-created stream,
        whose sequences start again)."""
        md = self._msg.metadata
        return dead_letter_id(md.stream, md.sequence.stream, int(md.timestamp.timestamp() * 1000))

    async def ack(self) -> None:
        with translated("ack"):
            await self._msg.ack()

    async def nak(self, delay_seconds: float | None = None) -> None:
        """Negative ack; redeliver after ``delay_seconds`` seconds (``-NAK {"delay": ns}``)."""
        with translated("nak"):
            await self._msg.nak(delay=delay_seconds)

    async def in_progress(self) -> None:
        """``+WPI``: reset the ack-wait timer of this message."""
        with translated("in-progress ack"):
            await self._msg.in_progress()

    async def term(self) -> None:
        """``+TERM``: never redeliver this message."""
        with translated("term"):
            await self._msg.term()


class PullConsumer:
    """Continuous pull from a durable consumer (the JetStream pull protocol, ADR-13).

    nats-py's ``fetch(n)`` waits until ``n`` messages arrived or its timeout passed, which would
    hold a lone run back for the whole timeout. This keeps one pull request of at most the
    caller's free capacity outstanding on a private inbox and hands each message over as soon
    as it arrives.

    Args:
        nc: the connection.
        next_subject: ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``.
        expires_seconds: life of one pull request on the server (seconds).
    """

    def __init__(self, nc: Client, next_subject: str, *, expires_seconds: float = 1.0) -> None:
        self._nc = nc
        self._next_subject = next_subject
        self._expires_s = expires_seconds
        self._inbox = nc.new_inbox()
        self._ready: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Subscription | None = None
        self._request = 0
        self._remaining = 0
        self._request_deadline = 0.0
        self._reconnects = 0
        self._missing = False
        self._changed = asyncio.Event()

    async def start(self) -> None:
        with translated("subscribe pull inbox"):
            self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        status = (msg.headers or {}).get("Status") if not msg.data else None
        if status is None:
            self._ready.put_nowait(msg)
            self._remaining = max(0, self._remaining - 1)
            self._changed.set()
            return
        if status == "100":
            return
        if msg.subject.endswith(f".{self._request}"):
            self._remaining = 0
            self._changed.set()
        if status == "503":
            self._missing = True
            self._changed.set()
            return
        if status not in ("404", "408"):
            log.warning("pull request ended: %s %s", status, (msg.headers or {}).get("Description"))

    async def fetch(self, batch: int, timeout_seconds: float) -> list[Delivery]:
        """Up to ``batch`` messages; waits up to ``timeout_seconds`` seconds for the first.
        [] on timeout.

        ``batch`` must be the caller's free capacity: messages handed out are the caller's to
        acknowledge.

        Raises:
            BusUnavailable: when the pull request cannot be sent.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while self._ready.empty():
            if self._missing:
                self._missing = False
                raise ConsumerMissing("the consumer does not exist (stream or consumer deleted)")
            reconnects = int(self._nc.stats["reconnects"])
            stale = reconnects != self._reconnects or loop.time() > self._request_deadline
            if self._remaining == 0 or stale:
                self._reconnects = reconnects
                await self._pull(batch)
            left = deadline - loop.time()
            if left <= 0:
                return []
            self._changed.clear()
            if not self._ready.empty():
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, self._request_deadline - loop.time())):
                    await self._changed.wait()
        out: list[Delivery] = []
        while len(out) < batch and not self._ready.empty():
            out.append(Delivery(self._ready.get_nowait()))
        return out

    async def _pull(self, batch: int) -> None:
        self._request += 1
        self._remaining = batch
        self._request_deadline = asyncio.get_running_loop().time() + self._expires_s + 1.0
        req = {"batch": batch, "expires": int(self._expires_s * 1e9)}
        with translated("pull request"):
            await self._nc.publish(
                self._next_subject, msgspec.json.encode(req), reply=f"{self._inbox}.{self._request}"
            )

    async def quiesce(self) -> int:
        """Stop taking messages: wait until the outstanding pull request ended (JetStream cannot
        cancel one) and hand back (nak) whatever it still delivers. How many were handed back."""
        handed_back = 0
        loop = asyncio.get_running_loop()
        while self._remaining > 0 and loop.time() < self._request_deadline:
            try:
                async with asyncio.timeout(
                    min(0.1, max(0.0, self._request_deadline - loop.time()))
                ):
                    msg = await self._ready.get()
            except TimeoutError:
                continue
            with contextlib.suppress(BusUnavailable):
                await Delivery(msg).nak()
            handed_back += 1
        for d in self.take_unprocessed():
            with contextlib.suppress(BusUnavailable):
                await d.nak()
            handed_back += 1
        self._remaining = 0
        return handed_back

    def take_unprocessed(self) -> list[Delivery]:
        """Messages received but not handed out (to hand back on shutdown)."""
        out = []
        while not self._ready.empty():
            out.append(Delivery(self._ready.get_nowait()))
        return out

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except (nats.errors.Error, ValueError):
                log.debug("unsubscribe after connection loss", exc_info=True)


_WHITESPACE = re.compile(r"\s")


class _TcpTransport(TcpTransport):
    """nats-py 2.16's TCP transport, closeable after a failed TLS upgrade.

    ``asyncio``'s ``start_tls`` closes the socket when the handshake fails (a certificate that
    does not verify), but the plain stream's protocol is no longer the socket's and never hears
    of it, so the client's close, which waits for that stream, would wait forever. After a
    failure this forgets the plain stream (its socket is closed), so closing returns at once.
    """

    async def connect_tls(
        self,
        uri: Any,
        ssl_context: ssl.SSLContext,
        buffer_size: int,
        connect_timeout: int,
    ) -> None:
        try:
            await super().connect_tls(uri, ssl_context, buffer_size, connect_timeout)
        except BaseException:
            writer, self._io_writer, self._io_reader = self._io_writer, None, None
            if writer is not None:
                writer.transport.abort()
            raise


class NatsClient(Client):
    """nats-py's client with four fixes.

    - A PONG for a cancelled flush is skipped instead of fatal. nats-py 2.16 answers each PONG by
      setting the result of the oldest waiting flush future. When that flush was cancelled (a
      cancelled task: a shutdown, a NATS micro service whose start was interrupted, a
      subscription drain) its future is already done, ``set_result`` raises
      ``InvalidStateError`` and the client's read loop dies: nothing more is read, and
      ``drain()`` then waits out its timeout. nats-py guards the same case in its flusher
      (nats-io/nats.py#624) but not here. This consumes the PONG for the cancelled flush.
    - Message headers are parsed in a few microseconds instead of tens: nats-py 2.16 checks each
      header name for whitespace character by character in a generator, which made header
      parsing most of the cost of a message with JetStream headers (a replay read's Direct Get
      answers carry seven). Same result for every input (``tests/bus/test_nats.py``).
    - A client given a TLS context never talks plain text. nats-py 2.16 upgrades to TLS only
      when the server's ``INFO`` says ``tls_required``, so a server without TLS, or a man in
      the middle who removes the flag, would receive ``CONNECT`` with the password in the
      clear. This refuses such a server (``SecureConnWantedError``, "secure connection not
      available", as nats.go's ``ErrSecureConnWanted``) before anything is sent; on every
      reconnect too.
    - A failed TLS handshake does not hang the client (see :class:`_TcpTransport`).
    """

    async def _connect_to_server(self, s: Srv) -> None:
        await super()._connect_to_server(s)
        if type(self._transport) is TcpTransport:
            self._transport.__class__ = _TcpTransport

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        if initial_connection and "tls" in self.options and not info.get("tls_required"):
            raise nats.errors.SecureConnWantedError
        await super()._process_info(info, initial_connection)

    async def _process_pong(self) -> None:
        if self._pongs and self._pongs[0].done():
            self._pongs.pop(0)
            self._pongs_received += 1
            self._pings_outstanding = 0
            return
        await super()._process_pong()

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            try:
                key = name.strip().decode("ascii")
            except UnicodeDecodeError:
                continue
            if _WHITESPACE.search(key):
                continue
            out[key] = value.strip().decode("utf-8", "replace")
        return out


class Closeable:
    """A core-NATS subscription that can be closed without caring whether the connection lives."""

    def __init__(self, sub: Subscription) -> None:
        self._sub = sub

    async def close(self) -> None:
        try:
            await self._sub.unsubscribe()
        except (nats.errors.Error, ValueError):
            log.debug("unsubscribe after connection loss", exc_info=True)


class Bus:
    """One NATS connection with JetStream, and the operations jobsched makes on it.

    Args:
        config: subjects, streams and consumer settings.
        name: client name shown by the server (``jobsched-scheduler`` …).
        on_disconnect: called (no arguments) each time the connection is lost unexpectedly: a
            network failure, a server restart, or the server cutting a slow consumer.
    """

    def __init__(
        self,
        config: BusConfig,
        *,
        name: str = "jobsched",
        on_disconnect: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self._on_disconnect = on_disconnect
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self._atomic = True  # False once a stream said atomic batches are not enabled

    async def connect(self, *, timeout_seconds: float = 10.0) -> None:
        """Connect (retrying until ``timeout_seconds``), then keep reconnecting forever on loss.

        Raises:
            BusUnavailable: when no server answered within ``timeout_seconds`` seconds.
        """

        async def on_disconnect() -> None:
            self.connected.clear()
            if not self._closing:
                log.warning("NATS connection %s lost; reconnecting", self.name)
                if self._on_disconnect is not None:
                    self._on_disconnect()

        async def on_reconnect() -> None:
            self.connected.set()
            log.info("NATS reconnected to %s", self._nc.connected_url if self._nc else "?")

        errors: list[Exception] = []

        async def on_error(e: Exception) -> None:
            errors[:] = [e]
            log.warning("NATS error: %s", e)

        attempts = max(1, int(timeout_seconds / RECONNECT_WAIT_SECONDS))
        try:
            nc = await self._connect_once(attempts, on_disconnect, on_reconnect, on_error)
        except (nats.errors.Error, OSError, TimeoutError) as e:
            last = f" (last error: {type(errors[0]).__name__}: {errors[0]})" if errors else ""
            raise BusUnavailable(
                f"cannot connect to NATS at {', '.join(self.config.servers)}: {e}{last}"
            ) from e
        nc.options["max_reconnect_attempts"] = -1  # once connected, reconnect forever
        self._nc = nc
        self._js = nc.jetstream(timeout=5)
        self.connected.set()

    async def _connect_once(
        self,
        attempts: int,
        on_disconnect: Callable[[], Awaitable[None]],
        on_reconnect: Callable[[], Awaitable[None]],
        on_error: Callable[[Exception], Awaitable[None]],
    ) -> Client:
        """Connect, trying the servers up to ``attempts`` times (nats-py's own retry loop)."""
        nc = NatsClient()
        creds = self.config.credentials
        options: dict[str, Any] = {}
        if creds is not None:
            options = {"user": creds.user, "password": creds.password}
            options["inbox_prefix"] = creds.inbox_prefix
        if self.config.wants_tls:
            options["tls"] = self.config.tls or verifying_context()
        try:
            await nc.connect(
                **options,
                servers=self.config.servers,
                name=self.name,
                max_reconnect_attempts=attempts,
                reconnect_time_wait=RECONNECT_WAIT_SECONDS,  # type: ignore[arg-type]  # typed int, used as float s
                connect_timeout=2,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                error_cb=on_error,
                allow_reconnect=True,
                drain_timeout=DRAIN_TIMEOUT_SECONDS,
            )
        except BaseException:  # nats-py leaves the socket of a refused connection open
            with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
                await nc.close()
            raise
        return nc

    async def close(self) -> None:
        """Drain and close the connection (or just close it while it is down); idempotent."""
        nc, self._nc = self._nc, None
        self._closing = True
        if nc is None or nc.is_closed:
            return
        try:
            if nc.is_connected:
                await nc.drain()
                return
        except (nats.errors.Error, TimeoutError, OSError) as e:
            log.debug("drain failed (%s); closing", e)
        with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
            await nc.close()

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise BusUnavailable("NATS is not connected")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BusUnavailable("NATS is not connected")
        return self._js

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def key_value(
        self,
        name: str,
        *,
        what: str,
        ttl_seconds: float,
        replicas: int,
        create: bool,
        bind_first: bool = True,
    ) -> KeyValue:
        """The key-value bucket ``name`` (``what`` names it in errors: ``"slot bucket"``):
        bound if it exists; else, when ``create``, created with history 1, file storage,
        ``max_age`` ``ttl_seconds`` (seconds) and ``replicas``. ``bind_first=False`` creates
        straight away (idempotent for the same settings; a bucket of other settings is an
        error), for a bucket whose ``max_age`` is a protocol value (the lease TTL), not a
        clean-up horizon.

        Raises:
            BusUnavailable: NATS did not answer; or the bucket does not exist and this role
                may not create it (a scheduler creates it at start-up, :mod:`bus.auth`).
        """
        if bind_first or not create:
            with translated(f"open {what} {name}"):
                try:
                    return await self.js.key_value(name)
                except nats.js.errors.BucketNotFoundError:
                    if not create:
                        raise BusUnavailable(
                            f"{what} {name} does not exist yet (a scheduler creates it at start-up)"
                        ) from None
        with translated(f"create {what} {name}"):
            return await self.js.create_key_value(
                KeyValueConfig(
                    bucket=name,
                    history=1,
                    ttl=ttl_seconds,
                    storage=StorageType.FILE,
                    replicas=replicas,
                )
            )

    @property
    def cluster_name(self) -> str | None:
        """The NATS cluster the connected server belongs to (its INFO ``cluster``), or None
        for a lone server."""
        info = self._nc._server_info if self._nc is not None else {}
        return info.get("cluster") or None

    async def ping(self) -> None:
        """Round trip to the server and its JetStream API (one JetStream request, 2 s timeout).

        Raises:
            BusUnavailable: NATS or JetStream did not answer.
        """
        with translated("ping"):
            async with asyncio.timeout(2):
                await self.js.account_info()

    # --- streams and consumers -------------------------------------------------------------

    async def ensure_streams(self) -> None:
        """Create or update the work and status streams (idempotent)."""
        c = self.config
        work = StreamConfig(
            name=c.work_stream,
            subjects=[f"{c.prefix}.work.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            duplicate_window=c.duplicate_window_seconds,
            num_replicas=c.replicas,
            allow_atomic=True,
        )
        status = StreamConfig(
            name=c.status_stream,
            subjects=[f"{c.prefix}.status.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=c.status_retention_seconds,
            duplicate_window=min(120.0, c.status_retention_seconds),
            num_replicas=c.replicas,
            allow_direct=True,
            allow_atomic=True,
        )
        for cfg in (work, status):
            await self._ensure_stream(cfg)

    async def wait_for_streams(self, stop: asyncio.Event, *, interval_seconds: float = 1.0) -> bool:
        """Wait until the work and status streams exist (a scheduler creates them: the other
        roles may not, :mod:`bus.auth`), looking every ``interval_seconds`` seconds, having logged
        once what is missing. Returns True once they do, False if ``stop`` was set first.

        Raises:
            BusUnavailable: NATS did not answer a lookup.
        """
        c = self.config
        warned = False
        while not stop.is_set():
            missing = []
            for stream in (c.work_stream, c.status_stream):
                with translated(f"look up stream {stream}"):
                    try:
                        await self.js.stream_info(stream)
                    except nats.js.errors.NotFoundError:
                        missing.append(stream)
            if not missing:
                return True
            if not warned:
                log.warning(
                    "waiting for the streams %s: a scheduler creates them (`jobsched scheduler`)",
                    ", ".join(missing),
                )
                warned = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_seconds)
        return False

    async def _ensure_stream(self, cfg: StreamConfig) -> None:
        with translated(f"create stream {cfg.name}"):
            try:
                await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError:
                await self.js.update_stream(cfg)

    async def ensure_work_consumer(self, queue: str) -> None:
        """Create or update the durable pull consumer of ``queue`` (idempotent)."""
        c = self.config
        cfg = ConsumerConfig(
            durable_name=c.work_consumer(queue),
            filter_subject=c.work_filter(queue),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=c.ack_wait_seconds,
            max_deliver=c.max_deliver,
            max_ack_pending=20_000,
            max_waiting=512,
        )
        with translated(f"create consumer {cfg.durable_name}"):
            await self.js.add_consumer(c.work_stream, cfg)

    async def ensure_recorder_consumer(self, name: str = RECORDER_CONSUMER) -> None:
        """Create or update the recorders' durable pull consumer of the status stream
        (idempotent; an existing consumer takes the configured ack wait)."""
        c = self.config
        cfg = ConsumerConfig(
            durable_name=name,
            filter_subject=f"{c.prefix}.status.>",
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=c.recorder_ack_wait_seconds,
            max_ack_pending=20_000,
            max_waiting=512,
        )
        with translated(f"create consumer {name}"):
            await self.js.add_consumer(c.status_stream, cfg)

    async def work_consumer(self, queue: str) -> PullConsumer:
        """Bind to the durable consumer of ``queue`` (created if missing)."""
        await self.ensure_work_consumer(queue)
        return await self._pull_consumer(self.config.work_stream, self.config.work_consumer(queue))

    async def _pull_consumer(self, stream: str, durable: str) -> PullConsumer:
        consumer = PullConsumer(self.nc, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}")
        await consumer.start()
        return consumer

    async def recorder_consumer(self, name: str = RECORDER_CONSUMER) -> PullConsumer:
        await self.ensure_recorder_consumer(name)
        return await self._pull_consumer(self.config.status_stream, name)

    async def run_in_stream(self, queue: str, execution_id: str) -> bool:
        """Whether the work stream still holds the message of this run (queued, in progress or
        waiting for a retry); False once a worker acked or terminated it, or it was lost."""
        with translated("look up run message"):
            try:
                await self.js.get_last_msg(
                    self.config.work_stream, self.config.work_subject(queue, execution_id)
                )
            except nats.js.errors.NotFoundError:
                return False
        return True

    async def runs_in_stream(self, runs: Iterable[tuple[str, str]]) -> set[str]:
        """The execution ids among ``runs`` (``(queue, execution id)`` pairs) whose message the
        work stream still holds, as :meth:`run_in_stream`; at most ``RUN_LOOKUP_CONCURRENCY``
        direct-get requests are in flight at once, so a batch costs a few round trips, not one
        per run.

        Raises:
            BusUnavailable: a lookup failed; the batch's other lookups are cancelled first.
        """
        limit = asyncio.Semaphore(RUN_LOOKUP_CONCURRENCY)

        async def present(queue: str, execution_id: str) -> str | None:
            async with limit:
                return execution_id if await self.run_in_stream(queue, execution_id) else None

        lookups = [asyncio.ensure_future(present(q, e)) for q, e in runs]
        try:
            found = await asyncio.gather(*lookups)
        except BaseException:  # the first failure (BusUnavailable) ends the batch: no stragglers
            for lookup in lookups:
                lookup.cancel()
            await asyncio.gather(*lookups, return_exceptions=True)
            raise
        return {e for e in found if e is not None}

    async def consumer_backlog(self, stream: str, durable: str) -> int:
        """Messages of a consumer not yet delivered plus delivered and not yet acknowledged."""
        with translated(f"consumer info of {durable}"):
            info = await self.js.consumer_info(stream, durable)
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def status_last_seq(self) -> int:
        """Sequence of the newest event in the status stream."""
        with translated("status stream info"):
            info = await self.js.stream_info(self.config.status_stream)
        return int(info.state.last_seq or 0)

    async def recorder_ack_floor(self) -> int:
        """Stream sequence up to which the recorder has recorded every status event."""
        with translated("recorder consumer info"):
            info = await self.js.consumer_info(self.config.status_stream, RECORDER_CONSUMER)
        return int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0

    async def ensure_streams_quietly(self) -> None:
        """Re-create the streams if they were deleted (best effort, after a failed publish)."""
        try:
            await self.ensure_streams()
        except BusUnavailable as e:
            log.debug("cannot ensure streams now: %s", e)

    async def queue_depth(self, queue: str) -> int:
        """Runs waiting in ``queue``: not yet delivered plus delivered and not yet acknowledged."""
        return await self.consumer_backlog(
            self.config.work_stream, self.config.work_consumer(queue)
        )

    # --- publishing --------------------------------------------------------------------------

    async def publish_runs(self, runs: Sequence[RunMessage]) -> list[BusUnavailable | None]:
        """Publish due runs to their queues, pipelined; one result per run (None = stored).

        Each message carries ``Nats-Msg-Id`` = execution id, so a re-publish inside the duplicate
        window is acknowledged as a duplicate and not stored twice.
        """
        c = self.config
        batch = [
            (c.work_subject(r.queue, r.execution_id), run_encoder.encode(r), r.msg_id) for r in runs
        ]
        if await self._publish_atomic(batch):
            return [None] * len(runs)
        return await self._publish_pipelined(batch, "publish run")

    async def _publish_pipelined(
        self, batch: Sequence[tuple[str, bytes, str]], what: str
    ) -> list[BusUnavailable | None]:
        """Publish ``(subject, data, Nats-Msg-Id)`` messages with ``publish_async`` (all sent
        before the first PubAck is awaited); one result per message (None = stored).

        The PubAcks are awaited until one deadline, :data:`PUBACK_WAIT_SECONDS` after the last
        message went out, not that long each: PubAcks lost to a reconnect fail the whole batch
        within that time (nats-py resolves a ``publish_async`` future on its PubAck only)."""
        futures: list[asyncio.Future[Any] | BusUnavailable] = []
        for subject, data, msg_id in batch:
            try:
                with translated(what):
                    fut = await self.js.publish_async(
                        subject, data, headers={MSG_ID: msg_id}, wait_stall=5.0
                    )
                futures.append(fut)
            except BusUnavailable as e:
                futures.append(e)
        results: list[BusUnavailable | None] = []
        deadline = asyncio.get_running_loop().time() + PUBACK_WAIT_SECONDS
        for f in futures:
            if isinstance(f, BusUnavailable):
                results.append(f)
                continue
            try:
                with translated(what):
                    async with asyncio.timeout_at(deadline):
                        await f
                results.append(None)
            except BusUnavailable as e:
                results.append(e)
        return results

    async def publish_status(self, event: StatusEvent) -> None:
        """Publish one transition to the status stream and wait for JetStream's ack.

        ``Nats-Msg-Id`` = ``<execution id>|<status>|<attempt>``: a retried publish is stored once.

        Raises:
            BusUnavailable: when it was not acknowledged (the caller retries).
        """
        subject = self.config.status_subject(event.owner, event.job_id)
        msg_id = status_msg_id(event.execution_id, event.status, event.attempt)
        with translated("publish status"):
            await self.js.publish(
                subject, run_encoder.encode(event), headers={MSG_ID: msg_id}, timeout=5
            )

    async def publish_statuses(self, events: Sequence[StatusEvent]) -> list[BusUnavailable | None]:
        """Publish transitions of different runs to the status stream at once; one result per
        event (None = acknowledged by JetStream, else the caller retries that one).

        ``ATOMIC_BATCH_MIN`` or more go out as one atomic batch (one PubAck for all), fewer (or
        where the batch is refused) pipelined, every PubAck awaited; one alone as
        :meth:`publish_status`. Each carries the same ``Nats-Msg-Id`` as there, so a retried
        event is stored once. Never raises :class:`BusUnavailable`: it is returned per event.
        """
        if len(events) == 1:
            try:
                await self.publish_status(events[0])
                return [None]
            except BusUnavailable as e:
                return [e]
        batch = self._status_batch(events)
        if await self._publish_atomic(batch):
            return [None] * len(batch)
        return await self._publish_pipelined(batch, "publish status")

    async def publish_events(self, events: Sequence[Event]) -> int:
        """Publish events for live clients, pipelined and best effort; how many were stored.

        Used for transitions the store already holds (job changes, QUEUED and SKIPPED runs):
        losing one delays nobody's work, so failures are logged, not retried.
        """
        batch = self._status_batch(events)
        if await self._publish_atomic(batch):
            return len(batch)
        results = await self._publish_pipelined(batch, "publish event")
        for error in results:
            if error is not None:
                log.warning("event not published: %s", error)
        return results.count(None)

    def _status_batch(self, events: Sequence[Event]) -> list[tuple[str, bytes, str]]:
        """Each event as ``(subject, msgspec JSON, Nats-Msg-Id)`` for the status stream, in order.

        The subject is its job's (:meth:`BusConfig.status_subject`); the id is
        :func:`core.ids.status_msg_id` for a run's transition (as :meth:`publish_status` sets it)
        and :func:`core.ids.job_event_msg_id` for a job event, so a re-published event is stored
        once. For the hot publish path (issue 14) the bound methods are looked up once per batch,
        and the variant is told by its exact type (:class:`JobEvent` is final), which CPython
        checks without a call, where ``isinstance`` on a msgspec Struct goes through its
        metaclass.
        """
        subject, encode = self.config.status_subject, run_encoder.encode
        return [
            (
                subject(event.owner, event.job_id),
                encode(event),
                job_event_msg_id(event.job_id, event.event, event.at)
                if type(event) is JobEvent
                else status_msg_id(event.execution_id, event.status, event.attempt),
            )
            for event in events
        ]

    async def _publish_atomic(self, batch: Sequence[tuple[str, bytes, str]]) -> bool:
        """Publish ``(subject, data, Nats-Msg-Id)`` messages of one stream as one atomic batch
        (ADR-50): the first as a request (its empty reply says the batch began), the middle
        ones without a reply, the last as the commit (its PubAck covers them all). True: all
        are stored (duplicates of earlier publishes included). False: nothing of it is stored
        and the caller publishes one by one — the batch is too small (``ATOMIC_BATCH_MIN``:
        cheaper pipelined) or too large for it, the
        stream does not allow atomic batches (then not tried again on this connection), it
        holds a duplicate of itself or of an earlier message (error 10201), or NATS failed
        (the caller's publishes then fail as usual; an uncommitted batch is abandoned by the
        server, a committed one whose PubAck was lost makes the caller's publishes
        duplicates)."""
        if not self._atomic or not ATOMIC_BATCH_MIN <= len(batch) <= ATOMIC_BATCH_MAX:
            return False
        nc = self._nc
        if nc is None or not nc.is_connected:
            return False
        batch_id = uuid.uuid4().hex
        last = len(batch)
        try:
            for seq, (subject, data, msg_id) in enumerate(batch, 1):
                headers = {MSG_ID: msg_id, BATCH_ID: batch_id, BATCH_SEQUENCE: str(seq)}
                if seq == 1:
                    reply = await nc.request(subject, data, timeout=5, headers=headers)
                    if reply.data and not self._batch_accepted(reply.data):
                        return False
                elif seq < last:
                    await nc.publish(subject, data, headers=headers)
                else:
                    headers[BATCH_COMMIT] = "1"
                    ack = await nc.request(subject, data, timeout=5, headers=headers)
                    return self._batch_accepted(ack.data)
        except (nats.errors.Error, TimeoutError, ConnectionError, OSError) as e:
            log.debug("atomic batch publish failed (%s); publishing one by one", e)
        return False

    def _batch_accepted(self, reply: bytes) -> bool:
        """Whether a batch reply (an empty ack, a PubAck or an error) is not an error."""
        try:
            answer = msgspec.json.decode(reply, type=dict[str, Any])
        except msgspec.DecodeError:
            return False
        error = answer.get("error")
        if error is None:
            return True
        code = error.get("err_code") if isinstance(error, dict) else None
        if code in (ATOMIC_NOT_ENABLED, ATOMIC_UNSUPPORTED_HEADER):
            # for good: every batch would be sent twice, refused at its commit, then one by one
            log.info("atomic batch publish refused (%s); publishing one by one from now on", error)
            self._atomic = False
        else:
            log.debug("atomic batch refused (%s); publishing one by one", error)
        return False

    async def notify(self, notice: JobNotice) -> None:
        """Core-NATS notice to a partition's owner (best effort: the safety scan covers loss)."""
        with translated("notify"):
            await self.nc.publish(
                self.config.notify_subject(notice.partition), run_encoder.encode(notice)
            )

    async def publish_finished(self, job_ids: list[str]) -> None:
        """Core-NATS notice: runs of these jobs ended (schedulers wake buffered occurrences)."""
        with translated("notify finished runs"):
            await self.nc.publish(
                f"{self.config.prefix}.finished", run_encoder.encode(RunsFinished(job_ids=job_ids))
            )

    async def subscribe_finished(
        self, handler: Callable[[RunsFinished], Awaitable[None]]
    ) -> Closeable:
        async def on_msg(msg: Msg) -> None:
            try:
                finished = finished_decoder.decode(msg.data)
            except msgspec.DecodeError:
                log.warning("dropping undecodable finished-runs notice")
                return
            await handler(finished)

        with translated("subscribe to finished runs"):
            return Closeable(await self.nc.subscribe(f"{self.config.prefix}.finished", cb=on_msg))

    async def subscribe_notices(self, handler: Callable[[JobNotice], Awaitable[None]]) -> Closeable:
        """Subscribe to notices of every partition; ``handler`` filters by ownership."""

        async def on_msg(msg: Msg) -> None:
            try:
                notice = notice_decoder.decode(msg.data)
            except msgspec.DecodeError:
                log.warning("dropping undecodable job notice on %s", msg.subject)
                return
            await handler(notice)

        with translated("subscribe to notices"):
            return Closeable(await self.nc.subscribe(f"{self.config.prefix}.notify.*", cb=on_msg))
