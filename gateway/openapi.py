"""The OpenAPI 3.1 description of the HTTP API, generated from the msgspec structs.

Schemas come from :func:`msgspec.json.schema_components` (JSON Schema 2020-12, which OpenAPI 3.1
uses); the routes, their parameters and their possible problems are listed once in
:data:`ROUTES`. A test checks that ROUTES and the aiohttp router agree, and the schemathesis fuzz
test checks the handlers against this document. Served at ``/openapi.json``; ``/docs`` renders
it with Swagger UI (:mod:`gateway.apidocs`). Descriptions are CommonMark (OpenAPI 3.1 §4.5).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import msgspec
import msgspec.inspect

from core.audit import AuditRecord
from core.backfill import BackfillRequest, BackfillResult
from core.bulk import BulkAction, BulkCreate
from core.cluster import ClusterView
from core.concurrency import ConcurrencyPolicy
from core.explain import Explanation
from core.heatmap import DstMark, UpcomingHeatmap
from core.model import (
    Execution,
    ExecutionStatus,
    Health,
    Instant,
    Job,
    JobCreate,
    JobPatch,
    JobStatus,
    Page,
    Problem,
)
from core.notifications import (
    NotificationAttemptList,
    NotificationDefault,
    NotificationDefaultIn,
)
from core.stats import StatsOverview
from gateway import dashboard

REF = "#/components/schemas/{name}"


class FireTimes(msgspec.Struct, rename="camel"):
    """Fire times, aware UTC."""

    fire_times: list[Instant]


class JobFireTimes(msgspec.Struct, rename="camel"):
    """A job's next fire times (aware UTC) and the DST marks among them."""

    fire_times: list[Instant]
    marks: list[DstMark]


class TaskConcurrencyInfo(msgspec.Struct, rename="camel"):
    """A task's default concurrency limit: what a job of it created without a
    ``concurrencyKey`` of its own gets."""

    key: str
    max_concurrent: int
    policy: ConcurrencyPolicy


class TaskInfo(msgspec.Struct, rename="camel"):
    task_id: str
    kind: str
    description: str
    timeout_seconds: float
    max_attempts: int
    parameters: dict[str, Any]
    concurrency: TaskConcurrencyInfo | None


class TaskList(msgspec.Struct):
    items: list[TaskInfo]


@dataclass(frozen=True)
class Param:
    name: str
    schema: dict[str, Any]
    description: str
    where: str = "query"
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    status: int = 200
    response: Any = None
    body: Any = None
    params: list[Param] = field(default_factory=list)
    problems: tuple[int, ...] = (401,)
    public: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def operation_id(self) -> str:
        """A readable operation id (``createJob``, ``listExecutions``): generated clients name
        their methods after it."""
        return OPERATION_IDS[(self.method, self.path)]

    @property
    def tag(self) -> str:
        return next(tag for prefix, tag in TAGS if self.path.startswith(prefix))


