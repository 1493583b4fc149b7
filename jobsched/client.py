"""Async, typed Python client of the jobsched HTTP API (used by the CLI and the tests).

Example::

    async with JobschedClient("http://127.0.0.1:8080", token) as client:
        job = await client.create_job({"taskId": "noop"})
        job = await client.wait_for_status(job.id, {"SUCCEEDED", "FAILED"}, timeout_seconds=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, Collection
from datetime import datetime
from types import TracebackType
from typing import Any, TypedDict, TypeVar

import aiohttp
import msgspec
from nats.aio.client import Client as NatsConnection

from bus.auth import Credentials
from bus.callout import api_inbox_prefix
from bus.nats import NatsClient
from bus.tls import verifying_context, wants_tls
from core.audit import AuditRecord
from core.cluster import ClusterView
from core.explain import Explanation
from core.heatmap import UpcomingHeatmap
from core.model import Event, Execution, Job, JobCreate, Page, Problem
from core.notifications import NotificationAttempt, NotificationAttemptList, NotificationDefault
from core.notify_spec import NotifyIn
from core.stats import StatsOverview
from jobsched.client_runs import HttpRunsApi, NatsRunsApi

T = TypeVar("T")

_default_decoder = msgspec.json.Decoder(NotificationDefault)
_attempts_decoder = msgspec.json.Decoder(NotificationAttemptList)
_job_decoder = msgspec.json.Decoder(Job)
_jobs_decoder = msgspec.json.Decoder(Page[Job])
_executions_decoder = msgspec.json.Decoder(Page[Execution])
_problem_decoder = msgspec.json.Decoder(Problem)
_execution_decoder = msgspec.json.Decoder(Execution)
_audit_decoder = msgspec.json.Decoder(Page[AuditRecord])
_explanation_decoder = msgspec.json.Decoder(Explanation)
_overview_decoder = msgspec.json.Decoder(StatsOverview)
_heatmap_decoder = msgspec.json.Decoder(UpcomingHeatmap)
_cluster_decoder = msgspec.json.Decoder(ClusterView)


class FireTimes(msgspec.Struct, frozen=True, rename="camel"):
    fire_times: list[datetime]


_times_decoder = msgspec.json.Decoder(FireTimes)


class ApiError(Exception):
    """The API answered with an error.

    Attributes:
        status: HTTP status.
        problem: the RFC 9457 problem body (None if the body was not one).
        retry_after: the ``Retry-After`` header in seconds (429 of a rate quota, 503), or None.
    """

    def __init__(
        self, status: int, problem: Problem | None, text: str, retry_after: float | None = None
    ) -> None:
        self.status = status
        self.problem = problem
        self.retry_after = retry_after
        detail = problem.detail if problem and problem.detail else text
        super().__init__(f"HTTP {status}: {detail}")


class WaitTimedOut(TimeoutError):
    """:meth:`JobschedClient.wait_for_status` gave up.

    Attributes:
        job: the job as last seen (its status is not one of those waited for).
        timeout_seconds: how long it waited (seconds).
    """

    def __init__(self, job: Job, timeout_seconds: float) -> None:
        super().__init__(f"job {job.id} still {job.status} after {timeout_seconds:g} s")
        self.job = job
        self.timeout_seconds = timeout_seconds


class WatchClosed(Exception):
    """The live-status WebSocket was closed by the server.

    Attributes:
        code: the WebSocket close code (4001 unauthorized, 4008 slow consumer, 1013 unavailable).
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"live status closed ({code}): {reason}")
        self.code = code


class _Frame(msgspec.Struct, frozen=True):
    type: str
    id: int | None = None
    event: Event | None = None
    message: str | None = None


_frame_decoder = msgspec.json.Decoder(_Frame)


