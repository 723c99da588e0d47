"""The spec fields a user may change when starting a job, each with its own flag (`--host`,
`--python`, `--workdir`, `--shards`) and its own key in a pipeline step.  `--set` changes
`[params]` only: a parameter named like one of these once changed the field instead (`--set
shards=3` ran 3 copies of a job whose own parameter `shards` said 64)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class FieldOverrides(BaseModel):
    """What the flags set; None: as the spec says.  Values are checked as the spec's own are (a
    JobSpec is validated again with them), so a bad one is one SpecError line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = None
    python: str | None = None
    workdir: str | None = None
    shards: int | None = None

    def given(self) -> dict[str, Any]:
        """Only the fields set, as a spec's fields."""
        return self.model_dump(exclude_none=True)

    def over(self, other: FieldOverrides) -> FieldOverrides:
        """These, with ``other``'s where ``other`` sets one (the command line over a step's keys)."""
        return FieldOverrides(**{**self.given(), **other.given()})


OVERRIDABLE = tuple(FieldOverrides.model_fields)  # host, python, workdir, shards
