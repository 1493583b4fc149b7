"""The ``jobsched`` command line: run the services, mint tokens, talk to the API.

The only place that reads the environment, configures logging and installs signal handlers.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from click.shell_completion import get_completion_class

from bus import natsconf
from bus.callout import api_inbox_prefix, callout_config
from core.access import SCOPES, Role, parse_scope
from core.errors import ConfigError, JobschedError
from core.settings import Settings, load_settings
from core.timeutil import isoformat_z
from gateway.auth import mint_token
from jobsched import (
    cli_notify,  # noqa: F401  (registers its commands in COMMANDS)
    eventloop,
)
from jobsched.cli_audit import COMMANDS as AUDIT_COMMANDS
from jobsched.cli_jobs import COMMANDS, DEV_FILE
from jobsched.cli_runs import RUN_COMMANDS
from jobsched.cli_stats import COMMANDS as STATS_COMMANDS
from jobsched.client import ApiError, JobschedClient
from jobsched.datadir import DataDirInUse, DataDirLock, write_private
from jobsched.eventloop import EventLoopChoice
from jobsched.logs import configure_logging
from jobsched.natsserver import NatsServer, find_nats_server
from jobsched.runtime import Roles, auth_secret, serve

T = TypeVar("T")
DEV_CREDENTIALS = "nats-creds"
"""Where ``jobsched dev`` keeps its NATS users' credentials (in the data dir; 0700, files 0600)."""


def _settings(**overrides: object) -> Settings:
    try:
        return load_settings(os.environ, **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as e:
        raise click.ClickException(e.message) from None


def _run_until_signal(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    on_force: Callable[[], None] | None = None,
    *,
    event_loop: EventLoopChoice = "auto",
) -> None:
    """Run ``main(stop)`` on the ``event_loop`` (:mod:`jobsched.eventloop`); SIGINT/SIGTERM
    set ``stop`` (a second signal exits at once, after ``on_force``). A start-up failure is
    printed as one line, not a traceback."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                if on_force is not None:
                    on_force()
                os._exit(130)
            click.echo("\nstopping (again to force)…", err=True)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await main(stop)

    try:
        eventloop.run(runner(), event_loop)
    except (JobschedError, OSError, BaseExceptionGroup) as e:
        raise click.ClickException(_one_line(e)) from None


def _one_line(e: BaseException) -> str:
    """The first meaningful error inside ``e`` (exception groups included), in one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, JobschedError):
        return e.message
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return f"{e.strerror or e}: another process already listens there (choose --port)"
    return f"{type(e).__name__}: {e}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobsched")
def main() -> None:
    """jobsched: a distributed job scheduler on NATS JetStream.

    Start everything on this machine with `jobsched dev`, then use `jobsched submit`,
    `jobsched list` and `jobsched get` in another terminal.
    """


# --- services --------------------------------------------------------------------------------


@main.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where SQLite, NATS storage, reports and the dev token live. [default: ./data]",
)
@click.option(
    "--port", type=int, default=None, help="Gateway port; 0 picks a free one. [default: 8080]"
)
@click.option("--demo", is_flag=True, help="Submit the three example jobs once ready.")
def dev(data_dir: Path | None, port: int | None, demo: bool) -> None:
    """Everything in one process: nats-server, SQLite store, gateway, scheduler, worker, notifier.

    One per data directory: a second one on the same directory exits at once (status 1) naming
    the running one, and touches none of its files.
    """
    settings = _settings(data_dir=str(data_dir) if data_dir else None, http_port=port)
    if not settings.scheduler.scheduler_id:
        settings = settings.changed(scheduler_id=f"dev-{os.uname().nodename}")
    configure_logging(settings.log_format, settings.log_level)
    data = Path(settings.data_dir).resolve()
    try:
        binary = find_nats_server(os.environ)
    except ConfigError as e:
        raise click.ClickException(e.message) from None
    lock = DataDirLock(data)
    try:
        lock.acquire()
    except DataDirInUse as e:
        raise click.ClickException(e.message) from None
    except OSError as e:
        raise click.ClickException(f"cannot lock the data dir {data}: {e}") from None
    try:
        _dev(settings, data, binary, lock, demo)
    finally:
        lock.release()


