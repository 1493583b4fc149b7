"""core.backoff.retry_delay: exponential backoff with bounded jitter."""

from __future__ import annotations

import itertools
import random

import pytest

from core.backoff import retry_delay

SEEDS = range(200)


def delays(
    rng: random.Random, *, base_seconds: float = 1.0, max_seconds: float = 1000.0
) -> list[float]:
    return [
        retry_delay(a, base_seconds=base_seconds, max_seconds=max_seconds, rng=rng)
        for a in range(1, 9)
    ]


def test_delays_grow_strictly_until_the_cap() -> None:
    for seed in SEEDS:
        got = delays(
            random.Random(seed), base_seconds=0.5, max_seconds=1000.0
        )  # 0.5 * 2**7 = 64 < cap

        assert all(later > earlier for earlier, later in itertools.pairwise(got)), seed


def test_each_delay_is_within_the_jitter_band() -> None:
    for seed in SEEDS:
        got = delays(random.Random(seed), base_seconds=0.5)

        for attempt, delay in enumerate(got, start=1):
            nominal = 0.5 * 2 ** (attempt - 1)
            assert 0.8 * nominal <= delay <= 1.2 * nominal, (seed, attempt, delay)


def test_jitter_spreads_runs_that_failed_together() -> None:
    got = {
        retry_delay(3, base_seconds=1.0, max_seconds=60.0, rng=random.Random(seed))
        for seed in SEEDS
    }

    assert len(got) == len(SEEDS)
    assert min(got) < 4 * 0.85
    assert max(got) > 4 * 1.15


def test_delays_past_the_cap_are_the_cap() -> None:
    rng = random.Random(5)
    for attempt in [10, 20, 60, 1000] * 100:  # 1.0 * 2**9 * 0.8 = 409.6 > cap
        assert retry_delay(attempt, base_seconds=1.0, max_seconds=300.0, rng=rng) == 300.0, attempt


def test_no_delay_exceeds_the_cap() -> None:
    got = [
        retry_delay(attempt, base_seconds=1.0, max_seconds=300.0, rng=random.Random(seed))
        for seed in SEEDS
        for attempt in (10, 20)
    ]

    assert max(got) <= 300.0


def test_a_seeded_rng_makes_delays_reproducible() -> None:
    first = delays(random.Random(42))
    random.seed(1)  # the module-level generator must not be used when an rng is given
    second = delays(random.Random(42))

    assert first == second
    assert delays(random.Random(43)) != first


def test_zero_jitter_gives_the_exact_exponential() -> None:
    got = [
        retry_delay(a, base_seconds=0.3, max_seconds=5.0, jitter=0.0, rng=random.Random(0))
        for a in range(1, 7)
    ]

    assert got == pytest.approx([0.3, 0.6, 1.2, 2.4, 4.8, 5.0])


def test_without_an_rng_the_delay_is_still_bounded() -> None:
    assert 0.8 * 4 <= retry_delay(3, base_seconds=1.0, max_seconds=60.0) <= 1.2 * 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": 0},
        {"attempt": -1},
        {"base_seconds": 0.0},
        {"base_seconds": -1.0},
        {"max_seconds": 0.0},
        {"jitter": 1.0},
        {"jitter": -0.1},
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, float]) -> None:
    args = {"attempt": 1, "base_seconds": 1.0, "max_seconds": 10.0, "jitter": 0.2} | kwargs
    with pytest.raises(ValueError):
        retry_delay(
            int(args["attempt"]),
            base_seconds=args["base_seconds"],
            max_seconds=args["max_seconds"],
            jitter=args["jitter"],
        )
