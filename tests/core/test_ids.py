"""core.ids: stable partitions, deterministic execution ids, subject-safe owner keys, and every
other id format (manual runs, ``Nats-Msg-Id``'s, dead letters) built and parsed back."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from core.ids import (
    dead_letter_id,
    execution_id,
    execution_id_of_msg_id,
    job_event_msg_id,
    manual_execution_id,
    new_job_id,
    owner_key,
    parse_execution_id,
    partition_of,
    run_msg_id,
    status_msg_id,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE_IDS = [f"job-{i}" for i in range(200)] + ["", "żółw", "a" * 300]
EXECUTION_ID = re.compile(r"^(?P<job>.+):(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)$")
# A NATS subject token: no separator '.', no wildcards '*' '>', no whitespace, printable ASCII.
SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def _partitions_in_child(hash_seed: str) -> dict[str, list[int]]:
    code = (
        "import json, sys\n"
        "from core.ids import partition_of\n"
        "ids = json.load(sys.stdin)\n"
        "print(json.dumps({i: [partition_of(i, n) for n in (1, 7, 64, 4096)] for i in ids}))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(SAMPLE_IDS),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
        check=True,
    )
    result: dict[str, list[int]] = json.loads(out.stdout)
    return result


def test_partition_of_is_the_same_in_every_process() -> None:
    here = {i: [partition_of(i, n) for n in (1, 7, 64, 4096)] for i in SAMPLE_IDS}

    assert _partitions_in_child("1") == here
    assert _partitions_in_child("2") == here


def test_partition_of_is_in_range() -> None:
    for n in (1, 7, 64, 4096):
        assert {partition_of(i, n) for i in SAMPLE_IDS} <= set(range(n))
    assert {partition_of(i, 1) for i in SAMPLE_IDS} == {0}


def test_partition_of_spreads_job_ids_evenly() -> None:
    rng = random.Random(1)
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(10_000)]  # like new_job_id()
    counts = Counter(partition_of(i, 64) for i in ids)

    expected = len(ids) / 64
    chi2 = sum((counts[p] - expected) ** 2 / expected for p in range(64))
    assert len(counts) == 64
    assert chi2 < 110, f"chi-square {chi2:.1f} over 63 degrees of freedom (p < 0.001 above 103)"
    assert min(counts.values()) > expected * 0.6
    assert max(counts.values()) < expected * 1.4


def test_new_job_ids_are_distinct_hex() -> None:
    ids = {new_job_id() for _ in range(1000)}

    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_execution_id_is_job_id_and_scheduled_time_in_utc_milliseconds() -> None:
    berlin_summer = timezone(timedelta(hours=2))
    scheduled = datetime(2026, 6, 1, 12, 0, 5, 123_456, tzinfo=berlin_summer)

    got = execution_id("3f2a", scheduled)

    assert got == "3f2a:2026-06-01T10:00:05.123Z"
    match = EXECUTION_ID.fullmatch(got)
    assert match is not None
    assert match["job"] == "3f2a"


def test_execution_id_is_the_same_for_one_occurrence_in_any_offset() -> None:
    utc = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
    tokyo = utc.astimezone(timezone(timedelta(hours=9)))

    assert execution_id("job", utc) == execution_id("job", tokyo) == "job:2026-06-01T10:00:00.000Z"


def test_execution_ids_differ_per_occurrence() -> None:
    """Case S07-dedup-window-msgid-reuse: occurrences 10:00 … 10:04 get five ids."""
    t = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
    minutes = [execution_id("job", t + timedelta(minutes=m)) for m in range(5)]

    assert len(set(minutes)) == 5
    assert execution_id("job", t) != execution_id("job", t + timedelta(milliseconds=1))
    assert execution_id("job-a", t) != execution_id("job-b", t)
    assert all(EXECUTION_ID.fullmatch(i) for i in minutes)


def test_execution_id_refuses_a_naive_time() -> None:
    with pytest.raises(ValueError):
        execution_id("job", datetime(2026, 6, 1, 10, 0))


def test_a_manual_run_id_is_its_trigger_time_and_a_random_suffix() -> None:
    at = datetime(2026, 6, 1, 10, 0, 0, 7_000, tzinfo=UTC)

    ids = {manual_execution_id("job", at) for _ in range(100)}

    assert len(ids) == 100
    assert (
        manual_execution_id("job", at, "0a1b2c3d") == "job:2026-06-01T10:00:00.007Z!manual-0a1b2c3d"
    )
    assert all(re.fullmatch(r"job:2026-06-01T10:00:00\.007Z!manual-[0-9a-f]{8}", i) for i in ids)
    assert execution_id("job", at) not in ids


def test_an_execution_id_of_either_format_parses_back_to_its_job_and_time() -> None:
    at = datetime(2026, 6, 1, 10, 0, 0, 7_000, tzinfo=UTC)
    job = new_job_id()

    assert parse_execution_id(execution_id(job, at)) == (job, at)
    assert parse_execution_id(manual_execution_id(job, at)) == (job, at)


@pytest.mark.parametrize("value", ["", "job", "job:", "job:yesterday", "job:2026-13-01T00:00:00Z"])
def test_what_is_no_execution_id_parses_to_none(value: str) -> None:
    assert parse_execution_id(value) is None


def test_msg_ids_carry_their_execution_id() -> None:
    run = execution_id("job", datetime(2026, 6, 1, 10, 0, tzinfo=UTC))

    assert run_msg_id(run) == run
    assert run_msg_id(run, 1780308000123) == f"{run}|r1780308000123"
    assert status_msg_id(run, "RETRYING", 2) == f"{run}|RETRYING|2"
    for msg_id in (run_msg_id(run), run_msg_id(run, 1), status_msg_id(run, "FAILED", 3)):
        assert execution_id_of_msg_id(msg_id) == run


def test_a_job_event_msg_id_is_per_job_event_and_instant() -> None:
    at = datetime(2026, 6, 1, 10, 0, 0, 250_000, tzinfo=UTC)

    assert job_event_msg_id("job", "paused", at) == "job|paused|1780308000.25"
    assert job_event_msg_id("job", "paused", at) != job_event_msg_id("job", "resumed", at)


def test_a_dead_letter_id_is_stream_sequence_and_stored_time() -> None:
    assert dead_letter_id("jobsched_work", 42, 1780308000123) == "jobsched_work:42:1780308000123"


OWNERS = [
    "alice",
    "alice.smith",
    "alice smith",
    "a.b.c",
    "*",
    ">",
    "user>*.x",
    "żółw",
    "名前",
    "tab\tand\nnewline",
    "a/b+c=d",
    "",
    "x" * 200,
]


@pytest.mark.parametrize("owner", OWNERS)
def test_owner_key_is_one_subject_token(owner: str) -> None:
    assert SUBJECT_TOKEN.fullmatch(owner_key(owner))


def test_owner_key_is_distinct_per_owner_and_reversible() -> None:
    keys = [owner_key(o) for o in OWNERS]

    assert len(set(keys)) == len(OWNERS)
    for owner, key in zip(OWNERS, keys, strict=True):
        if owner:
            assert base64.urlsafe_b64decode(key + "=" * (-len(key) % 4)).decode() == owner
