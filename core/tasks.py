"""The task catalog: which named tasks exist, their parameter types, kinds and defaults.

Gateways validate ``taskId`` and ``parameters`` against the catalog when a job is created; workers
look the function up when a run arrives. Both load the same catalog (setting ``tasks``).

A task is either ``io`` (``async def fn(params, ctx)``, run as an asyncio task) or ``cpu`` (a
module-level ``def fn(params, ctx)``, run in a worker's process pool; its arguments cross the
process boundary as msgspec JSON). It may return a small JSON-able result, stored on the run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import msgspec

from core.errors import FieldError, InvalidRequest

TaskKind = Literal["io", "cpu"]


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
    """

    idempotency_key: str
    job_id: str
    attempt: int
    scheduled_for: datetime
    data_dir: str


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
    """

    name: str
    fn: Callable[..., Any]
    params_type: type[msgspec.Struct]
    kind: TaskKind
    timeout_seconds: float
    max_attempts: int
    description: str = ""

    def decode_params(self, parameters: dict[str, Any]) -> msgspec.Struct:
        """Validate ``parameters`` against ``params_type``.

        Raises:
            InvalidRequest: naming ``parameters.<field>`` and the reason.
        """
        try:
            return msgspec.convert(parameters, self.params_type)
        except msgspec.ValidationError as e:
            raise InvalidRequest(validation_field_error(e, root="parameters")) from None


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
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` under ``name``; returns ``fn`` unchanged.

        Raises:
            ValueError: if ``name`` is already registered.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._tasks:
                raise ValueError(f"task {name!r} is registered twice")
            self._tasks[name] = TaskSpec(
                name, fn, params, kind, timeout_seconds, max_attempts, description
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


def validation_field_error(err: msgspec.ValidationError, *, root: str = "") -> FieldError:
    """Turn a msgspec validation error into a :class:`FieldError` with a dotted field path.

    msgspec reports ``"<reason> - at `$.a.b[0]`"`` or ``"Object contains unknown field `x`"``.
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
    full = ".".join(p for p in (root, path) if p)
    return FieldError(full or "body", reason)