OPERATION_IDS = {
    ("post", "/jobs"): "createJob",
    ("get", "/jobs"): "listJobs",
    ("get", "/jobs/{job_id}"): "getJob",
    ("patch", "/jobs/{job_id}"): "patchJob",
    ("delete", "/jobs/{job_id}"): "deleteJob",
    ("post", "/jobs/{job_id}/pause"): "pauseJob",
    ("post", "/jobs/{job_id}/resume"): "resumeJob",
    ("post", "/jobs/{job_id}/cancel"): "cancelJob",
    ("post", "/jobs/{job_id}/trigger"): "triggerJob",
    ("get", "/jobs/{job_id}/executions"): "listExecutions",
    ("get", "/jobs/{job_id}/executions/{execution_id}"): "getExecution",
    ("get", "/jobs/{job_id}/audit"): "listJobAudit",
    ("get", "/audit"): "listAudit",
    ("get", "/jobs/{job_id}/upcoming"): "listUpcoming",
    ("get", "/jobs/{job_id}/explain"): "explainJob",
    ("get", "/schedules/preview"): "previewSchedule",
    ("get", "/tasks"): "listTasks",
    ("get", "/me/notifications"): "getNotificationDefault",
    ("put", "/me/notifications"): "setNotificationDefault",
    ("get", "/jobs/{job_id}/executions/{execution_id}/notifications"): "listNotificationAttempts",
    ("get", "/executions"): "listRuns",
    ("post", "/jobs/{job_id}/executions/{execution_id}/replay"): "replayRun",
    ("post", "/jobs/{job_id}/backfill"): "backfillJob",
    ("post", "/bulk/replay"): "bulkReplay",
    ("post", "/bulk/cancel"): "bulkCancel",
    ("get", "/bulk/{bulk_id}"): "getBulk",
    ("get", "/healthz"): "getHealth",
    ("get", "/readyz"): "getReadiness",
    ("get", "/stats/overview"): "getStatsOverview",
    ("get", "/stats/upcoming"): "getStatsUpcoming",
    ("get", "/cluster"): "getCluster",
}
"""Every operation's id: ``verbNoun``, as generators turn them into method names."""

TAGS = (
    ("/jobs/{job_id}/executions", "runs"),
    ("/jobs/{job_id}/audit", "audit"),
    ("/jobs/{job_id}/upcoming", "schedules"),
    ("/jobs/{job_id}/explain", "diagnostics"),
    ("/jobs/{job_id}/backfill", "runs"),
    ("/executions", "runs"),
    ("/bulk", "bulk"),
    ("/jobs", "jobs"),
    ("/audit", "audit"),
    ("/schedules", "schedules"),
    ("/tasks", "tasks"),
    ("/me/notifications", "notifications"),
    ("/stats", "stats"),
    ("/cluster", "cluster"),
    ("/", "health"),
)
"""Each operation's tag (the first path prefix that matches), grouping them in docs and
generated clients."""

TAG_DESCRIPTIONS = {
    "jobs": "Create, list, change and control jobs.",
    "runs": "A job's runs (executions) and their attempts.",
    "schedules": "Fire times: a job's next ones, a cron expression's.",
    "audit": "Who changed what, when.",
    "diagnostics": "Why a job's next run has not started (`GET /jobs/{id}/explain`).",
    "bulk": "Replay or cancel every run a filter selects, in the background.",
    "notifications": "Your default webhook for finished runs.",
    "stats": "The dashboard's Overview and Upcoming data.",
    "cluster": "Admins: schedulers, their leases, queues and workers.",
    "tasks": "The task catalog.",
    "health": "Liveness and readiness (no token needed).",
}
"""The tags in the order docs show them, with their descriptions (CommonMark)."""

ID = Param("job_id", {"type": "string"}, "The job's id.", where="path", required=True)
LIMIT = Param(
    "limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}, "Page size."
)
EXECUTION_ID = Param(
    "execution_id", {"type": "string"}, "The run's id.", where="path", required=True
)
CURSOR = Param("cursor", {"type": "string"}, "The previous page's nextCursor.")
COUNT = Param(
    "count", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10}, "How many."
)
INSTANT = {"type": "string", "format": "date-time"}
OWNER = Param(
    "owner", {"type": "string"}, "Another user's records (admins only; your own: anyone)."
)
ALL_USERS = Param(
    "allUsers", {"type": "string", "enum": ["true", "false"]}, "Every user's records (admins only)."
)


def _enum(values: type[JobStatus] | type[ExecutionStatus]) -> dict[str, Any]:
    return {"type": "string", "enum": [v.value for v in values]}


