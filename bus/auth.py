"""Who may do what on the bus: one NATS user per role, with least-privilege permissions.

Every permission list is derived here from :class:`bus.nats.BusConfig`'s own subject, stream,
consumer and bucket names, so a renamed subject changes its permission too. The server side is
nats-server's static ``authorization { users: [...] }`` block (server 2.0+; every feature used
here: ``allow_responses``, per-stream JetStream API subjects, ``$JS.API.DIRECT.GET``, KV
subjects ``$KV.<bucket>.>``, is in the oldest supported 2.12):

One user per NATS connection of a jobsched process (:class:`jobsched.runtime.Connection`),
so a process holds only the passwords of the roles it runs:

* ``scheduler``: the only role that creates and updates the streams and buckets (work, status,
  leases, cancel markers); publishes runs and their events, owns the lease bucket, receives job
  notices and finished-run notices, looks runs up in the work stream.
* ``recorder``: pulls the status stream's ``recorder`` consumer, publishes finished-run notices.
* ``worker``: pulls from its queues' consumers only, acks, publishes status, watches cancel
  markers, reads, writes and watches the concurrency slots (``<prefix>_slots``, :mod:`bus.slots`;
  a worker can thereby hold or free any user's slot: workers are trusted); writes presence
  keys (``<prefix>_workers``, :mod:`bus.presence`) by plain publishes to ``$KV.<bucket>.>``
  and nothing else of that bucket (no read, purge or delete of its stream). All workers share
  this one user, and static nats-server users have no per-connection subject templates (those
  are JWT-only), so a worker could write another worker's presence key — but no other
  bucket's key. It can neither publish a run nor create, update or delete a stream, nor read
  the lease bucket.
* ``gateway``: serves the NATS API (``<p>.api.>``, replies through ``allow_responses``;
  ``$SRV`` discovery of the ``jobsched`` service only), publishes notices, events, manual runs
  and cancel markers; reads (never writes) the lease bucket and the work consumers' info for
  ``GET /jobs/{id}/explain`` (:mod:`bus.inspect`) and the dashboard's Cluster page, the
  workers' presence bucket (the Cluster page; never writes), and the concurrency slots
  (``explain``).
* ``live``: reads the status stream for ``GET /ws`` (ordered consumers, direct gets).
* ``api``: an API client: requests to ``<p>.api.>`` and its own replies only.
* ``notifier``: pulls the status stream's ``notifier`` consumer (:mod:`actors.notifier`),
  nothing else: it publishes no subject, so it can neither forge a run event nor a run.
* ``callout``: the gateway's auth callout service (:mod:`bus.callout`): receives the server's
  authorization requests (``$SYS.REQ.USER.AUTH``) and answers them, nothing else.

Each user receives replies on its own inbox prefix ``_INBOX_<user>`` (nats-py's
``inbox_prefix``) and may subscribe to nothing else of the kind, so no user reads another's
replies: the server enforces it, not a convention.

A credentials file is JSON ``{"user": ..., "password": ...}``, mode 0600; passwords are 32
random bytes (hex) and never logged.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bus.nats import RECORDER_CONSUMER, BusConfig
from bus.notifier import NOTIFIER_CONSUMER
from bus.presence import bucket_name as presence_bucket_name
from bus.slots import bucket_name as slot_bucket_name
from core.errors import ConfigError

ROLES = ("scheduler", "recorder", "worker", "gateway", "live", "api", "callout", "notifier")
"""The bus roles (see the module docstring): one per NATS connection of a jobsched process
(:class:`jobsched.runtime.Connection`; ``callout``: the gateway's auth callout service), plus
``api`` for API clients without the callout."""

SERVICE_NAME = "jobsched"
"""The NATS micro service name the gateway registers (``$SRV.<verb>.jobsched``, ADR-32)."""

JS = "$JS.API"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A NATS user name and password (never printed: ``repr`` hides the password)."""

    user: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=<hidden>)"

    @property
    def inbox_prefix(self) -> str:
        """The only inbox this user may subscribe to (``_INBOX_<user>``)."""
        return inbox_prefix(self.user)


def inbox_prefix(user: str) -> str:
    return f"_INBOX_{user}"


