"""`after`: a job that launches only once other jobs' current runs are `done`.

A job's spec may name jobs in `after` (`supervise start train --after extract`, or a pipeline's
steps).  Its runner waits, with the job `waiting` and the reason shown, until every named job's
current run is `done`; if one gave up (failed, stopped or itself cancelled) the job is
`cancelled` with that one reason and nothing launches.  The check reads only the store, so a
daemon restarted mid-wait asks the same question again and gets the same answer.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from supervisor.core.errors import NotFound, SpecError
from supervisor.core.events import JobState
from supervisor.spec.model import JobSpec
from supervisor.store.database import Store

GIVEN_UP = frozenset({JobState.FAILED, JobState.STOPPED, JobState.CANCELLED})


@dataclass(frozen=True)
class Readiness:
    """Where a job's `after` stands now: ready, cancelled (and why), or still waiting (for what)."""

    ready: bool
    cancelled: str | None = None
    waiting: str = ""


def readiness(store: Store, after: list[str]) -> Readiness:
    pending = []
    for name in after:
        try:
            row = store.job(name)
        except NotFound:
            return Readiness(False, cancelled=f"{name} no longer exists (it was removed)")
        if row.state is JobState.CANCELLED:
            # Its reason already names the job that gave up first; the prefix is said once, by whoever shows it.
            return Readiness(False, cancelled=(row.reason or name).removeprefix("not launched: "))
        if row.state in GIVEN_UP:
            return Readiness(False, cancelled=f"{name} {row.state}: {row.reason}" if row.reason else f"{name} {row.state}")
        if row.state is not JobState.DONE:
            pending.append(f"{name} ({row.state})")
    if pending:
        return Readiness(False, waiting="waiting for " + ", ".join(pending))
    return Readiness(True)


def check_after(store: Store, planned: Mapping[str, list[str]]) -> None:
    """Refuse (SpecError, nothing stored) an `after` that names an unknown job or closes a cycle.
    ``planned``: the jobs about to be started, by name, with their `after`; the others come from
    the store as their last start left them."""
    graph: dict[str, list[str]] = {}
    todo = list(planned)
    while todo:
        name = todo.pop()
        if name in graph:
            continue
        graph[name] = list(planned[name]) if name in planned else _stored_after(store, name)
        for dependency in graph[name]:
            if dependency not in planned and not _exists(store, dependency):
                raise SpecError(f"{name}: after: no job named '{dependency}'; start it first or drop it from `after`")
            todo.append(dependency)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle = " -> ".join(reversed(exc.args[1]))
        raise SpecError(f"after: a cycle ({cycle}): no job in it could ever start; remove one of these `after`s") from None


def _exists(store: Store, name: str) -> bool:
    try:
        store.job(name)
    except NotFound:
        return False
    return True


def _stored_after(store: Store, name: str) -> list[str]:
    try:
        return store.job(name).after
    except NotFound:
        return []


def with_after(spec: JobSpec, after: list[str]) -> JobSpec:
    """``spec`` with `--after` jobs added to its own `after`."""
    if not after:
        return spec
    merged = list(dict.fromkeys([*spec.after, *after]))
    try:
        return JobSpec.model_validate({**spec.model_dump(), "after": merged})
    except ValidationError as exc:
        raise SpecError(f"--after: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