ROUTES: list[Route] = [
    Route(
        "post",
        "/jobs",
        "Create a job",
        201,
        Job,
        JobCreate,
        problems=(400, 401, 403, 409, 413, 415, 422, 429, 503),
        headers={
            "Idempotency-Key": "Makes the request idempotent: the same key and body "
            "return the original job (200), another body answers 409."
        },
    ),
    Route(
        "get",
        "/jobs",
        "List your jobs (an admin: anyone's), newest first",
        200,
        Page[Job],
        params=[
            Param("status", _enum(JobStatus), "Only jobs in this status."),
            Param(
                "lastRunStatus",
                _enum(ExecutionStatus),
                "Only jobs whose latest finished run ended so.",
            ),
            Param("startTime", INSTANT, "Created at or after (RFC 3339 with offset)."),
            Param("endTime", INSTANT, "Created before (RFC 3339 with offset)."),
            Param("taskId", {"type": "string"}, "Only jobs of this task."),
            Param("name", {"type": "string"}, "Only the job of this name."),
            Param(
                "idempotencyKey",
                {"type": "string"},
                "Only the job created with this `Idempotency-Key` header (exact match).",
            ),
            Param(
                "labels",
                {"type": "string", "examples": ["team=billing,env!=dev", "tier in (a,b),!legacy"]},
                "A label selector (Kubernetes syntax): requirements separated by commas, all of "
                "which must hold: `key=value` (or `==`), `key!=value`, `key in (v1,v2)`, "
                "`key notin (v1,v2)`, `key` (present), `!key` (absent).",
            ),
            LIMIT,
            CURSOR,
            OWNER,
            ALL_USERS,
        ],
        problems=(401, 403, 422, 503),
    ),
    Route(
        "get", "/jobs/{job_id}", "Get a job", 200, Job, params=[ID], problems=(401, 403, 404, 503)
    ),
    Route(
        "patch",
        "/jobs/{job_id}",
        "Change a job's schedule, parameters, options, name or labels",
        200,
        Job,
        JobPatch,
        [ID],
        problems=(400, 401, 403, 404, 409, 413, 415, 422, 503),
    ),
    Route(
        "delete",
        "/jobs/{job_id}",
        "Delete a job and its runs (its audit records stay)",
        204,
        None,
        params=[ID],
        problems=(401, 403, 404, 503),
    ),
    Route(
        "post",
        "/jobs/{job_id}/pause",
        "Pause a job",
        200,
        Job,
        params=[ID],
        problems=(401, 403, 404, 409, 503),
    ),
    Route(
        "post",
        "/jobs/{job_id}/resume",
        "Resume a paused job from now",
        200,
        Job,
        params=[ID],
        problems=(401, 403, 404, 409, 503),
    ),
    Route(
        "post",
        "/jobs/{job_id}/cancel",
        "Cancel a job and its running run",
        200,
        Job,
        params=[ID],
        problems=(401, 403, 404, 409, 503),
    ),
    Route(
        "post",
        "/jobs/{job_id}/trigger",
        "Run a job once now",
        201,
        Execution,
        params=[ID],
        problems=(401, 403, 404, 409, 429, 503),
    ),
    Route(
        "get",
        "/jobs/{job_id}/executions",
        "A job's runs, newest first",
        200,
        Page[Execution],
        params=[ID, LIMIT, CURSOR],
        problems=(401, 403, 404, 422, 503),
    ),
    Route(
        "get",
        "/jobs/{job_id}/executions/{execution_id}",
        "One run of a job, with its attempts",
        200,
        Execution,
        params=[
            ID,
            EXECUTION_ID,
        ],
        problems=(401, 403, 404, 503),
    ),
    Route(
        "get",
        "/jobs/{job_id}/audit",
        "A job's audit records (who changed what, when), newest first",
        200,
        Page[AuditRecord],
        params=[ID, LIMIT, CURSOR],
        problems=(401, 403, 404, 422, 503),
    ),
    Route(
        "get",
        "/audit",
        "Audit records of your jobs (an admin: anyone's), newest first",
        200,
        Page[AuditRecord],
        params=[
            OWNER,
            Param("actor", {"type": "string"}, "Only changes made by this user."),
            Param("jobId", {"type": "string"}, "Only records of this job."),
            ALL_USERS,
            LIMIT,
            CURSOR,
        ],
        problems=(401, 403, 422, 503),
    ),
    Route(
        "get",
        "/jobs/{job_id}/upcoming",
        "A job's next scheduled times, with marks where DST shifts, doubles or drops one",
        200,
        JobFireTimes,
        params=[ID, COUNT],
        problems=(401, 403, 404, 422, 503),
    ),
    Route(
        "get",
        "/jobs/{job_id}/explain",
        "Why a job's next run has not started (or its last expected run did not happen)",
        200,
        Explanation,
        params=[ID],
        problems=(401, 403, 404, 422, 503),
    ),
    Route(
        "get",
        "/schedules/preview",
        "The next fire times of a cron expression",
        200,
        FireTimes,
        params=[
            Param("expression", {"type": "string"}, "A cron expression.", required=True),
            Param("timezone", {"type": "string", "default": "UTC"}, "An IANA time zone."),
            Param("after", INSTANT, "Fire times strictly after this instant (default: now)."),
            COUNT,
            Param(
                "gap",
                {"type": "string", "enum": ["shift", "skip"], "default": "shift"},
                "Spring-forward rule.",
            ),
            Param(
                "fold",
                {"type": "string", "enum": ["once", "both"], "default": "once"},
                "Fall-back rule.",
            ),
        ],
        problems=(401, 422),
    ),
    Route("get", "/tasks", "The task catalog", 200, TaskList),
    Route(
        "get",
        "/jobs/{job_id}/executions/{execution_id}/notifications",
        "The webhook delivery attempts of a run's notification, in order",
        200,
        NotificationAttemptList,
        params=[
            ID,
            Param("execution_id", {"type": "string"}, "The run's id.", where="path", required=True),
        ],
        problems=(401, 403, 404, 503),
    ),
    Route(
        "get",
        "/me/notifications",
        "Your default webhook, for your jobs without a notify of their own (secret not shown)",
        200,
        NotificationDefault,
        problems=(401, 403, 503),
    ),
    Route(
        "put",
        "/me/notifications",
        "Set (notify: null removes) your default webhook",
        200,
        NotificationDefault,
        NotificationDefaultIn,
        problems=(400, 401, 403, 413, 422, 503),
    ),
    Route(
        "get",
        "/executions",
        "Runs across your jobs (an admin: anyone's), newest scheduled first: by default the "
        "dead letters (FAILED: runs that failed their last attempt)",
        200,
        Page[Execution],
        params=[
            Param("status", _enum(ExecutionStatus), "Only runs in this status (default FAILED)."),
            Param("taskId", {"type": "string"}, "Only runs of this task."),
            Param("from", INSTANT, "Scheduled at or after (RFC 3339 with offset)."),
            Param("to", INSTANT, "Scheduled before (RFC 3339 with offset)."),
            Param(
                "error",
                {"type": "string", "maxLength": 200},
                "Only runs whose error contains this text (case-insensitive).",
            ),
            Param(
                "labels",
                {"type": "string", "examples": ["team=billing,env!=dev"]},
                "Only runs whose job matches this label selector (syntax as `GET /jobs`).",
            ),
            LIMIT,
            CURSOR,
            OWNER,
            ALL_USERS,
        ],
        problems=(401, 403, 422, 503),
    ),
    Route(
        "get",
        "/stats/overview",
        "The last hour of your runs: per minute by final status, failure rate, "
        "schedule-to-start delay p50/p95/p99 (replays and backfilled runs left out: their "
        "scheduledFor lies in the past by design; they still count per minute and status), "
        "unfinished runs per queue",
        200,
        StatsOverview,
        params=[OWNER, ALL_USERS],
        problems=(401, 403, 422, 503),
    ),
    Route(
        "get",
        "/stats/upcoming",
        "A 7-day heatmap by hour of your jobs' fire times, with DST marks",
        200,
        UpcomingHeatmap,
        params=[
            Param("timezone", {"type": "string", "default": "UTC"}, "The heatmap's IANA zone."),
            OWNER,
            ALL_USERS,
        ],
        problems=(401, 403, 422, 503),
    ),
    Route(
        "post",
        "/jobs/{job_id}/executions/{execution_id}/replay",
        "Replay a finished run: a new run (new id, replayOf = this one), dispatched now. A run "
        "that has a replay already is a 409 already_replayed (replayId: its latest replay) "
        "unless force=true; of concurrent replays of one run without force, one is created and "
        "the others are that 409",
        201,
        Execution,
        params=[
            ID,
            EXECUTION_ID,
            Param(
                "force",
                {"type": "string", "enum": ["true", "false"], "default": "false"},
                "Replay the run even if it has a replay already.",
            ),
        ],
        problems=(401, 403, 404, 409, 422, 429, 503),
    ),
    Route(
        "post",
        "/jobs/{job_id}/backfill",
        "Create (or, dryRun, list) the runs a cron or interval job would have had in a past "
        "range (at most 1000)",
        200,
        BackfillResult,
        BackfillRequest,
        [ID],
        problems=(400, 401, 403, 404, 409, 413, 422, 429, 503),
    ),
    Route(
        "post",
        "/bulk/replay",
        "Replay every run a filter selects, in the background (progress: GET /bulk/{id})",
        202,
        BulkAction,
        BulkCreate,
        problems=(400, 401, 403, 413, 422, 503),
    ),
    Route(
        "post",
        "/bulk/cancel",
        "Cancel every run in progress a filter selects, in the background",
        202,
        BulkAction,
        BulkCreate,
        problems=(400, 401, 403, 413, 422, 503),
    ),
    Route(
        "get",
        "/bulk/{bulk_id}",
        "A bulk action: its status, counts (done, skipped, failed), filter and actor",
        200,
        BulkAction,
        params=[
            Param("bulk_id", {"type": "string"}, "The action's id.", where="path", required=True)
        ],
        problems=(401, 403, 404, 503),
    ),
    Route(
        "get",
        "/cluster",
        "Admins: schedulers and their partition leases, queues and their depth, workers and "
        "their in-flight runs",
        200,
        ClusterView,
        problems=(401, 403, 422, 503),
    ),
    Route("get", "/healthz", "The process is alive", 200, Health, problems=(), public=True),
    Route("get", "/readyz", "NATS and the store answer", 200, Health, problems=(503,), public=True),
]
"""Every operation of the HTTP API. /ws, /metrics, /openapi.json, /docs and the dashboard's
/ui are described in the README (they are not JSON request/response operations)."""