@dataclass(frozen=True, slots=True)
class Permissions:
    """One user's NATS permissions: subjects it may publish to and subscribe to, and subjects
    it may not publish to although an allowed wildcard matches them (nats-server applies
    ``deny`` after ``allow``)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    publish_deny: tuple[str, ...] = ()


def _stream_admin(stream: str) -> list[str]:
    return [f"{JS}.STREAM.{verb}.{stream}" for verb in ("CREATE", "UPDATE", "INFO")]


def _consumer(stream: str, name: str) -> list[str]:
    """Create (both forms), inspect and pull from the durable consumer ``name`` of ``stream``,
    and acknowledge its messages."""
    return [
        f"{JS}.CONSUMER.CREATE.{stream}.{name}",
        f"{JS}.CONSUMER.CREATE.{stream}.{name}.>",
        f"{JS}.CONSUMER.DURABLE.CREATE.{stream}.{name}",
        f"{JS}.CONSUMER.INFO.{stream}.{name}",
        f"{JS}.CONSUMER.MSG.NEXT.{stream}.{name}",
        f"$JS.ACK.{stream}.{name}.>",
    ]


def _ephemeral_readers(stream: str) -> list[str]:
    """Ordered (ephemeral, push) consumers of ``stream``: a KV watch, a live-status feed."""
    return [
        f"{JS}.CONSUMER.CREATE.{stream}",
        f"{JS}.CONSUMER.CREATE.{stream}.>",
        f"{JS}.CONSUMER.INFO.{stream}.>",
        f"{JS}.CONSUMER.DELETE.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _reads(stream: str) -> list[str]:
    return [
        f"{JS}.STREAM.INFO.{stream}",
        f"{JS}.STREAM.MSG.GET.{stream}",
        f"{JS}.DIRECT.GET.{stream}",
        f"{JS}.DIRECT.GET.{stream}.>",
    ]


def _bucket(bucket: str) -> list[str]:
    """Create, read, write and list a KV bucket (stream ``KV_<bucket>``)."""
    stream = f"KV_{bucket}"
    return [
        *_stream_admin(stream),
        *_reads(stream),
        *_ephemeral_readers(stream),
        f"{JS}.STREAM.NAMES",
        f"$KV.{bucket}.>",
    ]


def role_permissions(role: str, user: str, prefix: str, queues: Sequence[str]) -> Permissions:
    """The permissions of ``role`` for the deployment of subject prefix ``prefix``.

    Args:
        role: one of :data:`ROLES`.
        user: the user's name (its inbox is ``_INBOX_<user>``).
        prefix: the subject prefix (``JOBSCHED_SUBJECT_PREFIX``).
        queues: the work queues a worker consumes (``JOBSCHED_QUEUES``).

    Raises:
        ConfigError: an unknown role.
    """
    c = BusConfig(servers=[], prefix=prefix)
    work, status = c.work_stream, c.status_stream
    leases, cancels = f"{prefix}_leases", f"{prefix}_cancel"
    slots = slot_bucket_name(prefix)
    presence = presence_bucket_name(prefix)
    inbox = f"{inbox_prefix(user)}.>"
    looks = [f"{JS}.INFO", f"{JS}.STREAM.INFO.{work}", f"{JS}.STREAM.INFO.{status}"]
    cancel_reader = [
        f"{JS}.STREAM.INFO.KV_{cancels}",
        *_ephemeral_readers(f"KV_{cancels}"),
    ]
    if role == "scheduler":
        publish = [
            *looks,
            *_stream_admin(work),
            *_stream_admin(status),
            f"{prefix}.work.>",
            f"{prefix}.status.>",
            *_reads(work),
            f"{JS}.CONSUMER.INFO.{work}.*",
            f"{JS}.CONSUMER.INFO.{status}.{RECORDER_CONSUMER}",
            *_bucket(leases),
            *_bucket(cancels),
            *_bucket(slots),
            *_bucket(presence),
        ]
        subscribe = [inbox, f"{prefix}.notify.*", f"{prefix}.finished"]
        return Permissions(tuple(publish), tuple(subscribe))
    if role == "recorder":
        publish = [*looks, f"{prefix}.finished", *_consumer(status, RECORDER_CONSUMER)]
        return Permissions(tuple(publish), (inbox,))
    if role == "worker":
        publish = [
            *looks,
            f"{prefix}.status.>",
            *(s for q in queues for s in _consumer(work, c.work_consumer(q))),
            f"{JS}.CONSUMER.INFO.{work}.*",
            *cancel_reader,
            *_reads(f"KV_{slots}"),
            *_ephemeral_readers(f"KV_{slots}"),
            f"$KV.{slots}.>",
            f"$KV.{presence}.>",  # its heartbeat (JetStream publishes: no API call needed)
        ]
        return Permissions(tuple(publish), (inbox,))
    if role == "gateway":
        publish = [
            *looks,
            f"{prefix}.work.>",
            f"{prefix}.status.>",
            f"{prefix}.notify.>",
            *_reads(work),
            f"{JS}.CONSUMER.INFO.{work}.*",
            f"{JS}.STREAM.INFO.KV_{cancels}",
            f"$KV.{cancels}.>",
            *_reads(f"KV_{leases}"),  # explain and the Cluster page read leases (no writes)
            *_reads(f"KV_{slots}"),
            *_reads(f"KV_{presence}"),  # the Cluster page's live workers (no writes)
        ]
        service = ["$SRV.*", f"$SRV.*.{SERVICE_NAME}", f"$SRV.*.{SERVICE_NAME}.>"]
        subscribe = [inbox, f"{prefix}.api.>", *service]
        return Permissions(tuple(publish), tuple(subscribe), allow_responses=True)
    if role == "live":
        pull = f"{JS}.CONSUMER.MSG.NEXT.{status}.*"  # its own ``live-<id>`` consumers' batches
        publish = [*looks, *_reads(status), *_ephemeral_readers(status), pull]
        recorder = [
            *_consumer(status, RECORDER_CONSUMER),
            f"{JS}.CONSUMER.DELETE.{status}.{RECORDER_CONSUMER}",
        ]
        return Permissions(tuple(publish), (inbox,), publish_deny=tuple(recorder))
    if role == "notifier":
        return Permissions((*looks, *_consumer(status, NOTIFIER_CONSUMER)), (inbox,))
    if role == "api":
        return Permissions((f"{prefix}.api.>",), (inbox,))
    if role == "callout":
        return Permissions((), ("$SYS.REQ.USER.AUTH",), allow_responses=True)
    raise ConfigError(f"unknown bus role {role!r} (one of {', '.join(ROLES)})")


def authorization_block(
    users: Iterable[tuple[Credentials, Permissions]], *, callout_issuer: str | None = None
) -> str:
    """nats-server config text: ``authorization { users: [...] }`` for these users. A server
    with it refuses every connection without one of these user names and passwords.

    With ``callout_issuer`` (an account public nkey, :mod:`bus.callout`), the block also holds
    ``auth_callout { issuer, auth_users }`` listing every one of these users: they connect as
    above, and every other connection is decided by the auth callout service."""
    users = list(users)
    entries = []
    for creds, perms in users:
        publish: dict[str, list[str]] = {"allow": list(perms.publish)}
        if perms.publish_deny:
            publish["deny"] = list(perms.publish_deny)
        permissions: dict[str, object] = {
            "publish": publish,
            "subscribe": {"allow": list(perms.subscribe)},
        }
        if perms.allow_responses:
            permissions["allow_responses"] = True
        entry = {"user": creds.user, "password": creds.password, "permissions": permissions}
        entries.append("    " + json.dumps(entry))
    callout = ""
    if callout_issuer is not None:
        auth_users = json.dumps([creds.user for creds, _ in users])
        callout = (
            f"  auth_callout {{\n    issuer: {json.dumps(callout_issuer)}\n"
            f"    auth_users: {auth_users}\n  }}\n"
        )
    return "authorization {\n  users: [\n" + ",\n".join(entries) + "\n  ]\n" + callout + "}\n"


def write_credentials(path: Path, creds: Credentials) -> None:
    """Write ``creds`` to ``path`` as JSON, created 0600 (never readable by others, not even
    for an instant), in a directory created 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"user": creds.user, "password": creds.password}, f)
    path.chmod(0o600)


