"""The task catalog: which named tasks exist, their parameter types, kinds and defaults.

Gateways validate ``taskId`` and ``parameters`` against the catalog when a job is created; workers
look the function up when a run arrives. Both load the same catalog (setting ``tasks``).

A task is either ``io`` (``async def fn(params, ctx)``, run as an asyncio task) or ``cpu`` (a
module-level ``def fn(params, ctx)``, run in a worker's process pool; its arguments cross the
process boundary as msgspec JSON). It may return a small JSON-able result, stored on the run.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from core.concurrency import (
    MAX_CONCURRENT_LIMIT,
    ConcurrencyPolicy,
    check_concurrency,
    parse_template,
    render_key,
)
from core.errors import FieldError, InvalidRequest

TaskKind = Literal["io", "cpu"]


SECRET_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""What a secret's name may be: a file name without a path (it names a file in the secrets
directory, as Docker and Kubernetes mount secrets)."""


class TaskError(Exception):
    """A task's failure that says how to retry it (Temporal's ``ApplicationError`` idea).

    Any other exception a task raises fails the attempt and is retried with the worker's
    exponential backoff until the job's ``maxAttempts``.

    Args:
        message: the run's error, for humans (stored on the execution).
        retryable: False: no further attempt, the run is FAILED now (a 4xx answer, a refused
            address, a missing secret: trying again cannot help).
        retry_after_seconds: the earliest the next attempt may start (seconds from now), e.g. an
            HTTP ``Retry-After``; the worker waits the longer of it and its backoff delay, at most
            :data:`actors.worker.RETRY_AFTER_MAX_SECONDS`.
    """

    def __init__(
        self, message: str, *, retryable: bool = True, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_seconds = retry_after_seconds


class SecretNotFound(TaskError):
    """A task asked for a secret the deployment does not hold (not retried)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"secret {name!r} is not defined on this worker", retryable=False)
        self.name = name


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a running task knows about its run.

    Attributes:
        idempotency_key: the execution id; identical for every attempt and every redelivery of
            the same scheduled run, so a task can make its side effects idempotent.
        job_id: the job.
        attempt: 1-based attempt number.
        scheduled_for: the occurrence this run is for (aware UTC).
        data_dir: the deployment's data directory (tasks that write files put them here).
        secrets_dir: the directory of the deployment's secrets, one file per secret (setting
            ``secrets_dir``; empty: none). Read them with :meth:`secret`.
        allowed_networks: CIDR networks outbound calls may reach although they are not globally
            reachable (setting ``http_allowed_networks``; see :mod:`core.egress`).
    """

    idempotency_key: str
    job_id: str
    attempt: int
    scheduled_for: datetime
    data_dir: str
    secrets_dir: str = ""
    allowed_networks: tuple[str, ...] = ()

    def secret(self, name: str) -> str:
        """The value of the deployment's secret ``name`` (the file's text, without a trailing
        newline). Secrets live with the workers, never in a job, so the API cannot show them.

        Raises:
            SecretNotFound: no such secret (or an invalid name, or no secrets directory).
        """
        if not self.secrets_dir or not re.fullmatch(SECRET_NAME, name):
            raise SecretNotFound(name)
        try:
            return (Path(self.secrets_dir) / name).read_text().rstrip("\r\n")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise SecretNotFound(name) from None


@dataclass(frozen=True, slots=True)
class TaskConcurrency:
    """A task's default concurrency limit (:mod:`core.concurrency`), as Hatchet's concurrency
    groups are declared on the workflow: a job of the task created without a ``concurrencyKey``
    or ``maxConcurrent`` of its own takes them (and the policy, unless it sets its own), and
    shows them as its own options (a job may set its own key instead, or ``PATCH``
    ``concurrencyKey: null`` to run without a limit).

    Attributes:
        key: the key template over the job's parameters (``"tenant-{tenant}"``).
        max_concurrent: runs of one key (and owner) at once, 1 to
            :data:`core.concurrency.MAX_CONCURRENT_LIMIT`.
        policy: what a run does when every slot of its key is taken.
    """

    key: str
    max_concurrent: int = 1
    policy: ConcurrencyPolicy = ConcurrencyPolicy.QUEUE


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One registered task.

    Attributes:
        name: the ``taskId`` clients use.
        fn: the implementation (async for ``io``, sync module-level for ``cpu``).
        params_type: msgspec Struct that ``parameters`` must decode into.
        kind: ``io`` or ``cpu``.
        timeout_seconds: default run timeout (a job may override it).
        max_attempts: default attempts (a job may override it).
        description: one line for humans (shown by ``jobsched tasks``).
        concurrency: the default concurrency limit of its jobs (None: none).
    """

    name: str
    fn: Callable[..., Any]
    params_type: type[msgspec.Struct]
    kind: TaskKind
    timeout_seconds: float
    max_attempts: int
    description: str = ""
    concurrency: TaskConcurrency | None = None

    def decode_params(self, parameters: dict[str, Any]) -> msgspec.Struct:
        """Validate ``parameters`` against ``params_type``.

        Raises:
            InvalidRequest: naming ``parameters.<field>`` and the reason.
        """
        try:
            return msgspec.convert(parameters, self.params_type)
        except msgspec.ValidationError as e:
            raise InvalidRequest(validation_field_error(e, root="parameters")) from None

    def job_concurrency(
        self,
        key: str | None,
        max_concurrent: int | None,
        policy: ConcurrencyPolicy | None,
        parameters: dict[str, Any],
    ) -> tuple[str | None, int | None, ConcurrencyPolicy]:
        """The concurrency options ``(key, max_concurrent, policy)`` of a new job of this task
        that asks for ``key``, ``max_concurrent`` and ``policy`` (None: not set): its own when
        it sets a key or ``max_concurrent``, else the task's default limit, if any (as a job's
        other options fall back to the task's ``timeout_seconds`` and ``max_attempts``). A
        policy the job sets is kept either way; unset, it is the task's, else ``queue``.

        Raises:
            InvalidRequest: naming ``concurrencyKey`` (the job's own template is invalid or does
                not render with ``parameters``, or the task's does not: a parameter it names is
                not set) or ``maxConcurrent`` (set without a key).
        """
        default = self.concurrency
        if key is not None or max_concurrent is not None or default is None:
            check_concurrency(key, max_concurrent, parameters)
            return key, max_concurrent, policy or ConcurrencyPolicy.QUEUE
        try:
            render_key(default.key, parameters)
        except ValueError as e:
            raise InvalidRequest(
                FieldError(
                    "concurrencyKey",
                    f"the default of task {self.name!r}, {default.key!r}, {e}: set that "
                    "parameter, or give the job a concurrencyKey of its own",
                )
            ) from None
        return default.key, default.max_concurrent, policy or default.policy


IoTaskFn = Callable[[Any, TaskContext], Awaitable[Any]]


class TaskCatalog:
    """A set of tasks by name. Build one per deployment (no global registry).

    Example::

        catalog = TaskCatalog()

        @catalog.task("noop", params=NoParams)
        async def noop(params: NoParams, ctx: TaskContext) -> None: ...
    """

    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}

    def task(
        self,
        name: str,
        *,
        params: type[msgspec.Struct],
        kind: TaskKind = "io",
        timeout_seconds: float = 300.0,
        max_attempts: int = 3,
        description: str = "",
        concurrency_key: str | None = None,
        max_concurrent: int = 1,
        concurrency_policy: ConcurrencyPolicy | str = ConcurrencyPolicy.QUEUE,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` under ``name``; returns ``fn`` unchanged.

        ``concurrency_key`` (a template over ``params``' fields, by their JSON names),
        ``max_concurrent`` and ``concurrency_policy`` (``queue`` or ``skip``) are the default
        concurrency limit of the task's jobs (:class:`TaskConcurrency`).

        Raises:
            ValueError: ``name`` is already registered, or the concurrency limit is invalid
                (a template :func:`core.concurrency.parse_template` refuses, a placeholder that
                names no field of ``params``, ``max_concurrent`` out of range, an unknown
                policy).
        """
        concurrency = (
            None
            if concurrency_key is None
            else _task_concurrency(
                name, params, concurrency_key, max_concurrent, concurrency_policy
            )
        )

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._tasks:
                raise ValueError(f"task {name!r} is registered twice")
            self._tasks[name] = TaskSpec(
                name, fn, params, kind, timeout_seconds, max_attempts, description, concurrency
            )
            return fn

        return register

    def get(self, name: str) -> TaskSpec:
        """The task called ``name``.

        Raises:
            InvalidRequest: on field ``taskId`` when no such task exists.
        """
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks))
            raise InvalidRequest(
                FieldError("taskId", f"unknown task {name!r}; known: {known}")
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[TaskSpec]:
        return iter(self._tasks.values())


def _task_concurrency(
    task: str,
    params: type[msgspec.Struct],
    key: str,
    max_concurrent: int,
    policy: ConcurrencyPolicy | str,
) -> TaskConcurrency:
    """The checked default concurrency limit of ``task`` (raises ValueError naming it)."""
    try:
        parts = parse_template(key)
    except ValueError as e:
        raise ValueError(f"task {task!r}: concurrency_key {key!r} {e}") from None
    fields = {f.encode_name for f in msgspec.structs.fields(params)}
    for is_name, text in parts:
        if is_name and text not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise ValueError(
                f"task {task!r}: concurrency_key {key!r} names {text!r}, which is not one of its "
                f"parameters ({known})"
            )
    if not 1 <= max_concurrent <= MAX_CONCURRENT_LIMIT:
        raise ValueError(
            f"task {task!r}: max_concurrent must be 1 to {MAX_CONCURRENT_LIMIT}, "
            f"not {max_concurrent}"
        )
    if policy not in set(ConcurrencyPolicy):
        known = ", ".join(ConcurrencyPolicy)
        raise ValueError(
            f"task {task!r}: concurrency_policy must be one of {known}, not {policy!r}"
        )
    return TaskConcurrency(key, max_concurrent, ConcurrencyPolicy(policy))


_NAMED_REASON = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*): (.+)", re.S)


def validation_field_error(err: msgspec.ValidationError, *, root: str = "") -> FieldError:
    """Turn a msgspec validation error into a :class:`FieldError` with a dotted field path.

    msgspec reports ``"<reason> - at `$.a.b[0]`"`` or ``"Object contains unknown field `x`"``.
    A parameter type's ``__post_init__`` names its field by raising ``ValueError("field: reason")``.
    """
    message = str(err)
    reason, sep, where = message.partition(" - at `$")
    path = where.rstrip("`").lstrip(".") if sep else ""
    if reason.startswith("Object contains unknown field `"):
        name = reason.split("`")[1]
        path = f"{path}.{name}" if path else name
        reason = "unknown field"
    elif reason.startswith("Object missing required field `"):
        name = reason.split("`")[1]
        path = f"{path}.{name}" if path else name
        reason = "required field is missing"
    elif named := _NAMED_REASON.fullmatch(reason):  # a __post_init__'s "field: reason"
        path = f"{path}.{named[1]}" if path else named[1]
        reason = named[2]
    full = ".".join(p for p in (root, path) if p)
    return FieldError(full or "body", reason)
