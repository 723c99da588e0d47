"""What to do about a verdict: relaunch after a backoff wait, give up, or nothing.

tenacity computes the waits (exponential growth, cap, jitter) from a ``RetryCallState``;
the daemon owns the control loop, so no tenacity ``Retrying`` object ever runs here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import tenacity

from .events import Verdict
from .spec import RestartSpec

Action = Literal["relaunch", "give_up", "none"]


@dataclass(frozen=True)
class Decision:
    action: Action
    wait_s: float
    reason: str


class _SeededWaitRandom(tenacity.wait_random):
    """tenacity's uniform jitter drawn from our own generator, so a seeded policy repeats."""

    def __init__(self, low: float, high: float, rng: random.Random) -> None:
        super().__init__(min=low, max=high)
        self._rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return self.wait_random_min + self._rng.random() * (self.wait_random_max - self.wait_random_min)


class RestartPolicy:
    def __init__(self, restart: RestartSpec, *, rng: random.Random | None = None) -> None:
        self._restart = restart
        exponential = tenacity.wait_exponential(
            multiplier=restart.backoff_initial_s,
            exp_base=restart.backoff_multiplier,
            min=restart.backoff_initial_s,
            max=max(restart.backoff_max_s, restart.backoff_initial_s),
        )
        jitter = _SeededWaitRandom(0.0, restart.backoff_jitter_s, rng or random.Random())
        self._wait = exponential + jitter

    def wait_after(self, attempt: int) -> float:
        """Seconds to wait before relaunching after attempt number ``attempt`` (1-based) failed.

        The exponential part is capped at ``backoff_max_s``; jitter (at most
        ``backoff_jitter_s``) comes on top so relaunches never fall below the floor.
        """
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = max(1, attempt)
        return float(self._wait(state))

    def decide(
        self, verdict: Verdict, attempt: int, fingerprint: str | None, previous_fingerprint: str | None
    ) -> Decision:
        restart = self._restart
        if verdict == Verdict.HEALTHY:
            return Decision("none", 0.0, "healthy")
        if verdict == Verdict.DONE:
            return Decision("none", 0.0, "job complete")
        if verdict == Verdict.LEAKED:
            # Relaunching onto GPUs that still hold the last attempt's memory would fail
            # (OOM) or, worse, share the device with a zombie.
            return Decision("give_up", 0.0, "GPU memory was not released after the attempt: not relaunching")
        if verdict not in restart.on:
            allowed = ", ".join(v.value for v in restart.on) or "nothing"
            return Decision("give_up", 0.0, f"{verdict.value} is not a verdict to relaunch on (restart.on: {allowed})")
        # Checked before the attempt budget: it says more about what went wrong.
        if restart.stop_on_repeat and fingerprint is not None and fingerprint == previous_fingerprint:
            return Decision(
                "give_up",
                0.0,
                f"same failure twice in a row (fingerprint {_short(fingerprint)}): "
                "a deterministic bug, not relaunching",
            )
        if attempt >= restart.max_attempts:
            return Decision("give_up", 0.0, f"attempt {attempt}/{restart.max_attempts} failed: giving up")
        wait = self.wait_after(attempt)
        return Decision(
            "relaunch",
            wait,
            f"{verdict.value}: relaunching in {wait:.1f}s (attempt {attempt + 1}/{restart.max_attempts})",
        )


def _short(fingerprint: str) -> str:
    return fingerprint if len(fingerprint) <= 12 else fingerprint[:12] + "…"