def _dev(settings: Settings, data: Path, binary: str, lock: DataDirLock, demo: bool) -> None:
    """``jobsched dev`` once it holds the data directory's lock.

    Its nats-server requires authentication: one static user per role (:mod:`bus.auth`),
    whose credentials are generated once into ``<data>/nats-creds`` and used by this process's
    connections; API clients connect with their bearer token, admitted by this gateway's auth
    callout (:mod:`bus.callout`) with permissions of their own."""
    creds = data / DEV_CREDENTIALS
    prefix, queues = settings.nats.subject_prefix, settings.worker.queues
    _, block, seed_file = callout_config(creds, prefix, queues)
    settings = settings.changed(
        nats_credentials_dir=str(creds),
        nats_credentials_file="",
        nats_callout_issuer_seed_file=str(seed_file),
    )
    server = NatsServer(
        binary,
        data / "nats",
        log_file=data / "nats-server.log",
        sync_interval=settings.nats.sync_interval,
        authorization=block,
    )
    (data / DEV_FILE).unlink(missing_ok=True)
    url = server.start()

    async def main_(stop: asyncio.Event) -> None:
        started: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

        async def announce() -> None:
            info = await started
            secret = auth_secret(settings, create_in=data)
            token = mint_token(secret, "dev", ttl=timedelta(days=30))
            dev_info = {
                "url": info["url"],
                "token": token,
                "nats": url,
                "natsInboxPrefix": api_inbox_prefix(token),
            }
            write_private(data / DEV_FILE, json.dumps(dev_info))
            lock.record(url=info["url"])
            click.echo(_ready_banner(info["url"], data, url))
            if demo:
                await submit_demo_jobs(info["url"], token)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(announce(), name="announce")
            await serve(
                settings,
                Roles(gateway=True, scheduler=True, worker=True, notifier=True),
                stop,
                servers=url,
                started=started,
                secret_dir=data,
                freeze_heap=True,
            )

    try:
        _run_until_signal(main_, on_force=server.kill, event_loop=settings.event_loop)
    finally:
        server.stop()
        (data / DEV_FILE).unlink(missing_ok=True)


def _ready_banner(url: str, data: Path, nats_url: str) -> str:
    """What ``jobsched dev`` prints once ready: where everything is, never a secret (the
    token is in ``dev.json``, 0600; ``jobsched dev-env`` reads it)."""
    me = _self_command()
    default = data.resolve() == Path("data").resolve()
    where = " in this directory" if default else ""
    data_arg = "" if default else f" --data-dir {shlex.quote(str(data.resolve()))}"
    finds = (
        f"in this directory the CLI finds this server and its token in {data / DEV_FILE}"
        if default
        else "after the eval line the CLI finds this server and its token"
    )
    return f"""
jobsched dev is ready
  API       {url}
  Dashboard {url}/ui/  (sign in with the token `{me} dev-env --token{data_arg}` prints)
  NATS      {nats_url}  (authenticated: NATS-API clients connect with the token)
  data dir  {data}
  token     a 30-day token of user "dev" is in {data / DEV_FILE} (0600)
  admin     `{me} token --user root --role admin{data_arg}` prints an admin's token (Cluster page)

Try, in another terminal{where}:
  eval "$({me} dev-env{data_arg})"   # sets URL, TOKEN, NATS_URL, … and JOBSCHED_DATA_DIR
  curl -s -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \\
       -d '{{"taskId": "noop"}}' $URL/jobs
  {me} submit generate_report --param reportType=sales --param region=eu-west
  {me} list
({finds}; Ctrl-C stops)
"""


def _self_command() -> str:
    """How to run this very ``jobsched`` from a shell: ``jobsched`` when that is on PATH,
    else its path (``.venv/bin/jobsched`` without an activated venv) or ``python -m``."""
    me = Path(sys.argv[0]).resolve()
    on_path = shutil.which("jobsched")
    if on_path and Path(on_path).resolve() == me:
        return "jobsched"
    if me.name == "jobsched" and os.access(me, os.X_OK):
        try:
            return shlex.quote(str(me.relative_to(Path.cwd())))
        except ValueError:
            return shlex.quote(str(me))
    return f"{shlex.quote(sys.executable)} -m jobsched"


