"""One ``jobsched dev`` per data directory: an OS-level lock taken before anything is touched.

The lock is ``flock(2)`` (exclusive, non-blocking) on ``<data dir>/dev.lock``. The kernel
releases it when the holder's last descriptor closes, so a process that dies, SIGKILL included,
never leaves a stale lock behind, and there is no pid to check for liveness. The descriptor is
not inherited by child processes (Python opens it close-on-exec, and nats-server is started with
``close_fds``), so a nats-server orphaned by a SIGKILL of ``dev`` does not hold it: the next
``dev`` takes the lock and then stops that orphan (:mod:`jobsched.natsserver`).

The lock file holds what the holder recorded (its pid once locked, its API URL once ready), so
a refused second instance can name it; an instance that fails to take the lock only reads it.
The file is never deleted (deleting a lock file would let two processes lock two different files
of the same name).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from types import TracebackType

from core.errors import JobschedError

LOCK_FILE = "dev.lock"


class DataDirInUse(JobschedError):
    """Another live process holds the data directory's lock.

    Attributes:
        data_dir: the directory (absolute).
        pid: the holder's pid, or None if it has not recorded it yet (or it is unreadable).
        url: the holder's API URL, or None if it is not ready yet.
    """

    code = "data_dir_in_use"

    def __init__(self, data_dir: Path, pid: int | None, url: str | None) -> None:
        self.data_dir = data_dir
        self.pid = pid
        self.url = url
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        holder += f", API {url}" if url else ", still starting"
        super().__init__(
            f"the data dir {data_dir} is in use by another jobsched dev ({holder}); "
            "stop that one first, or pass another --data-dir"
        )


class DataDirLock:
    """An exclusive lock on a data directory, held from :meth:`acquire` to :meth:`release`.

    Args:
        data_dir: the directory; created (with its parents) by :meth:`acquire` if missing.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        """Take the lock at once or fail; records this process's pid in the lock file.

        Raises:
            DataDirInUse: another process holds it (its pid in the message when known).
            OSError: the directory or the lock file cannot be created or opened.
        """
        if self._fd is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            pid, url = holder.get("pid"), holder.get("url")
            raise DataDirInUse(
                self.data_dir,
                pid if isinstance(pid, int) else None,
                url if isinstance(url, str) else None,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.record()
        return self

    def record(self, **info: str) -> None:
        """Record ``info`` (e.g. ``url=``) with this process's pid in the lock file, for a refused
        second instance to report. Only while the lock is held (otherwise a no-op)."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps({"pid": os.getpid(), **info}).encode(), 0)

    def release(self) -> None:
        """Release the lock (idempotent). The lock file stays, for the next holder."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, object]:
    """What the holder recorded; empty while it is between taking the lock and writing."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, created 0600 (the owner's alone, not even for an instant):
    for files that hold a secret, such as ``dev.json``'s token."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # an existing file keeps its mode through O_CREAT
