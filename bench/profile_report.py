"""Summarise py-spy ``--format raw`` profiles (collapsed stacks) written by ``--profile DIR``.

For each file: total samples (all threads; idle ones only if recorded with ``--profile-idle``),
the top frames by *self* samples (top of the stack, with its line: C code such as SQLite shows as
the Python line that called it, e.g. ``aiosqlite/core.py:63`` = ``result = function()`` on
aiosqlite's thread), the jobsched functions by *inclusive* samples (anywhere on the stack), as
% of samples, and self samples grouped by top-level package.

    .venv/bin/python -m bench.profile_report DIR_OR_FILES... [--top 15]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from bench.common import table

FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")


def _split(frame: str) -> tuple[str, str, str]:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip(), "", ""
    return m["fn"], _short(m["file"]), m["line"] or ""


PROJECT = ("core/", "store/", "bus/", "actors/", "gateway/", "jobsched/")
DRIVERS = ("jobsched/cli.py", "jobsched/__main__.py", "jobsched/runtime.py")


def _is_project(file: str) -> bool:
    return file.startswith(PROJECT) and not file.startswith(DRIVERS)


def _short(path: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def summarize(path: Path, top: int) -> str:
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    total = 0
    for entry in path.read_text(errors="replace").splitlines():
        stack, _, count = entry.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        fn, file, line = _split(frames[-1])
        self_c[f"{fn} ({file}:{line})"] += n
        by_file[file.split("/")[0] if "/" in file else file] += n
        seen = set()
        for f in frames:
            fn, file, _ = _split(f)
            key = f"{fn} ({file})"
            if key not in seen and _is_project(file):
                seen.add(key)
                incl[key] += n
    if total == 0:
        return f"{path.name}: no samples"

    def rows(c: Counter[str]) -> list[list[str]]:
        return [[k[:110], f"{100 * v / total:.1f} %"] for k, v in c.most_common(top)]

    return "\n".join(
        [
            f"\n### {path.name}: {total:,} samples",
            table(["self: function (file:line)", "% samples"], rows(self_c)),
            "",
            table(["inclusive, jobsched code only: function (file)", "% samples"], rows(incl)),
            "",
            table(["self by top-level file/package", "% samples"], rows(by_file)),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("paths", nargs="+")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    files: list[Path] = []
    for s in args.paths:
        path = Path(s)
        files.extend(sorted(path.glob("*.txt")) if path.is_dir() else [path])
    for f in files:
        print(summarize(f, args.top))


if __name__ == "__main__":
    main()