class JobschedClient(HttpRunsApi):
    """Client of one gateway.

    Args:
        base_url: e.g. ``http://127.0.0.1:8080``.
        token: bearer token (``jobsched token --user NAME``).
        timeout_seconds: per-request timeout (seconds).
    """

    def __init__(self, base_url: str, token: str, *, timeout_seconds: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> JobschedClient:
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        data, _ = await self._request_with_headers(
            method, path, body=body, params=params, headers=headers
        )
        return data

    async def _request_with_headers(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        hdrs = (
            {"Content-Type": "application/json", **(headers or {})} if body is not None else headers
        )
        async with self.session.request(
            method, self.base_url + path, data=body, params=params, headers=hdrs
        ) as resp:
            data = await resp.read()
            if resp.status >= 400:
                try:
                    problem = _problem_decoder.decode(data)
                except msgspec.DecodeError:
                    problem = None
                raise ApiError(
                    resp.status,
                    problem,
                    data.decode(errors="replace"),
                    _retry_after(resp.headers.get("Retry-After")),
                )
            return data, dict(resp.headers)

    async def create_job(self, body: JobCreate | dict[str, Any]) -> Job:
        """``POST /jobs``. Raises ApiError (422 names the invalid field)."""
        raw = msgspec.json.encode(body)
        return _job_decoder.decode(await self._request("POST", "/jobs", body=raw))

    async def create_job_idempotent(
        self, body: JobCreate | dict[str, Any], idempotency_key: str
    ) -> tuple[Job, bool]:
        """``POST /jobs`` with an ``Idempotency-Key``; ``(job, replayed)``.

        Raises:
            ApiError: 409 ``idempotency_key_reused`` when the key was used for another body.
        """
        raw = msgspec.json.encode(body)
        data, headers = await self._request_with_headers(
            "POST", "/jobs", body=raw, headers={"Idempotency-Key": idempotency_key}
        )
        return _job_decoder.decode(data), headers.get("Idempotent-Replayed") == "true"

    async def patch_job(self, job_id: str, patch: dict[str, Any]) -> Job:
        """``PATCH /jobs/{id}``: change schedule, parameters or options."""
        raw = msgspec.json.encode(patch)
        return _job_decoder.decode(await self._request("PATCH", f"/jobs/{job_id}", body=raw))

    async def pause_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._request("POST", f"/jobs/{job_id}/pause"))

    async def resume_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._request("POST", f"/jobs/{job_id}/resume"))

    async def cancel_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._request("POST", f"/jobs/{job_id}/cancel"))

    async def trigger_job(self, job_id: str) -> Execution:
        """An extra run now; the new execution."""
        return _execution_decoder.decode(await self._request("POST", f"/jobs/{job_id}/trigger"))

    async def delete_job(self, job_id: str) -> None:
        await self._request("DELETE", f"/jobs/{job_id}")

    async def explain(self, job_id: str) -> Explanation:
        """``GET /jobs/{id}/explain``: why the job's next run has not started (reasons, most
        important first; see :mod:`core.explain`). Raises ApiError (404: not your job)."""
        return _explanation_decoder.decode(await self._request("GET", f"/jobs/{job_id}/explain"))

    async def upcoming(self, job_id: str, *, count: int = 10) -> list[datetime]:
        data = await self._request("GET", f"/jobs/{job_id}/upcoming", params={"count": str(count)})
        return _times_decoder.decode(data).fire_times

    async def preview(
        self,
        expression: str,
        *,
        timezone: str | None = None,
        after: datetime | None = None,
        count: int | None = None,
        gap: str | None = None,
        fold: str | None = None,
    ) -> list[datetime]:
        """``GET /schedules/preview``: the next fire times of a cron expression."""
        params = _params(
            expression=expression,
            timezone=timezone,
            after=after.isoformat() if after else None,
            count=str(count) if count else None,
            gap=gap,
            fold=fold,
        )
        data = await self._request("GET", "/schedules/preview", params=params)
        return _times_decoder.decode(data).fire_times

    async def watch(
        self, *, job_ids: list[str] | None = None, last_event_id: int | None = None
    ) -> AsyncGenerator[tuple[int, Event], None]:
        """Live events of your jobs (or of ``job_ids``) over ``GET /ws``: ``(event id, event)``.

        Pass the last event id you saw as ``last_event_id`` to resume without a gap.

        Raises:
            WatchClosed: the server closed the connection (its close code and reason).
        """
        url = "ws" + self.base_url.removeprefix("http") + "/ws"
        async with self.session.ws_connect(url, headers=self._headers, heartbeat=30) as ws:
            subscribe: dict[str, Any] = {"type": "subscribe"}
            if job_ids is not None:
                subscribe["jobIds"] = job_ids
            if last_event_id is not None:
                subscribe["lastEventId"] = last_event_id
            await ws.send_str(msgspec.json.encode(subscribe).decode())
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                frame = _frame_decoder.decode(msg.data)
                if frame.type == "event" and frame.id is not None and frame.event is not None:
                    yield frame.id, frame.event
                elif frame.type == "error":
                    raise WatchClosed(4000, frame.message or "error")
            raise WatchClosed(ws.close_code or 1006, str(ws.exception() or "closed"))

    async def get_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._request("GET", f"/jobs/{job_id}"))

    async def list_jobs(
        self,
        *,
        status: str | None = None,
        last_run_status: str | None = None,
        task_id: str | None = None,
        start_time: datetime | None = None,
        end_time: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        owner: str | None = None,
        all_users: bool = False,
        name: str | None = None,
        labels: str | None = None,
        idempotency_key: str | None = None,
    ) -> Page[Job]:
        """``GET /jobs``; ``owner`` and ``all_users`` need an admin token; ``labels`` is a label
        selector (``"team=billing,env!=dev"``, :func:`core.labels.parse_selector`);
        ``idempotency_key`` finds the job created with that ``Idempotency-Key``."""
        params = _params(
            status=status,
            lastRunStatus=last_run_status,
            taskId=task_id,
            name=name,
            labels=labels,
            idempotencyKey=idempotency_key,
            startTime=start_time.isoformat() if start_time else None,
            endTime=end_time.isoformat() if end_time else None,
            limit=str(limit) if limit else None,
            cursor=cursor,
            owner=owner,
            allUsers="true" if all_users else None,
        )
        return _jobs_decoder.decode(await self._request("GET", "/jobs", params=params))

    async def job_audit(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[AuditRecord]:
        """``GET /jobs/{id}/audit``: the job's audit records, newest first."""
        params = _params(limit=str(limit) if limit else None, cursor=cursor)
        return _audit_decoder.decode(
            await self._request("GET", f"/jobs/{job_id}/audit", params=params)
        )

    async def list_audit(
        self,
        *,
        owner: str | None = None,
        actor: str | None = None,
        job_id: str | None = None,
        all_users: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[AuditRecord]:
        """``GET /audit``; ``owner`` (another user) and ``all_users`` need an admin token."""
        params = _params(
            owner=owner,
            actor=actor,
            jobId=job_id,
            allUsers="true" if all_users else None,
            limit=str(limit) if limit else None,
            cursor=cursor,
        )
        return _audit_decoder.decode(await self._request("GET", "/audit", params=params))

    async def stats_overview(
        self, *, owner: str | None = None, all_users: bool = False
    ) -> StatsOverview:
        """``GET /stats/overview``: the last hour's runs per final status and minute, the
        failure rate, schedule-to-start delay percentiles (ms) and unfinished runs per queue.

        Your own runs; ``owner`` (another user's) and ``all_users`` need an admin token.

        Raises:
            ApiError: 403 another user's or everyone's asked without an admin token.
        """
        params = _params(owner=owner, allUsers="true" if all_users else None)
        return _overview_decoder.decode(
            await self._request("GET", "/stats/overview", params=params)
        )

    async def stats_upcoming(
        self, *, timezone: str = "UTC", owner: str | None = None, all_users: bool = False
    ) -> UpcomingHeatmap:
        """``GET /stats/upcoming``: fire times of the next 7 days per wall-clock hour of
        ``timezone`` (an IANA zone), with the fire times a DST transition changes.

        Scoped as :meth:`stats_overview`.

        Raises:
            ApiError: 422 ``timezone`` is not an IANA zone; 403 as :meth:`stats_overview`.
        """
        params = _params(timezone=timezone, owner=owner, allUsers="true" if all_users else None)
        return _heatmap_decoder.decode(await self._request("GET", "/stats/upcoming", params=params))

    async def cluster(self) -> ClusterView:
        """``GET /cluster`` (admins): schedulers with their partition leases and expiry,
        unleased partitions, queues with their depth, workers with their in-flight runs.

        Raises:
            ApiError: 403 the token is not an admin's; 503 NATS did not answer.
        """
        return _cluster_decoder.decode(await self._request("GET", "/cluster"))

    async def list_executions(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Execution]:
        params = _params(limit=str(limit) if limit else None, cursor=cursor)
        return _executions_decoder.decode(
            await self._request("GET", f"/jobs/{job_id}/executions", params=params)
        )

    async def get_execution(self, job_id: str, execution_id: str) -> Execution:
        """``GET /jobs/{id}/executions/{executionId}``: one run with its attempts."""
        path = f"/jobs/{job_id}/executions/{execution_id}"
        return _execution_decoder.decode(await self._request("GET", path))

    async def tasks(self) -> list[dict[str, Any]]:
        data = msgspec.json.decode(await self._request("GET", "/tasks"))
        items: list[dict[str, Any]] = data["items"]
        return items

    async def notification_default(self) -> NotificationDefault:
        """``GET /me/notifications``: your default webhook (its secret is never shown)."""
        return _default_decoder.decode(await self._request("GET", "/me/notifications"))

    async def set_notification_default(
        self, notify: NotifyIn | dict[str, Any] | None
    ) -> NotificationDefault:
        """``PUT /me/notifications``: set (None: remove) your default webhook.

        Raises:
            ApiError: 422 naming ``notify.url``, ``notify.on`` or ``notify.secret``.
        """
        raw = msgspec.json.encode({"notify": notify})
        return _default_decoder.decode(await self._request("PUT", "/me/notifications", body=raw))

    async def notification_attempts(
        self, job_id: str, execution_id: str
    ) -> list[NotificationAttempt]:
        """``GET /jobs/{id}/executions/{eid}/notifications``: the run's delivery attempts."""
        path = f"/jobs/{job_id}/executions/{execution_id}/notifications"
        return _attempts_decoder.decode(await self._request("GET", path)).items

    async def wait_for_status(
        self,
        job_id: str,
        statuses: Collection[str],
        *,
        timeout_seconds: float,
        poll_seconds: float = 0.05,
    ) -> Job:
        """Poll the job until its status is one of ``statuses``.

        Raises:
            WaitTimedOut: after ``timeout_seconds`` seconds (a TimeoutError naming the last status).
        """
        job = await self.get_job(job_id)
        try:
            async with asyncio.timeout(timeout_seconds):
                while job.status not in statuses:
                    await asyncio.sleep(poll_seconds)
                    job = await self.get_job(job_id)
        except TimeoutError:
            raise WaitTimedOut(job, timeout_seconds) from None
        return job


def _params(**kw: str | None) -> dict[str, str]:
    return {k: v for k, v in kw.items() if v is not None}


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in delay-seconds (an HTTP date is not used by jobsched)."""
    try:
        return float(value) if value else None
    except ValueError:
        return None


class NatsApiConnectOptions(TypedDict, total=False):
    token: str
    inbox_prefix: str


def nats_api_connect_options(token: str) -> NatsApiConnectOptions:
    """``nats.connect`` options of a NATS-API client with bearer ``token``: the token as its
    NATS token (the gateways' auth callout turns it into the client's permissions) and the only
    inbox those permissions let it read (:func:`bus.callout.api_inbox_prefix`; nats-py's default
    when the token is not a JWT, which the server refuses when it requires authentication)."""
    options = NatsApiConnectOptions(token=token)
    with contextlib.suppress(ValueError):
        options["inbox_prefix"] = api_inbox_prefix(token)
    return options


class NatsJobschedClient(NatsRunsApi):
    """Async client of the NATS request-reply API (``<prefix>.api.<operation>``).

    The same operations, structs and errors as HTTP; see :mod:`gateway.natsapi`. It connects
    with ``token`` as its NATS token and its own inbox (:func:`nats_api_connect_options`).
    The dashboard's statistics (``stats_overview``, ``stats_upcoming``, ``cluster``) are not
    here: the NATS API does not serve them; use :class:`JobschedClient`.

    Args:
        servers: NATS server URLs.
        token: bearer token (``jobsched token --user NAME``).
        prefix: the deployment's subject prefix (``JOBSCHED_SUBJECT_PREFIX``).
        timeout_seconds: per-request timeout (seconds).
        credentials: the NATS user of API clients (``nats-api.json``, :mod:`bus.auth`):
            requests to the API subjects and replies on its own inbox only.
        tls: TLS context (:func:`bus.tls.client_context`); None: TLS only for ``tls://`` URLs.
            With TLS, a server that does not require it is refused (see :mod:`bus.tls`).
    """

    def __init__(
        self,
        servers: str | list[str],
        token: str,
        *,
        prefix: str = "jobsched",
        timeout_seconds: float = 10.0,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.servers = [servers] if isinstance(servers, str) else servers
        self.credentials = credentials
        self.prefix = prefix
        self.timeout_seconds = timeout_seconds
        self._token = token
        self.tls = tls
        self._headers = {"Authorization": f"Bearer {token}"}
        self._nc: NatsConnection | None = None

    async def __aenter__(self) -> NatsJobschedClient:
        options: dict[str, Any] = dict(nats_api_connect_options(self._token))
        if self.credentials is not None:  # a static NATS user instead of the auth callout
            options = {
                "user": self.credentials.user,
                "password": self.credentials.password,
                "inbox_prefix": self.credentials.inbox_prefix,
            }
        if wants_tls(self.servers, self.tls):
            options["tls"] = self.tls or verifying_context()
        nc = NatsClient()
        await nc.connect(servers=self.servers, **options)
        self._nc = nc
        return self

    async def __aexit__(self, *exc: object) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            await nc.close()

    async def _call(
        self, operation: str, body: Any, headers: dict[str, str] | None = None
    ) -> bytes:
        if self._nc is None:
            raise RuntimeError("use 'async with NatsJobschedClient(...)'")
        msg = await self._nc.request(
            f"{self.prefix}.api.{operation}",
            msgspec.json.encode(body),
            timeout=self.timeout_seconds,
            headers={**self._headers, **(headers or {})},
        )
        code = (msg.headers or {}).get("Nats-Service-Error-Code")
        if code:
            try:
                problem = _problem_decoder.decode(msg.data)
            except msgspec.DecodeError:
                problem = None
            hdrs = msg.headers or {}
            raise ApiError(
                int(code),
                problem,
                hdrs.get("Nats-Service-Error", ""),
                _retry_after(hdrs.get("Retry-After")),
            )
        return bytes(msg.data)

    async def create_job(
        self, body: JobCreate | dict[str, Any], *, idempotency_key: str | None = None
    ) -> Job:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return _job_decoder.decode(await self._call("create", body, headers))

    async def get_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._call("get", {"id": job_id}))

    async def list_jobs(self, **filters: Any) -> Page[Job]:
        """Filters as HTTP (camelCase): status, lastRunStatus, startTime, endTime, taskId, name,
        labels (a label selector), idempotencyKey, limit, cursor, owner, allUsers."""
        return _jobs_decoder.decode(await self._call("list", filters))

    async def patch_job(self, job_id: str, patch: dict[str, Any]) -> Job:
        """As :meth:`JobschedClient.patch_job` (``PATCH /jobs/{id}``), over NATS."""
        return _job_decoder.decode(await self._call("patch", {**patch, "id": job_id}))

    async def cancel_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._call("cancel", {"id": job_id}))

    async def pause_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._call("pause", {"id": job_id}))

    async def resume_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._call("resume", {"id": job_id}))

    async def trigger_job(self, job_id: str) -> Execution:
        return _execution_decoder.decode(await self._call("trigger", {"id": job_id}))

    async def list_executions(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Execution]:
        """As :meth:`JobschedClient.list_executions` (a job's runs, newest first), over NATS."""
        body: dict[str, Any] = {"id": job_id}
        if limit:
            body["limit"] = limit
        if cursor:
            body["cursor"] = cursor
        return _executions_decoder.decode(await self._call("executions", body))

    async def get_execution(self, job_id: str, execution_id: str) -> Execution:
        """As :meth:`JobschedClient.get_execution` (one run with its attempts), over NATS."""
        body = {"jobId": job_id, "executionId": execution_id}
        return _execution_decoder.decode(await self._call("execution", body))

    async def explain(self, job_id: str) -> Explanation:
        """As :meth:`JobschedClient.explain`, over NATS."""
        return _explanation_decoder.decode(await self._call("explain", {"id": job_id}))

    async def audit(self, **filters: Any) -> Page[AuditRecord]:
        """Filters as ``GET /audit`` (camelCase): jobId, owner, actor, allUsers, limit, cursor."""
        return _audit_decoder.decode(await self._call("audit", filters))

    async def notification_default(self) -> NotificationDefault:
        return _default_decoder.decode(await self._call("notification-default", {}))

    async def set_notification_default(
        self, notify: NotifyIn | dict[str, Any] | None
    ) -> NotificationDefault:
        return _default_decoder.decode(
            await self._call("set-notification-default", {"notify": notify})
        )

    async def notification_attempts(
        self, job_id: str, execution_id: str
    ) -> list[NotificationAttempt]:
        body = {"jobId": job_id, "executionId": execution_id}
        return _attempts_decoder.decode(await self._call("notifications", body)).items