UNDOCUMENTED = frozenset(
    {"/ws", "/metrics", "/openapi.json", "/docs", "/docs/assets/{name}", *dashboard.ROUTE_PATHS}
)

PROBLEM_TEXT = {
    400: "Malformed JSON.",
    401: "Missing or invalid bearer token.",
    403: "The token does not allow this: read-only, or another user's records without admin.",
    404: "No such job (or run of it) for this user.",
    409: "The job's status does not allow this, the Idempotency-Key was used for another body, "
    "or another of your jobs has this `name` (`name_taken`).",
    413: "The body is too large.",
    415: "The body is not declared JSON: send `Content-Type: application/json`.",
    422: "Invalid input; `errors` names each field and the reason (a duplicate JSON key and a "
    "repeated query parameter are invalid too).",
    429: "A per-user quota (`limit` names it) does not allow this now; `Retry-After` says when "
    "to retry, when waiting helps.",
    503: "The store (or NATS) cannot be reached right now; nothing was changed. Retry.",
}


DESCRIPTION = """A distributed job scheduler.

- Every operation but health needs `Authorization: Bearer <JWT>` (**Authorize** above, on
  `/docs`); `jobsched token --user alice` mints one, `jobsched dev` prints one.
- Errors are [RFC 9457](https://www.rfc-editor.org/rfc/rfc9457) problem details
  (`application/problem+json`) with a stable `code`; a 422 names each invalid field in `errors`.
- Instants are RFC 3339 in UTC; a duration is in the unit its name ends with
  (`timeoutSeconds`, `jitterMs`)."""