def read_credentials(path: str | Path) -> Credentials:
    """The credentials in a file written by :func:`write_credentials`.

    Raises:
        ConfigError: the file cannot be read or is not such JSON (the message names the file,
            never its content).
    """
    try:
        raw = json.loads(Path(path).read_text())
        return Credentials(user=str(raw["user"]), password=str(raw["password"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"NATS credentials file {path} is not readable JSON with user and password: "
            f"{type(e).__name__}"
        ) from None


def credentials_file_name(role: str) -> str:
    """The file of ``role``'s credentials in a credentials directory: ``nats-<role>.json``."""
    return f"nats-{role}.json"


def role_users(
    directory: Path, prefix: str, queues: Sequence[str], roles: Sequence[str] = ROLES
) -> list[tuple[Credentials, Permissions]]:
    """The user of each role of deployment ``prefix`` with its permissions; the credentials are
    kept in ``directory/nats-<role>.json`` (0600; created once with a random password, reused
    afterwards)."""
    users = []
    for role in roles:
        path = directory / credentials_file_name(role)
        if path.exists():
            creds = read_credentials(path)
        else:
            creds = Credentials(user=f"{prefix}-{role}", password=secrets.token_hex(32))
            write_credentials(path, creds)
        users.append((creds, role_permissions(role, creds.user, prefix, queues)))
    return users


def generate_users(
    directory: Path,
    prefix: str,
    queues: Sequence[str],
    roles: Sequence[str] = ROLES,
    *,
    callout_issuer: str | None = None,
) -> tuple[dict[str, Path], str]:
    """:func:`role_users` and the server's ``authorization`` block for them (with
    ``auth_callout`` when ``callout_issuer`` is given, see :func:`authorization_block`).

    Returns:
        (credentials file of each role, the config text).
    """
    files = {role: directory / credentials_file_name(role) for role in roles}
    users = role_users(directory, prefix, queues, roles)
    return files, authorization_block(users, callout_issuer=callout_issuer)
