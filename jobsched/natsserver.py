"""Run a private ``nats-server`` with JetStream (for ``jobsched dev`` and the test suite).

The server listens on 127.0.0.1 on a free port (``-p -1``) and reports it through a ports file
(``--ports_file_dir``); its JetStream storage lives in a directory of ours, so it can be stopped
and restarted on the same data.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from core.errors import ConfigError

FALLBACK_PATHS = ("/usr/sbin/nats-server", "/usr/local/bin/nats-server", "/usr/bin/nats-server")
INSTALL_HINT = (
    "nats-server (2.9 or later) was not found. Install it with your distribution's package "
    "('sudo apt-get install nats-server' on Debian/Ubuntu), or download a release from "
    "https://github.com/nats-io/nats-server/releases and put it on PATH, or set "
    "JOBSCHED_NATS_SERVER=/path/to/nats-server."
)


def find_nats_server(env: Mapping[str, str]) -> str:
    """Path of the nats-server binary: ``JOBSCHED_NATS_SERVER``, then PATH, then the usual places.

    Raises:
        ConfigError: with installation instructions when none is found.
    """
    explicit = env.get("JOBSCHED_NATS_SERVER")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise ConfigError(
            f"JOBSCHED_NATS_SERVER={explicit} is not an executable file. {INSTALL_HINT}"
        )
    found = shutil.which("nats-server")
    if found:
        return found
    for candidate in FALLBACK_PATHS:
        if os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(INSTALL_HINT)


def _stop_orphan(pid_file: Path, timeout_s: float = 10.0) -> None:
    """Stop a nats-server left running on this storage by a process that was killed (SIGKILL
    of ``jobsched dev`` leaves its child alive, holding the JetStream store)."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"nats-server" not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


class NatsServer:
    """A nats-server child process.

    Args:
        binary: path of nats-server.
        store_dir: JetStream storage directory (kept across restarts).
        port: TCP port; -1 picks a free one (read back from the ports file).
        log_file: where the server's log goes (None: discarded).
    """

    def __init__(
        self, binary: str, store_dir: Path, *, port: int = -1, log_file: Path | None = None
    ) -> None:
        self.binary = binary
        self.store_dir = Path(store_dir)
        self.port = port
        self.log_file = log_file
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 15.0) -> str:
        """Start the server and return its URL once it listens.

        Raises:
            RuntimeError: the server exited or did not report its port within ``timeout_s``.
        """
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        pid_file = self.store_dir / "nats-server.pid"
        _stop_orphan(pid_file)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        cmd = [
            self.binary,
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-js",
            "-sd", str(self.store_dir),
            "--ports_file_dir", str(ports_dir),
            "-n", f"jobsched-{os.getpid()}",
            "-P", str(pid_file),
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
        deadline = time.monotonic() + timeout_s
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
                if ports and ports.get("nats"):
                    self.url = ports["nats"][0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    return self.url
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server did not report its port within {timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate (SIGTERM, then SIGKILL after ``timeout_s``); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def restart(self, timeout_s: float = 15.0) -> str:
        """Stop and start again on the same storage and the same port."""
        self.stop()
        return self.start(timeout_s)
