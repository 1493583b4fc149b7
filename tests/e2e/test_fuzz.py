"""Property-based fuzzing of the HTTP API against its OpenAPI document (schemathesis): no 5xx on
any input, every answer (4xx problems included) conforms to the document, stateful sequences
following the links from a created job."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.support import Stack

pytestmark = pytest.mark.slow


async def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(
    stack: Stack, tmp_path: Path
) -> None:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
    proc = await asyncio.create_subprocess_exec(
        binary, "run", f"{stack.url}/openapi.json",
        "-H", f"Authorization: Bearer {stack.token('fuzzer')}",
        "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        "--max-examples", "25", "--workers", "2", "--seed", "20261129",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""}, cwd=tmp_path,
    )  # fmt: skip
    async with asyncio.timeout(300):
        out, _ = await proc.communicate()
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report
    assert "generated" in report and " passed" in report
