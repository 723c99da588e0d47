"""Where an attempt starts from: the checkpoint it is given as `{last_checkpoint}`
(jobs/checkpoints.py) and its parameters after any `[restart.adjust]` change (jobs/adjust.py),
worked out before its launch and, for a relaunch, said in the alert that announces it."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.errors import SuperviseError, one_line
from supervisor.core.events import Verdict
from supervisor.jobs import checkpoints
from supervisor.jobs.adjust import params_after
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.spec.adjust import changed
from supervisor.spec.model import JobSpec


@dataclass(frozen=True)
class StartPoint:
    checkpoint: str = ""  # "" none
    params: dict[str, str] | None = None  # None: the spec's own
    changes: tuple[str, ...] = ()  # "batch_size=32 (was 64)", against the attempt before
    # What the attempt before failed with is no evidence of a deterministic bug: this one starts
    # from an older checkpoint than the one that failed to load, or with other parameters.
    new_ground: bool = False
    note: str = ""  # why no checkpoint could be listed, when that is so

    def describe(self) -> str:
        """What the next attempt starts from, for the relaunch's alert and the attempt's record."""
        parts = []
        if self.checkpoint:
            parts.append(f"from checkpoint {self.checkpoint}")
        if self.changes:
            parts.append("with " + ", ".join(self.changes))
        return one_line("; ".join(parts), 400)

    def spec_for(self, spec: JobSpec) -> JobSpec:
        """The spec the attempt's command and environment are expanded from."""
        return spec if self.params is None else spec.model_copy(update={"params": self.params})


async def first(spec: JobSpec, ctx: RunnerContext) -> StartPoint:
    """A run's first attempt: the newest complete checkpoint, the spec's parameters."""
    if not spec.checkpoints:
        return StartPoint()
    listing = await checkpoints.list_complete(ctx.host, spec)
    return StartPoint(checkpoint=checkpoints.choose(listing, set()), note=listing.note)


async def after(spec: JobSpec, ctx: RunnerContext, live: Live, verdict: Verdict) -> StartPoint:
    """The attempt after ``live`` (judged ``verdict``): a checkpoint that failed to load in this run
    is passed over for the one before it; parameters changed by the rule for ``verdict``."""
    row = live.row
    params = params_after(spec, row, verdict)
    before = row.params if row.params is not None else spec.params
    changes = tuple(changed(before, params if params is not None else spec.params))
    if not spec.checkpoints:
        return StartPoint(params=params, changes=changes, new_ground=bool(changes))
    run = [r for r in ctx.store.attempts(spec.name) if r.run == row.run and r.shard == row.shard and r.n < row.n]
    bad = checkpoints.failed_to_load(run)
    failed_here = bool(row.checkpoint) and checkpoints.is_failure(verdict) and live.watchdog.progress is None
    if failed_here and row.checkpoint:
        bad.add(row.checkpoint)
    try:
        listing = await checkpoints.list_complete(ctx.host, spec)
    except SuperviseError as exc:
        # The attempt's end is still to be recorded: the next starts where this one did, and says why.
        return StartPoint(checkpoint=row.checkpoint or "", params=params, changes=changes, new_ground=bool(changes),
                          note=str(exc))
    checkpoint = checkpoints.choose(listing, bad)
    older_left = failed_here and bool(checkpoint)
    return StartPoint(checkpoint=checkpoint, params=params, changes=changes, new_ground=older_left or bool(changes),
                      note=listing.note)
