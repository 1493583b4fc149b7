"""core/concurrency: the key template and the slot rules, on a fake clock (epoch ms)."""

from __future__ import annotations

import msgspec
import pytest

from core.concurrency import (
    ConcurrencyPolicy,
    Outcome,
    SlotRequest,
    SlotState,
    acquire,
    check_concurrency,
    explain_wait,
    parse_template,
    release,
    render_key,
    renew,
    should_retry,
    slot_id,
)
from core.errors import InvalidRequest

LEASE_MS = 30_000
T0 = 1_780_000_000_000


def req(
    run: str,
    *,
    order_ms: int | None = None,
    limit: int = 1,
    worker: str = "w1",
    owner: str = "alice",
    key: str = "tenant-a",
    policy: ConcurrencyPolicy = ConcurrencyPolicy.QUEUE,
) -> SlotRequest:
    order = order_ms if order_ms is not None else int(run.removeprefix("r"))
    return SlotRequest(owner, key, run, worker, order, limit, policy)


# --- template ---------------------------------------------------------------------------------


def test_a_template_renders_its_placeholders_from_the_parameters() -> None:
    params = {"customer": "acme", "n": 7, "eu": True}
    assert render_key("tenant-{customer}", params) == "tenant-acme"
    assert render_key("{customer}/{n}/{eu}", params) == "acme/7/true"
    assert render_key("fixed", {}) == "fixed"
    assert render_key("{{literal}}-{n}", params) == "{literal}-7"


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("", "empty"),
        ("tenant-{", "unclosed"),
        ("tenant-}", "unmatched"),
        ("{a.b}", "not a placeholder"),
        ("{__import__('os')}", "not a placeholder"),
        ("{1x}", "not a placeholder"),
        ("{}", "not a placeholder"),
        ("a\nb", "printable"),
        ("x" * 201, "at most"),
    ],
)
def test_an_invalid_template_says_why(template: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_template(template)


def test_a_missing_or_structured_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="'customer'"):
        render_key("tenant-{customer}", {})
    with pytest.raises(ValueError, match="dict"):
        render_key("{c}", {"c": {"nested": 1}})
    with pytest.raises(ValueError, match="float"):
        render_key("{c}", {"c": 1.5})
    with pytest.raises(ValueError, match="at most 256"):
        render_key("{c}", {"c": "x" * 300})


def test_check_concurrency_names_the_field() -> None:
    check_concurrency(None, None, {})
    check_concurrency("{c}", 3, {"c": "x"})
    with pytest.raises(InvalidRequest) as e:
        check_concurrency("tenant-{customer}", None, {"region": "eu"})
    assert e.value.errors[0].field == "concurrencyKey"
    with pytest.raises(InvalidRequest) as e:
        check_concurrency(None, 2, {})
    assert e.value.errors[0].field == "maxConcurrent"


def test_keys_are_per_owner_and_safe_as_kv_keys() -> None:
    assert slot_id("alice", "k") != slot_id("bob", "k")
    assert slot_id("alice", "k") == slot_id("alice", "k")
    assert slot_id("a\0b", "") != slot_id("a", "b")  # owner and key cannot be shifted
    assert all(c in "0123456789abcdef." or c == "c" for c in slot_id("alice", "ä {x} ."))


# --- slots ------------------------------------------------------------------------------------


def test_runs_take_the_free_slots_then_wait_in_order() -> None:
    state: SlotState | None = None
    outcomes = []
    for run in ("r1", "r2", "r3", "r4"):
        d = acquire(state, req(run, limit=2), T0, LEASE_MS)
        state = d.state
        outcomes.append((d.outcome, d.position))
    assert outcomes == [
        (Outcome.ACQUIRED, 0),
        (Outcome.ACQUIRED, 0),
        (Outcome.WAITING, 0),
        (Outcome.WAITING, 1),
    ]
    assert state is not None
    # r4 cannot pass r3 when one slot frees
    state = release(state, "r1", T0 + 10)
    assert state is not None
    assert acquire(state, req("r4", limit=2), T0 + 10, LEASE_MS).outcome == Outcome.WAITING
    d = acquire(state, req("r3", limit=2), T0 + 10, LEASE_MS)
    assert d.outcome == Outcome.ACQUIRED
    assert [h.execution_id for h in d.state.holders] == ["r2", "r3"]
    assert [w.execution_id for w in d.state.waiters] == ["r4"]


def test_an_earlier_scheduled_run_goes_first_whoever_asked_first() -> None:
    state = acquire(None, req("r5"), T0, LEASE_MS).state
    state = acquire(state, req("r9"), T0, LEASE_MS).state  # waits
    state = acquire(state, req("r7"), T0 + 1, LEASE_MS).state  # waits, ahead of r9
    freed = release(state, "r5", T0 + 2)
    assert freed is not None
    assert acquire(freed, req("r9"), T0 + 2, LEASE_MS).outcome == Outcome.WAITING
    assert acquire(freed, req("r7"), T0 + 2, LEASE_MS).outcome == Outcome.ACQUIRED


