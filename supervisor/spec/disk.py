"""``[disk]``: the free space of the job's output folder, watched while an attempt runs.

A checkpoint write that fails for want of space loses the run since the last one (and may leave a
half-written checkpoint that the next attempt loads): the folder's free space is sampled like GPU
memory, a warning comes while a write still fits, and ``min_free_mib`` holds or stops the attempt
before the disk is full."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from supervisor.spec.tables import PositiveSeconds, _no_nul, _Strict

MiB = Annotated[int, Field(ge=0, le=1 << 40)]  # up to an exbibyte, in MiB


class DiskSpec(_Strict):
    # The folder watched (a template, as in `command`): empty, the first of `outputs`, else `workdir`.
    path: str = ""
    # Below this much free space, a `disk_low` warning (once, until it is above again); 0 turns it off.
    warn_free_mib: MiB = 10240
    # Below this, `on_low` is done: the attempt held (SIGSTOP, resumed when the space is back) or
    # stopped as `supervise stop` does; unset: only the warning.
    min_free_mib: MiB | None = None
    # What is done under min_free_mib: "stop" as `supervise stop` (no relaunch), or "hold" (SIGSTOP until space is back).
    on_low: Literal["hold", "stop"] = "stop"
    every_s: PositiveSeconds = 10.0  # how often the free space is read

    @field_validator("path")
    @classmethod
    def _valid_path(cls, value: str) -> str:
        return _no_nul(value)

    @model_validator(mode="after")
    def _warned_first(self) -> DiskSpec:
        if self.min_free_mib is not None and self.warn_free_mib and self.min_free_mib > self.warn_free_mib:
            raise ValueError(f"min_free_mib ({self.min_free_mib}) is above warn_free_mib ({self.warn_free_mib}): "
                             f"the warning would come after the {self.on_low}; lower min_free_mib")
        return self
