"""The JobStore contract for job names and labels: a name is unique per owner, and
``list_jobs`` filters by name, task and label selector (with every other filter and the cursor),
the same on every backend."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from core.errors import NameTaken
from core.labels import parse_selector
from core.model import Job, JobStatus
from core.ports import IdempotencyKeyReused, JobChange, JobQuery, JobStore
from tests.store.test_contract import OWNER, at, make_job

LABELED: dict[str, dict[str, str]] = {
    "j0": {},
    "j1": {"team": "billing"},
    "j2": {"team": "search", "env": "prod"},
    "j3": {"team": "billing", "env": "dev"},
    "j4": {"team": "billing", "env": "prod", "example.com/legacy": ""},
    "j5": {"env": "dev"},
}
SELECTORS = [
    "team=billing",
    "team!=billing",
    "team in (billing,search)",
    "team notin (billing)",
    "env",
    "!env",
    "team=billing,env!=dev",
    "example.com/legacy=",
    "team=billing,!example.com/legacy,env",
    "team in (billing),env in (dev,prod)",
    "team in (billing,search),env in (dev),!example.com/legacy",
    "team=nobody",
]


def _spec_change(job: Job, **fields: Any) -> JobChange:
    return JobChange("changed", spec=msgspec.structs.replace(job.spec, **fields))


async def _ids(
    store: JobStore, query: JobQuery, owner: str | None = OWNER, limit: int = 50
) -> list[str]:
    """Every job of a listing, walking its pages."""
    ids: list[str] = []
    cursor = None
    while True:
        page = await store.list_jobs(owner, query, limit=limit, cursor=cursor)
        ids.extend(j.id for j in page.items)
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


async def _labeled(store: JobStore) -> list[Job]:
    jobs = [
        make_job(job_id, created_at=at(i), labels=labels, task_id="a" if i % 2 else "b")
        for i, (job_id, labels) in enumerate(LABELED.items())
    ]
    for job in jobs:
        await store.create_job(job)
    return jobs


@pytest.mark.parametrize("text", SELECTORS)
@pytest.mark.parametrize("limit", [1, 50])
async def test_label_selectors_list_what_the_matcher_matches(
    store: JobStore, text: str, limit: int
) -> None:
    jobs = await _labeled(store)
    await store.create_job(make_job("other", owner="bob", labels={"team": "billing"}))
    selector = parse_selector(text)
    expected = [j.id for j in reversed(jobs) if selector.matches(j.labels)]
    assert await _ids(store, JobQuery(labels=selector), limit=limit) == expected


async def test_label_selectors_combine_with_task_status_and_every_owner(store: JobStore) -> None:
    await _labeled(store)
    await store.create_job(make_job("bob-1", owner="bob", created_at=at(10),
                                    labels={"team": "billing"}))  # fmt: skip
    billing = parse_selector("team=billing")
    assert await _ids(store, JobQuery(labels=billing, task_id="a")) == ["j3", "j1"]
    assert await _ids(store, JobQuery(labels=billing, status=JobStatus.PAUSED)) == []
    assert await _ids(store, JobQuery(labels=billing), owner=None) == ["bob-1", "j4", "j3", "j1"]
    assert await _ids(store, JobQuery(labels=billing), owner="bob") == ["bob-1"]
    assert await _ids(store, JobQuery(task_id="b"), owner=None, limit=1) == ["j4", "j2", "j0"]


async def test_labels_follow_changes_and_deletion(store: JobStore) -> None:
    [j0, j1, *_] = await _labeled(store)
    billing = parse_selector("team=billing")
    await store.update_job(OWNER, "j1", _spec_change(j1, labels={"team": "search"}), now=at(20))
    await store.update_job(OWNER, "j0", _spec_change(j0, labels={"team": "billing"}), now=at(20))
    await store.delete_job(OWNER, "j3")
    assert await _ids(store, JobQuery(labels=billing)) == ["j4", "j0"]
    assert await _ids(store, JobQuery(labels=parse_selector("!team"))) == ["j5"]
    changed = await store.get_job(OWNER, "j1")
    assert changed.labels == {"team": "search"}
    paused = JobChange("paused", status=JobStatus.PAUSED)  # a change without a spec keeps them
    await store.update_job(OWNER, "j0", paused, now=at(21))
    assert await _ids(store, JobQuery(labels=billing)) == ["j4", "j0"]


async def test_a_name_is_unique_per_owner(store: JobStore) -> None:
    await store.create_job(make_job("a1", name="nightly-report"))
    await store.create_job(make_job("b1", owner="bob", name="nightly-report"))  # another owner
    await store.create_job(make_job("a2"))
    await store.create_job(make_job("a3"))  # unnamed jobs never collide
    with pytest.raises(NameTaken) as e:
        await store.create_job(make_job("a4", name="nightly-report"))
    assert [f.field for f in e.value.errors] == ["name"]
    assert await _ids(store, JobQuery(name="nightly-report")) == ["a1"]
    assert await _ids(store, JobQuery(name="nightly-report"), owner=None) == ["b1", "a1"]
    assert await _ids(store, JobQuery(name="nightly")) == []


async def test_renaming_onto_a_taken_name_changes_nothing(store: JobStore) -> None:
    first = await store.create_job(make_job("a1", name="one"))
    second = await store.create_job(make_job("a2", name="two", labels={"k": "v"}))
    with pytest.raises(NameTaken):
        await store.update_job(OWNER, "a2", _spec_change(second, name="one", labels={}), now=at(5))
    assert await store.get_job(OWNER, "a2") == second
    assert await _ids(store, JobQuery(labels=parse_selector("k=v"))) == ["a2"]
    await store.update_job(OWNER, "a1", _spec_change(first, name=None), now=at(6))
    await store.update_job(OWNER, "a2", _spec_change(second, name="one"), now=at(7))
    assert await _ids(store, JobQuery(name="one")) == ["a2"]
    await store.delete_job(OWNER, "a2")
    await store.create_job(make_job("a3", name="one"))  # a deleted job's name is free


async def test_concurrent_creates_of_one_name_have_one_winner(store: JobStore) -> None:
    outcomes = await asyncio.gather(
        *(store.create_job(make_job(f"c{i}", name="same")) for i in range(4)),
        store.create_job(make_job("other", name="different")),
        return_exceptions=True,
    )
    assert sum(isinstance(o, Job) for o in outcomes[:4]) == 1
    assert sum(isinstance(o, NameTaken) for o in outcomes[:4]) == 3
    assert isinstance(outcomes[4], Job)
    assert len(await _ids(store, JobQuery())) == 2


async def test_a_replayed_create_with_a_name_is_a_replay(store: JobStore) -> None:
    job = make_job("k1", name="keyed", idempotency_key="key-1")
    await store.create_job(job, request_hash="h")
    with pytest.raises(IdempotencyKeyReused) as e:
        await store.create_job(
            make_job("k2", name="keyed", idempotency_key="key-1"), request_hash="h"
        )
    assert e.value.same_request and e.value.job.id == "k1"
