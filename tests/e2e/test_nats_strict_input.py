"""The NATS API refuses what HTTP refuses (gateway/inputs.py): a duplicate JSON key is a 422
naming it, and a list whose startTime is after its endTime a 422 naming startTime."""

from __future__ import annotations

import msgspec
import nats
import pytest

from jobsched.client import ApiError
from tests.e2e.test_nats_api import nats_client
from tests.natsauth import observer_url
from tests.support import Stack, problem_fields


async def test_a_duplicate_key_is_422_naming_it(stack: Stack) -> None:
    nc = await nats.connect(observer_url(stack.settings.nats.url))
    try:
        msg = await nc.request(
            f"{stack.settings.nats.subject_prefix}.api.create",
            b'{"taskId": "noop", "parameters": {"a": 1, "a": 2}}',
            timeout=5,
            headers={"Authorization": f"Bearer {stack.token()}"},
        )
    finally:
        await nc.close()
    problem = msgspec.json.decode(msg.data)
    assert msg.headers is not None and msg.headers["Nats-Service-Error-Code"] == "422"
    assert [e["field"] for e in problem["errors"]] == ["parameters.a"]
    assert (await stack.client().list_jobs()).items == []


async def test_a_start_after_the_end_is_422(stack: Stack) -> None:
    async with nats_client(stack) as api:
        with pytest.raises(ApiError) as bad:
            await api._call(
                "list", {"startTime": "2026-06-02T00:00:00Z", "endTime": "2026-06-01T00:00:00Z"}
            )
    assert bad.value.status == 422 and problem_fields(bad.value) == ["startTime"]