def test_a_redelivered_run_keeps_its_slot_on_another_worker() -> None:
    state = acquire(None, req("r1", worker="w1"), T0, LEASE_MS).state
    d = acquire(state, req("r1", worker="w2"), T0 + 5, LEASE_MS)
    assert d.outcome == Outcome.ACQUIRED
    assert [(h.execution_id, h.worker_id) for h in d.state.holders] == [("r1", "w2")]
    assert d.state.holders[0].since_ms == T0


def test_a_dead_workers_slot_is_free_once_its_lease_expires() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state  # w1 dies here, never renews
    waiting = acquire(state, req("r2", worker="w2"), T0 + 1_000, LEASE_MS)
    assert waiting.outcome == Outcome.WAITING
    assert waiting.wake_at_ms is not None and waiting.wake_at_ms <= T0 + LEASE_MS
    before = acquire(waiting.state, req("r2", worker="w2"), T0 + LEASE_MS - 1, LEASE_MS)
    assert before.outcome == Outcome.WAITING
    after = acquire(waiting.state, req("r2", worker="w2"), T0 + LEASE_MS, LEASE_MS)
    assert after.outcome == Outcome.ACQUIRED
    assert [h.execution_id for h in after.state.holders] == ["r2"]


def test_a_renewed_slot_outlives_its_first_lease() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state
    state = renew(state, req("r1"), T0 + 20_000, LEASE_MS)
    d = acquire(state, req("r2"), T0 + LEASE_MS + 1, LEASE_MS)
    assert d.outcome == Outcome.WAITING
    # a holder whose entry vanished (lease expired during an outage) is put back, not lost
    back = renew(SlotState(owner="alice", key="tenant-a"), req("r1"), T0, LEASE_MS)
    assert [h.execution_id for h in back.holders] == ["r1"]


def test_a_dead_waiter_does_not_block_the_queue_forever() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state
    state = acquire(state, req("r2", worker="dead"), T0, LEASE_MS).state
    state = acquire(state, req("r3"), T0, LEASE_MS).state
    freed = release(state, "r1", T0 + 1)
    assert freed is not None
    assert acquire(freed, req("r3"), T0 + 1, LEASE_MS).outcome == Outcome.WAITING
    assert acquire(freed, req("r3"), T0 + LEASE_MS, LEASE_MS).outcome == Outcome.ACQUIRED


def test_skip_policy_never_queues() -> None:
    state = acquire(None, req("r1", policy=ConcurrencyPolicy.SKIP), T0, LEASE_MS).state
    d = acquire(state, req("r2", policy=ConcurrencyPolicy.SKIP), T0, LEASE_MS)
    assert d.outcome == Outcome.SKIPPED
    assert d.state.waiters == ()


def test_a_raised_limit_lets_more_runs_in() -> None:
    state = acquire(None, req("r1", limit=1), T0, LEASE_MS).state
    assert acquire(state, req("r2", limit=1), T0, LEASE_MS).outcome == Outcome.WAITING
    assert acquire(state, req("r2", limit=2), T0, LEASE_MS).outcome == Outcome.ACQUIRED


def test_a_waiter_writes_only_when_it_can_go_or_must_renew() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state
    state = acquire(state, req("r2"), T0, LEASE_MS).state
    assert not should_retry(state, req("r2"), T0 + 1, LEASE_MS)
    assert should_retry(state, req("r2"), T0 + LEASE_MS // 3 + 1, LEASE_MS)  # renew its place
    freed = release(state, "r1", T0 + 2)
    assert should_retry(freed, req("r2"), T0 + 2, LEASE_MS)
    assert should_retry(None, req("r2"), T0, LEASE_MS)


def test_release_of_an_unknown_run_writes_nothing() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state
    assert release(state, "r9", T0) is None
    assert release(None, "r1", T0) is None


def test_explain_reports_the_place_in_line() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state
    state = acquire(state, req("r2"), T0, LEASE_MS).state
    state = acquire(state, req("r3"), T0, LEASE_MS).state
    w = explain_wait(state, "tenant-a", 1, "r3", T0 + 1)
    assert (w.running, w.waiting, w.position, w.holding) == (["r1"], ["r2", "r3"], 1, False)
    assert "1 waiting ahead" in w.reason
    assert explain_wait(state, "tenant-a", 1, "r1", T0 + 1).holding
    gone = explain_wait(state, "tenant-a", 1, "r3", T0 + LEASE_MS + 1)
    assert (gone.running, gone.waiting, gone.position) == ([], [], None)
    assert msgspec.json.decode(msgspec.json.encode(w))["maxConcurrent"] == 1


def test_the_state_round_trips_as_json() -> None:
    state = acquire(None, req("r1"), T0, LEASE_MS).state
    raw = msgspec.json.encode(state)
    assert b'"expiresAtMs"' in raw
    assert msgspec.json.decode(raw, type=SlotState) == state