async def submit_demo_jobs(url: str, token: str) -> None:
    """The three example jobs of the product design, once per data directory.

    Each is created with a fixed ``Idempotency-Key``, so restarting ``make run`` does not add
    them again (a 409 means an earlier run created it).
    """
    at = datetime.now(UTC) + timedelta(seconds=10)
    demo_jobs: list[tuple[str, dict[str, Any]]] = [
        ("demo-immediate", {"taskId": "generate_report",
                            "parameters": {"reportType": "sales", "region": "ACME-42"},
                            "schedule": {"type": "immediate"}}),
        ("demo-once", {"taskId": "cleanup_export", "parameters": {"exportId": "ACME-42-2026"},
                       "schedule": {"type": "once", "executeAt": at.isoformat()}}),
        ("demo-cron", {"taskId": "generate_report",
                       "parameters": {"reportType": "usage", "region": "ACME-42"},
                       "schedule": {"type": "cron", "expression": "* * * * *",
                                    "timezone": "Europe/Berlin"}}),
    ]  # fmt: skip
    async with JobschedClient(url, token) as client:
        for key, body in demo_jobs:
            try:
                job, replayed = await client.create_job_idempotent(body, key)
            except ApiError as e:
                if e.status != 409:
                    raise
                click.echo(f"demo: {key} was submitted by an earlier run (see `jobsched list`)")
                continue
            kind = body["schedule"]["type"]
            verb = "already submitted" if replayed else "submitted"
            click.echo(
                f"demo: {verb} {job.task_id} ({kind}) as job {job.id}, next run "
                f"{isoformat_z(job.next_run_at) if job.next_run_at else '-'}"
            )


def _service(roles: Roles) -> None:
    settings = _settings()
    configure_logging(settings.log_format, settings.log_level)
    _run_until_signal(
        lambda stop: serve(settings, roles, stop, freeze_heap=True), event_loop=settings.event_loop
    )


@main.command(name="dev-env")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="JOBSCHED_DATA_DIR",
    default=Path("data"),
    show_default=True,
    help="the running `jobsched dev`'s data directory (env: JOBSCHED_DATA_DIR)",
)
@click.option(
    "--token",
    "token_only",
    is_flag=True,
    help="print only the token (to paste into the dashboard's sign-in box)",
)
def dev_env(data_dir: Path, token_only: bool) -> None:
    """Print shell exports of the running `jobsched dev`: URL, TOKEN, NATS_URL and
    NATS_INBOX_PREFIX (a NATS-API client connects with the token as its NATS token and may read
    replies on that inbox prefix only).

    Use as `eval "$(jobsched dev-env)"` in the directory where `jobsched dev` runs, or with
    `--data-dir` (JOBSCHED_DATA_DIR) naming its data directory. It also exports
    JOBSCHED_DATA_DIR, so the other commands find the same server. `--token` prints the token
    alone.
    """
    dev_file = data_dir / DEV_FILE
    try:
        info = json.loads(dev_file.read_text())
    except FileNotFoundError:
        raise click.ClickException(
            f"{dev_file} not found: start `jobsched dev` first (or pass its --data-dir)"
        ) from None
    if token_only:
        click.echo(info["token"])
        return
    names = {
        "URL": "url",
        "TOKEN": "token",
        "NATS_URL": "nats",
        "NATS_INBOX_PREFIX": "natsInboxPrefix",
    }
    exports = [f"{var}={shlex.quote(info[key])}" for var, key in names.items() if key in info]
    exports.append(f"JOBSCHED_DATA_DIR={shlex.quote(str(data_dir.resolve()))}")
    click.echo("export " + " ".join(exports))


@main.command()
def gateway() -> None:
    """The HTTP API (JOBSCHED_NATS_URL, JOBSCHED_STORE_URL, JOBSCHED_AUTH_SECRET)."""
    _service(Roles(gateway=True))


@main.command()
def scheduler() -> None:
    """A scheduler and status recorder (JOBSCHED_NATS_URL, JOBSCHED_STORE_URL)."""
    _service(Roles(scheduler=True))


@main.command()
def worker() -> None:
    """A worker executing runs of JOBSCHED_QUEUES (needs JOBSCHED_NATS_URL only)."""
    _service(Roles(worker=True))


@main.command()
def notifier() -> None:
    """The run notifier: webhooks for finished runs (JOBSCHED_NATS_URL, JOBSCHED_STORE_URL;
    JOBSCHED_HTTP_ALLOWED_NETWORKS allows internal receivers)."""
    _service(Roles(notifier=True))


# --- deployment: the bus users ---------------------------------------------------------------

NATS_SECRET = "jobsched-nats"
"""The Kubernetes Secret of the processes' NATS credentials files."""
NATS_SERVER_SECRET = "jobsched-nats-server"
"""The Kubernetes Secret of the NATS servers' password hashes."""


