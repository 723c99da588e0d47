"""The pydantic models of a probe pack's TOML (``_pack`` documents the format): the shape of
each table, checked before ``_pack`` reads the values.  Kept apart so that only a pack being
validated pays pydantic's import."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


_ID = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"


class ProbeDef(_Strict):
    id: str = Field(pattern=_ID)
    regex: str
    kind: str
    phase: str | None = None
    failure: str | None = None
    consequence: bool = False
    fatal: bool = False
    fields: dict[str, str] = Field(default_factory=dict)
    constants: dict[str, str | int | float | bool] = Field(default_factory=dict, alias="set")
    description: str = ""


class PrefixDef(_Strict):
    id: str = Field(pattern=_ID)
    regex: str
    description: str = ""


class ClassifyDef(_Strict):
    failure: str
    regex: str
    description: str = ""


class FrameDef(_Strict):
    phase: str
    regex: str
    description: str = ""


class PackDef(_Strict):
    name: str = Field(pattern=_ID)
    description: str = ""
    priority: int = 50
    tracebacks: bool = False
    prefixes: list[PrefixDef] = Field(default_factory=list)
    headers: list[PrefixDef] = Field(default_factory=list)
    classify: list[ClassifyDef] = Field(default_factory=list)
    frames: list[FrameDef] = Field(default_factory=list)
    probes: list[ProbeDef] = Field(default_factory=list)
