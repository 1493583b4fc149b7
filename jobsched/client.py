"""Async, typed Python client of the jobsched HTTP API (used by the CLI and the tests).

Example::

    async with JobschedClient("http://127.0.0.1:8080", token) as client:
        job = await client.create_job({"taskId": "noop"})
        job = await client.wait_for_status(job.id, {"SUCCEEDED", "FAILED"}, timeout_s=10)
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import msgspec

from core.model import Execution, Job, JobCreate, Page, Problem

T = TypeVar("T")

_job_decoder = msgspec.json.Decoder(Job)
_jobs_decoder = msgspec.json.Decoder(Page[Job])
_executions_decoder = msgspec.json.Decoder(Page[Execution])
_problem_decoder = msgspec.json.Decoder(Problem)


class ApiError(Exception):
    """The API answered with an error.

    Attributes:
        status: HTTP status.
        problem: the RFC 9457 problem body (None if the body was not one).
    """

    def __init__(self, status: int, problem: Problem | None, text: str) -> None:
        self.status = status
        self.problem = problem
        detail = problem.detail if problem and problem.detail else text
        fields = ""
        if problem and problem.errors:
            fields = " (" + "; ".join(f"{e.field}: {e.reason}" for e in problem.errors) + ")"
        super().__init__(f"HTTP {status}: {detail}{fields}")


class JobschedClient:
    """Client of one gateway.

    Args:
        base_url: e.g. ``http://127.0.0.1:8080``.
        token: bearer token (``jobsched token --user NAME``).
        timeout_s: per-request timeout (seconds).
    """

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
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
                raise ApiError(resp.status, problem, data.decode(errors="replace"))
            return data

    async def create_job(self, body: JobCreate | dict[str, Any]) -> Job:
        """``POST /jobs``. Raises ApiError (422 names the invalid field)."""
        raw = msgspec.json.encode(body)
        return _job_decoder.decode(await self._request("POST", "/jobs", body=raw))

    async def get_job(self, job_id: str) -> Job:
        return _job_decoder.decode(await self._request("GET", f"/jobs/{job_id}"))

    async def list_jobs(
        self,
        *,
        status: str | None = None,
        last_run_status: str | None = None,
        start_time: datetime | None = None,
        end_time: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Job]:
        params = _params(
            status=status,
            lastRunStatus=last_run_status,
            startTime=start_time.isoformat() if start_time else None,
            endTime=end_time.isoformat() if end_time else None,
            limit=str(limit) if limit else None,
            cursor=cursor,
        )
        return _jobs_decoder.decode(await self._request("GET", "/jobs", params=params))

    async def list_executions(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Execution]:
        params = _params(limit=str(limit) if limit else None, cursor=cursor)
        return _executions_decoder.decode(
            await self._request("GET", f"/jobs/{job_id}/executions", params=params)
        )

    async def tasks(self) -> list[dict[str, Any]]:
        data = msgspec.json.decode(await self._request("GET", "/tasks"))
        items: list[dict[str, Any]] = data["items"]
        return items

    async def wait_for_status(
        self, job_id: str, statuses: Collection[str], *, timeout_s: float, poll_s: float = 0.05
    ) -> Job:
        """Poll the job until its status is one of ``statuses``.

        Raises:
            TimeoutError: after ``timeout_s`` seconds, naming the last status seen.
        """
        job = await self.get_job(job_id)
        try:
            async with asyncio.timeout(timeout_s):
                while job.status not in statuses:
                    await asyncio.sleep(poll_s)
                    job = await self.get_job(job_id)
        except TimeoutError:
            raise TimeoutError(
                f"job {job_id} still {job.status} after {timeout_s} s (wanted {sorted(statuses)})"
            ) from None
        return job


def _params(**kw: str | None) -> dict[str, str]:
    return {k: v for k, v in kw.items() if v is not None}
