"""What to do about a verdict: relaunch after a backoff wait, give up, or nothing.

The waits come from `backoff.Backoff` (tenacity's strategies); the daemon owns the control
loop, so no tenacity ``Retrying`` ever sleeps here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from supervisor.core.actions import ActionKind
from supervisor.core.backoff import Backoff
from supervisor.core.events import FailureKind, Verdict
from supervisor.spec.tables import RestartSpec


@dataclass(frozen=True)
class Decision:
    action: ActionKind  # relaunch, give_up or none (a stop is the user's, never the policy's)
    wait_s: float
    reason: str


class Policy(Protocol):
    """What a runner asks after each attempt: ``RestartPolicy``, or a sharded job's shard policy
    (sharding.py), which wraps one and hears of the failures other shards saw."""

    def wait_after(self, attempt: int) -> float: ...

    def decide(self, verdict: Verdict, attempt: int, fingerprint: str | None, previous_fingerprint: str | None,
               failure: FailureKind | None = None) -> Decision: ...


class RestartPolicy:
    def __init__(self, restart: RestartSpec, *, rng: random.Random | None = None) -> None:
        self._restart = restart
        self._backoff = Backoff(initial_s=restart.backoff_initial_s, max_s=restart.backoff_max_s,
                                multiplier=restart.backoff_multiplier, jitter_s=restart.backoff_jitter_s,
                                rng=rng or random.Random())

    def wait_after(self, attempt: int) -> float:
        """Seconds to wait before relaunching after attempt number ``attempt`` (1-based) failed.

        The exponential part is capped at ``backoff_max_s``; jitter (at most
        ``backoff_jitter_s``) comes on top so relaunches never fall below the floor.
        """
        return self._backoff.wait(attempt)

    def decide(
        self, verdict: Verdict, attempt: int, fingerprint: str | None, previous_fingerprint: str | None,
        failure: FailureKind | None = None,
    ) -> Decision:
        restart = self._restart
        if verdict == Verdict.HEALTHY:
            return Decision(ActionKind.NONE, 0.0, "healthy")
        if verdict == Verdict.DONE:
            return Decision(ActionKind.NONE, 0.0, "job complete")
        if verdict == Verdict.PREEMPTED:
            # The scheduler's doing, not the job's: at once, and the runner does not count it.
            return Decision(ActionKind.RELAUNCH, 0.0, "preempted by the scheduler: relaunching (not counted as a failure)")
        if verdict == Verdict.LEAKED:
            # Relaunching onto GPUs that still hold the last attempt's memory would fail
            # (OOM) or, worse, share the device with a zombie.
            return Decision(ActionKind.GIVE_UP, 0.0, "GPU memory was not released after the attempt: not relaunching")
        if failure is FailureKind.COMMAND_NOT_FOUND:
            # The same command would not be found again: say so at once, no backoff, no budget spent.
            return Decision(ActionKind.GIVE_UP, 0.0, "the command was not found: not relaunching (fix `command`, `python` or PATH)")
        if verdict not in restart.on:
            allowed = ", ".join(v.value for v in restart.on) or "nothing"
            return Decision(ActionKind.GIVE_UP, 0.0, f"{verdict.value} is not a verdict to relaunch on (restart.on: {allowed})")
        # Checked before the attempt budget: it says more about what went wrong.
        if (restart.stop_on_repeat and fingerprint is not None and fingerprint == previous_fingerprint
                and names_the_program(failure)):
            return Decision(
                ActionKind.GIVE_UP,
                0.0,
                f"same failure twice in a row (fingerprint {_short(fingerprint)}): "
                "a deterministic bug, not relaunching",
            )
        if attempt >= restart.max_attempts:
            return Decision(ActionKind.GIVE_UP, 0.0, f"attempt {attempt}/{restart.max_attempts} failed: giving up")
        wait = self.wait_after(attempt)
        return Decision(
            ActionKind.RELAUNCH,
            wait,
            f"{verdict.value}: relaunching in {wait:.1f}s (attempt {attempt + 1}/{restart.max_attempts})",
        )


def names_the_program(failure: FailureKind | None) -> bool:
    """Whether a failure's fingerprint says something about the program, so that seeing it twice
    (in a row, or on two shards) means the code fails, not the box.

    A death by a signal from outside (an admin's `kill -9`, a reaper, a flaky node; the shell's
    `Killed`, torchrun's report of a SIGKILLed rank) always reads the same, whatever killed it and
    however healthy the program was: its fingerprint is the killer's, never the program's.  A
    program that raised its own exception first is blamed on that exception (the root cause), so
    its failure is not `killed`."""
    return failure is not FailureKind.KILLED


def _short(fingerprint: str) -> str:
    return fingerprint if len(fingerprint) <= 12 else fingerprint[:12] + "…"
