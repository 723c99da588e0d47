"""Backoff waits: exponential growth from a floor, a cap, jitter on top; tenacity computes them.

tenacity is used as a library: its wait strategies say how long, and a wait strategy is a
function of a retry state that only tenacity's own ``Retrying`` makes.  So ``Backoff.waits()``
drives a ``Retrying`` whose every attempt asks for another and whose "sleep" records the wait
instead of sleeping: the successive waits, as tenacity computes them, with nothing faked.

Two ways to use it:
    ``Backoff.wait(n)``      the wait after the n-th failure in a row, for loops the caller owns
                             (the runner's relaunches; the SSH host's channel loops);
    ``Backoff.retrying()``   a ``tenacity.AsyncRetrying`` that owns the loop (the SSH reconnect).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import tenacity


class _Jitter(tenacity.wait_random):
    """tenacity's uniform jitter drawn from a generator of our own: a seeded one repeats, and
    nothing else's random state is touched."""

    def __init__(self, high: float, rng: random.Random) -> None:
        super().__init__(min=0.0, max=high)
        self._rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return self.wait_random_min + self._rng.random() * (self.wait_random_max - self.wait_random_min)


@dataclass(frozen=True)
class Backoff:
    """``initial_s * multiplier ** (n - 1)`` after the n-th failure, capped at ``max_s`` (never
    below ``initial_s``), plus up to ``jitter_s`` of jitter."""

    initial_s: float
    max_s: float
    multiplier: float = 2.0
    jitter_s: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def strategy(self) -> tenacity.wait.wait_base:
        exponential = tenacity.wait_exponential(multiplier=self.initial_s, exp_base=self.multiplier,
                                                min=self.initial_s, max=max(self.max_s, self.initial_s))
        return exponential + _Jitter(self.jitter_s, self.rng)

    def waits(self) -> Iterator[float]:
        """The waits after failure 1, 2, 3, ... (endless)."""
        slept: list[float] = []
        retrying = tenacity.Retrying(wait=self.strategy(), retry=tenacity.retry_always, stop=tenacity.stop_never,
                                     sleep=slept.append)
        for attempt in retrying:
            with attempt:
                pass
            if slept:
                yield slept.pop()

    def wait(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1-based; less counts as 1)."""
        n = min(max(1, failures), self._failures_to_cap())
        return next(itertools.islice(self.waits(), n - 1, None))

    def retrying(self, *, retry_on: type[BaseException], within_s: float | None,
                 before_sleep: Callable[[tenacity.RetryCallState], Any] | None = None) -> tenacity.AsyncRetrying:
        """Retry while ``retry_on`` is raised; stop before a wait that would end past ``within_s``
        from now (None: never stop).  Giving up raises ``tenacity.RetryError``."""
        stop = tenacity.stop_never if within_s is None else tenacity.stop_before_delay(max(0.0, within_s))
        return tenacity.AsyncRetrying(wait=self.strategy(), retry=tenacity.retry_if_exception_type(retry_on),
                                      stop=stop, before_sleep=before_sleep)

    def _failures_to_cap(self) -> int:
        """After this many failures the exponential part sits at its cap: later ones wait the same."""
        if self.initial_s <= 0 or self.multiplier <= 1 or self.max_s <= self.initial_s:
            return 1
        return math.ceil(math.log(self.max_s / self.initial_s, self.multiplier)) + 1
