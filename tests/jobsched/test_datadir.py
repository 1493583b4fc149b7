"""The data directory lock of `jobsched dev` (flock): exclusive, reports its holder, and is
released by the kernel when the holder dies, SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobsched.datadir import LOCK_FILE, DataDirInUse, DataDirLock
from tests.support import REPO


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path: Path) -> None:
    with DataDirLock(tmp_path / "data") as lock:
        with pytest.raises(DataDirInUse) as refused:
            DataDirLock(tmp_path / "data").acquire()
        assert refused.value.pid == os.getpid() and refused.value.url is None
        assert str((tmp_path / "data").resolve()) in refused.value.message
        assert "still starting" in refused.value.message

        lock.record(url="http://127.0.0.1:8080")
        recorded = (tmp_path / "data" / LOCK_FILE).read_bytes()
        with pytest.raises(DataDirInUse, match=r"pid \d+, API http://127\.0\.0\.1:8080"):
            DataDirLock(tmp_path / "data").acquire()
        assert (tmp_path / "data" / LOCK_FILE).read_bytes() == recorded, "a refused one wrote"
    DataDirLock(tmp_path / "data").acquire().release()


def test_the_lock_of_a_killed_process_is_free_at_once(tmp_path: Path) -> None:
    code = (
        "import sys; from jobsched.datadir import DataDirLock\n"
        f"DataDirLock({str(tmp_path / 'data')!r}).acquire()\n"
        "print('locked', flush=True); sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
            with pytest.raises(DataDirInUse) as refused:
                DataDirLock(tmp_path / "data").acquire()
            assert refused.value.pid == holder.pid
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
    with DataDirLock(tmp_path / "data"):
        pass