@main.command(name="nats-config")
@click.option("--prefix", default=None, help="JOBSCHED_SUBJECT_PREFIX [default: from env].")
@click.option("--queues", default=None, help="The workers' JOBSCHED_QUEUES [default: from env].")
@click.option(
    "--helm",
    "helm_secret",
    default=None,
    metavar="SECRET",
    help="Print values for the NATS Helm chart instead, the hashes from this Secret.",
)
def nats_config(prefix: str | None, queues: str | None, helm_secret: str | None) -> None:
    """Print the nats-server `authorization` block of the deployment's bus users.

    One user per role with exactly its permissions (bus/auth.py); the passwords are variable
    references, NATS_<ROLE>_PASSWORD, set in each server's environment (`jobsched
    nats-credentials`). deploy/nats/auth.conf and deploy/kubernetes/nats/auth-values.yaml are
    this output (`make nats-config`).
    """
    settings = _settings(subject_prefix=prefix, queues=queues)
    subject_prefix, queue_names = settings.nats.subject_prefix, settings.worker.queues
    command = f"jobsched nats-config --prefix {subject_prefix} --queues {','.join(queue_names)}"
    conf = natsconf.auth_conf(subject_prefix, queue_names, command)
    if helm_secret is None:
        click.echo(conf, nl=False)
    else:
        values = natsconf.helm_values(conf, f"{command} --helm {helm_secret}", helm_secret)
        click.echo(values, nl=False)


@main.command(name="nats-credentials")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--prefix", default=None, help="JOBSCHED_SUBJECT_PREFIX [default: from env].")
@click.option(
    "--kubernetes",
    is_flag=True,
    help=f"Also print the Secrets {NATS_SECRET} and {NATS_SERVER_SECRET} for kubectl apply -f -.",
)
@click.option("--namespace", default="jobsched", show_default=True)
@click.option("--nats-namespace", default="nats", show_default=True)
def nats_credentials(
    directory: Path, prefix: str | None, kubernetes: bool, namespace: str, nats_namespace: str
) -> None:
    """Create the bus users' secrets in DIRECTORY (once; a re-run keeps them).

    nats-<role>.json per role (each process's JOBSCHED_NATS_CREDENTIALS_DIR holds its own
    roles' files) and nats-server.env (the servers' password hashes, NATS_<ROLE>_PASSWORD).
    Never commit them.
    """
    settings = _settings(subject_prefix=prefix)
    try:
        natsconf.write_secrets(directory, settings.nats.subject_prefix)
    except ConfigError as e:
        raise click.ClickException(e.message) from None
    if kubernetes:
        click.echo(
            natsconf.kubernetes_secrets(
                directory, namespace, nats_namespace, NATS_SECRET, NATS_SERVER_SECRET
            ),
            nl=False,
        )
    else:
        click.echo(f"NATS credentials in {directory} (keep them out of version control)", err=True)


@main.command()
@click.option("--user", required=True, help="The user the token identifies (its `sub`).")
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default=Role.USER.value,
    show_default=True,
    help="user: the user's own jobs; admin: every user's jobs (each action recorded as the "
    "admin's).",
)
@click.option(
    "--scope",
    default=" ".join(sorted(SCOPES)),
    show_default=True,
    help="What the token may do, space-separated: jobs:read, jobs:write "
    "('jobs:read' alone is a read-only token).",
)
@click.option(
    "--ttl-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=24.0,
    show_default=True,
    help="Validity.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Use the dev secret kept in this data dir when JOBSCHED_AUTH_SECRET is unset.",
)
def token(user: str, role: str, scope: str, ttl_hours: float, data_dir: Path | None) -> None:
    """Print a bearer token for USER signed with the configured secret."""
    if not user.strip():
        raise click.BadParameter("must not be empty", param_hint="--user")
    try:
        scopes = parse_scope(scope)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--scope") from None
    settings = _settings(data_dir=str(data_dir) if data_dir else None)
    dev_dir = Path(settings.data_dir)
    has_dev_secret = (dev_dir / "auth-secret").exists()
    try:
        secret = auth_secret(settings, create_in=dev_dir if has_dev_secret else None)
    except ConfigError as e:
        raise click.ClickException(e.message) from None
    click.echo(
        mint_token(secret, user, ttl=timedelta(hours=ttl_hours), role=Role(role), scopes=scopes)
    )


# --- client commands -------------------------------------------------------------------------


for _command in [*COMMANDS, *RUN_COMMANDS, *AUDIT_COMMANDS, *STATS_COMMANDS]:
    main.add_command(_command)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script (click's): `eval "$(jobsched completion bash)"`, e.g.
    in ~/.bashrc; zsh and fish likewise."""
    cls = get_completion_class(shell)
    assert cls is not None  # the choices are click's own shells
    click.echo(cls(main, {}, "jobsched", "_JOBSCHED_COMPLETE").source())


if __name__ == "__main__":
    sys.exit(main())