"""The document's description (CommonMark, as OpenAPI's descriptions are)."""

SPHINX_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr):`~?([^`]+)`")
SNAKE_SPAN = re.compile(r"``([a-z]+(?:_[a-z]+)+)``")
"""A docstring's code span of a Python field name (``max_attempts``): the API's is camelCase."""


def _camel_span(match: re.Match[str]) -> str:
    first, *rest = match.group(1).split("_")
    return f"`{first}{''.join(w.capitalize() for w in rest)}`"


def openapi_document(server_url: str = "/", task_ids: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document (a JSON-able dict); ``task_ids`` (the catalog) constrains
    ``taskId``."""
    types = [Job, JobCreate, JobPatch, Execution, Page[Job], Page[Execution], Problem, Health,
             FireTimes, TaskList, Page[AuditRecord], Explanation, NotificationAttemptList,
             NotificationDefault, NotificationDefaultIn, BackfillRequest, BackfillResult,
             BulkCreate, BulkAction, StatsOverview, UpcomingHeatmap, JobFireTimes,
             ClusterView]  # fmt: skip
    (_, *_refs), components = msgspec.json.schema_components(types, ref_template=REF)
    names = {t: _name(t) for t in types}
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.operation_id,
            "tags": [r.tag],
            "responses": {},
        }
        params = [
            {"name": p.name, "in": p.where, "required": p.required or p.where == "path",
             "description": p.description, "schema": p.schema}
            for p in r.params
        ] + [
            {"name": h, "in": "header", "required": False, "description": text,
             "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
            for h, text in r.headers.items()
        ]  # fmt: skip
        if params:
            op["parameters"] = params
        if r.body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": REF.format(name=names[r.body])}}
                },
            }
        if r.response is None:
            op["responses"][str(r.status)] = {"description": HTTPStatus(r.status).phrase}
        else:
            schema = {"$ref": REF.format(name=names[r.response])}
            op["responses"][str(r.status)] = {
                "description": HTTPStatus(r.status).phrase,
                "content": {"application/json": {"schema": schema}},
            }
            if r.status == 201 and r.response is Job:
                op["responses"]["201"]["links"] = _job_links()
                op["responses"]["200"] = {
                    "description": "Replayed: the job created earlier with this Idempotency-Key.",
                    "content": {"application/json": {"schema": schema}},
                }
        for status in r.problems:
            op["responses"][str(status)] = {
                "description": PROBLEM_TEXT[status],
                "content": {
                    "application/problem+json": {"schema": {"$ref": REF.format(name="Problem")}}
                },
            }
        if not r.public:
            op["security"] = [{"bearer": []}]
        paths.setdefault(r.path, {})[r.method] = op
    _require_always_present(components, [r.response for r in ROUTES if r.response is not None])
    for schema in components.values():
        if "description" in schema:  # docstrings: a Sphinx role is a code span in CommonMark
            text = SPHINX_ROLE.sub(r"`\1`", schema["description"])
            schema["description"] = SNAKE_SPAN.sub(_camel_span, text)
    if task_ids:
        components["JobCreate"]["properties"]["taskId"]["enum"] = sorted(task_ids)
    return {
        "openapi": "3.1.0",
        "tags": [{"name": tag, "description": text} for tag, text in TAG_DESCRIPTIONS.items()],
        "info": {
            "title": "jobsched",
            "version": "1.0.0",
            "description": DESCRIPTION,
        },
        "servers": [{"url": server_url}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
        },
    }


def _require_always_present(components: dict[str, Any], responses: list[Any]) -> None:
    """Mark every field of a response struct that is encoded with ``omit_defaults=False`` (a
    job, a run, a page...: each field always present, ``null`` included) as ``required``, so a
    generated client types ``job.status`` as a ``JobStatus``, not "a JobStatus or unset".

    Structs reachable from a request body (``CronScheduleIn``...) are not response structs and
    are left as they are: there a field with a default may be left out.
    """
    seen: dict[str, msgspec.inspect.StructType] = {}
    stack = list(msgspec.inspect.multi_type_info(responses))
    while stack:
        t = stack.pop()
        if isinstance(t, msgspec.inspect.StructType):
            name = _name(t.cls)
            if name in seen:
                continue
            seen[name] = t
            stack.extend(f.type for f in t.fields)
        else:
            for attr in t.__struct_fields__:
                value = getattr(t, attr)
                nested = value if isinstance(value, tuple) else (value,)
                stack.extend(v for v in nested if isinstance(v, msgspec.inspect.Type))
    for name, t in seen.items():
        cls = getattr(t.cls, "__origin__", t.cls)
        if not cls.__struct_config__.omit_defaults and name in components:
            required = components[name].setdefault("required", [])  # the tag field is in it
            required.extend(f.encode_name for f in t.fields if f.encode_name not in required)


def _job_links() -> dict[str, Any]:
    """OpenAPI links from a created job to every operation on it (clients and fuzzers follow)."""
    links = {}
    for r in ROUTES:
        if "{job_id}" in r.path and "{execution_id}" not in r.path:
            links[r.operation_id] = {
                "operationId": r.operation_id,
                "parameters": {"job_id": "$response.body#/id"},
            }
    return links


def _name(t: Any) -> str:
    schema = msgspec.json.schema(t, ref_template=REF)
    ref = schema.get("$ref", "")
    return str(ref.rsplit("/", 1)[-1])


def docs_body(doc: dict[str, Any]) -> str:
    """A plain HTML listing of the document (the ``/docs`` page without JavaScript): every
    operation with its parameters, its request body's fields and its answers (status and text),
    then the schemas."""
    schemas = doc["components"]["schemas"]
    out = [
        f"<h1>{html.escape(doc['info']['title'])} API</h1>",
        f"<p>{html.escape(doc['info']['description'])}</p>",
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a> (OpenAPI 3.1).</p>",
    ]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out.append(f"<h2><code>{method.upper()} {html.escape(path)}</code></h2>")
            out.append(f"<p>{html.escape(op['summary'])}</p>")
            rows = [(p["name"], p["in"], p["description"]) for p in op.get("parameters", [])]
            if "requestBody" in op:
                ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                body = schemas[ref.rsplit("/", 1)[-1]]
                required = set(body.get("required", []))
                rows += [
                    (name, "body" + (", required" if name in required else ""), _about(prop))
                    for name, prop in body.get("properties", {}).items()
                ]
            if rows:
                out.append("<table><tr><th>field</th><th>in</th><th>description</th></tr>")
                out += [
                    f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(where)}</td>"
                    f"<td>{html.escape(text)}</td></tr>"
                    for name, where, text in rows
                ]
                out.append("</table>")
            answers = "; ".join(
                html.escape(" ".join(dict.fromkeys([code, HTTPStatus(int(code)).phrase, text])))
                for code, text in ((c, r["description"]) for c, r in op["responses"].items())
            )
            out.append(f"<p>Answers: {answers}</p>")
    out.append("<h2>Schemas</h2>")
    for name, schema in schemas.items():
        props = ", ".join(f"<code>{html.escape(k)}</code>" for k in schema.get("properties", {}))
        kind = html.escape(str(schema.get("type", "")))
        out.append(f"<p><b>{html.escape(name)}</b>: {props or kind}</p>")
    return "\n".join(out)


def _about(prop: dict[str, Any]) -> str:
    """A property's description and type, for the plain listing."""
    variants = prop.get("anyOf", [prop])
    types = [v.get("format", v.get("type", v.get("$ref", "").rsplit("/", 1)[-1])) for v in variants]
    return " ".join(filter(None, [prop.get("description"), f"({' or '.join(map(str, types))})"]))
