"""The restart policy: which verdicts relaunch, when to give up, and the backoff waits."""

from __future__ import annotations

import random

import pytest

from supervisor.core.backoff import Backoff
from supervisor.core.events import Verdict
from supervisor.jobs.policy import Decision, RestartPolicy
from supervisor.spec.model import RestartSpec


def policy(rng_seed: int = 0, **restart: object) -> RestartPolicy:
    return RestartPolicy(RestartSpec(**restart), rng=random.Random(rng_seed))  # type: ignore[arg-type]


def test_healthy_and_done_need_nothing() -> None:
    p = policy()
    assert p.decide(Verdict.HEALTHY, 1, None, None) == Decision("none", 0.0, "healthy")
    assert p.decide(Verdict.DONE, 1, None, None) == Decision("none", 0.0, "job complete")


@pytest.mark.parametrize("verdict", [Verdict.CRASHED, Verdict.OOM, Verdict.KILLED, Verdict.STALLED, Verdict.SILENT])
def test_default_verdicts_relaunch(verdict: Verdict) -> None:
    d = policy().decide(verdict, 1, "fp1", None)
    assert d.action == "relaunch"
    assert 10.0 <= d.wait_s <= 15.0
    assert d.reason.startswith(f"{verdict.value}: relaunching in ")
    assert "attempt 2/3" in d.reason


def test_verdict_not_listed_gives_up() -> None:
    d = policy(on=[Verdict.CRASHED]).decide(Verdict.OOM, 1, None, None)
    assert d.action == "give_up"
    assert "oom is not a verdict to relaunch on" in d.reason


def test_leaked_gives_up_even_if_listed() -> None:
    d = policy(on=[Verdict.LEAKED, Verdict.CRASHED]).decide(Verdict.LEAKED, 1, None, None)
    assert d.action == "give_up" and "not released" in d.reason


def test_attempt_budget() -> None:
    p = policy(max_attempts=3)
    assert p.decide(Verdict.CRASHED, 2, "a", "b").action == "relaunch"
    d = p.decide(Verdict.CRASHED, 3, "c", "b")
    assert d == Decision("give_up", 0.0, "attempt 3/3 failed: giving up")


def test_same_fingerprint_twice_is_a_deterministic_bug() -> None:
    d = policy().decide(Verdict.CRASHED, 2, "ab12cd34ef56aa77", "ab12cd34ef56aa77")
    assert d.action == "give_up"
    assert d.reason == (
        "same failure twice in a row (fingerprint ab12cd34ef56…): a deterministic bug, not relaunching"
    )


@pytest.mark.parametrize(("fp", "prev"), [(None, None), ("a", None), (None, "a"), ("a", "b")])
def test_missing_or_different_fingerprints_relaunch(fp: str | None, prev: str | None) -> None:
    assert policy().decide(Verdict.CRASHED, 1, fp, prev).action == "relaunch"


def test_repeat_check_can_be_turned_off() -> None:
    assert policy(stop_on_repeat=False).decide(Verdict.CRASHED, 1, "a", "a").action == "relaunch"


def test_waits_grow_exponentially_and_are_capped() -> None:
    p = policy(backoff_initial_s=10, backoff_multiplier=2, backoff_max_s=100, backoff_jitter_s=0)
    assert [p.wait_after(a) for a in range(1, 8)] == [10, 20, 40, 80, 100, 100, 100]


def test_jitter_is_bounded_and_on_top_of_the_floor() -> None:
    p = policy(backoff_initial_s=10, backoff_multiplier=3, backoff_max_s=60, backoff_jitter_s=5, rng_seed=7)
    for attempt in range(1, 10):
        base = min(10 * 3 ** (attempt - 1), 60)
        for _ in range(50):
            wait = p.wait_after(attempt)
            assert base <= wait <= base + 5


def test_no_wait_below_the_floor() -> None:
    with pytest.raises(ValueError, match="backoff_max_s"):  # a spec with a max below the floor is refused
        policy(backoff_initial_s=30, backoff_max_s=10, backoff_jitter_s=0)
    backoff = Backoff(initial_s=30, max_s=10)  # and the waits never go below it anyway
    assert backoff.wait(1) == 30
    assert policy(backoff_initial_s=30, backoff_max_s=30, backoff_jitter_s=0).wait_after(0) == 30
    assert policy(backoff_initial_s=0, backoff_jitter_s=0).wait_after(5) == 0


def test_seeded_rng_is_deterministic() -> None:
    a = [policy(rng_seed=42).decide(Verdict.CRASHED, 1, None, None).wait_s for _ in range(3)]
    b = [policy(rng_seed=42).decide(Verdict.CRASHED, 1, None, None).wait_s for _ in range(3)]
    assert a == b
    assert policy(rng_seed=1).wait_after(2) != policy(rng_seed=2).wait_after(2)


def test_jitter_does_not_touch_the_global_random_state() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    policy().wait_after(1)
    assert random.random() == expected
