"""Failure text to ``FailureKind``: the packs' ``classify`` rules, first match wins."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import re2

from supervisor.core.events import FailureKind
from supervisor.probes._pack import Pack, re2_options


class Classifier:
    """Failure text to FailureKind: the packs' ``classify`` rules, first match wins."""

    def __init__(self, packs: Sequence[Pack]) -> None:
        self._kinds: list[FailureKind] = []
        self._set: Any = None
        rules = [rule for pack in packs for rule in pack.classify]
        if rules:
            rset = re2.Set.SearchSet(re2_options(capture=False))
            for rule in rules:
                rset.Add(rule.regex)
                assert rule.failure is not None
                self._kinds.append(rule.failure)
            rset.Compile()
            self._set = rset

    def __call__(self, text: str) -> FailureKind:
        if self._set is None or not text:
            return FailureKind.OTHER
        hits = self._set.Match(text)
        return self._kinds[min(hits)] if hits else FailureKind.OTHER
