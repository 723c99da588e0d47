"""Pipeline files: steps that run one after another, each a job spec, outputs passed forward.

A pipeline file is a TOML file with a `[pipeline]` table (jobs/eagle3.toml)::

    [pipeline]
    name = "eagle3"
    [pipeline.params]                   # `--set model=...` when the pipeline is started
    model = ""
    [[pipeline.steps]]
    name = "extract"
    job = "extract"                     # a spec name (next to this file, then the job search path) or a path
    set = { model = "{model}", out = "{state_dir}/out/eagle3/extract" }
    [[pipeline.steps]]
    name = "train"
    job = "train"                       # after = ["extract"] by default: the step before it
    set = { data = "{steps.extract.params.out}" }

In a step's `set` values, `{NAME}` is the pipeline parameter NAME and `{steps.S.params.P}` the
parameter P of step S as its command sees it (built-ins expanded); S must be a step it runs
after.  Any other `{...}` is left to the job spec (`{state_dir}`, `{spec_dir}`).  Each step runs
as the job `PIPELINE.STEP` with `after` set, so the runners do the sequencing
(supervisor/jobs/dependencies.py); the coordinator (supervisor/jobs/pipelines.py) starts them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from supervisor.core.errors import SpecError, one_line, shown
from supervisor.core.overrides import OVERRIDABLE, FieldOverrides
from supervisor.core.textfile import read_toml
from supervisor.spec.model import JobSpec, _describe_validation, load_spec
from supervisor.spec.search import program_not_spec, spec_search_path

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")  # no '.': `{steps.S.params.P}` splits on it
_STEP_REF = re.compile(r"\{steps\.([^{}]*)\}")
_REF_PARTS = re.compile(r"([^.]+)\.params\.([A-Za-z_][A-Za-z0-9_]*)")
_PARAM_REF = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _valid_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError("1 to 32 letters, digits, '_' and '-', starting with a letter or digit")
    return value


_Name = Annotated[str, AfterValidator(_valid_name)]  # a pipeline's or a step's name


class StepSpec(_Strict):
    name: _Name
    job: str
    set: dict[str, str] = Field(default_factory=dict)  # the job's [params] only
    after: list[str] | None = None  # step names; None: the step before it in the file
    # The job's spec fields a step may change (core/overrides.py); `--host` and the like override them.
    host: str | None = None
    python: str | None = None
    workdir: str | None = None
    shards: int | None = None

    def fields(self) -> FieldOverrides:
        return FieldOverrides(host=self.host, python=self.python, workdir=self.workdir, shards=self.shards)


class PipelineSpec(_Strict):
    name: _Name
    description: str = ""
    params: dict[str, str] = Field(default_factory=dict)
    steps: Annotated[list[StepSpec], Field(min_length=1)]


@dataclass(frozen=True)
class ResolvedStep:
    step: str
    spec: JobSpec  # named PIPELINE.STEP, `after` the jobs of the steps it runs after
    after_steps: tuple[str, ...]

    @property
    def job(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class ResolvedPipeline:
    name: str
    spec_path: str
    steps: tuple[ResolvedStep, ...]  # in the order they run


def is_pipeline_file(path: Path) -> bool:
    return "pipeline" in read_toml(path, "job spec", SpecError)


def load_pipeline(path: Path) -> PipelineSpec:
    raw = read_toml(path, "pipeline", SpecError)
    if set(raw) != {"pipeline"}:
        extra = ", ".join(sorted(set(raw) - {"pipeline"}))
        raise SpecError(f"{path}: a pipeline file holds only the [pipeline] table (found also: {one_line(extra)})")
    try:
        return PipelineSpec.model_validate(raw["pipeline"])
    except ValidationError as exc:
        raise SpecError(_describe_validation(path, exc)) from exc


def fingerprint(spec: JobSpec) -> str:
    """What "the same inputs" means for a step: its spec as resolved (file path aside) and every
    parameter as its command sees it."""
    data = {"spec": spec.model_dump(mode="json", exclude={"spec_path"}),
            "params": {name: spec.param_value(name) for name in sorted(spec.params)}}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def resolve(pipeline: PipelineSpec, path: Path, overrides: dict[str, str],
            fields: FieldOverrides | None = None) -> ResolvedPipeline:
    """Every step's job spec, references, `--set`s and field flags applied (`--host` to every
    step), in run order; every problem a SpecError."""
    where = str(path)
    fields = fields or FieldOverrides()
    if fields.shards is not None:
        raise SpecError(f"{where}: --shards applies to a job; a pipeline step says its own `shards = N`")
    params, per_step = _split_overrides(pipeline, where, overrides)
    order = _run_order(pipeline, where)
    names = {s.name for s in pipeline.steps}
    ancestors: dict[str, set[str]] = {}
    done: dict[str, ResolvedStep] = {}
    for step in order:
        field = next((key for key in step.set if key in OVERRIDABLE), None)
        if field is not None:
            raise SpecError(f"{where}: step {step.name}: set: {shown(field)} is a spec field, not a parameter: "
                            f"write `{field} = ...` in the step itself")
        after = _after(pipeline, step)
        ancestors[step.name] = set(after).union(*(ancestors[a] for a in after))
        values = {k: _substitute(v, step.name, params, done, ancestors[step.name], names, where)
                  for k, v in step.set.items()}
        spec = _step_spec(pipeline, step, path, {**values, **per_step.get(step.name, {})}, step.fields().over(fields),
                          [done[a].job for a in after], where)
        done[step.name] = ResolvedStep(step.name, spec, tuple(after))
    return ResolvedPipeline(pipeline.name, str(path.resolve()), tuple(done[s.name] for s in order))


def _split_overrides(pipeline: PipelineSpec, where: str, overrides: dict[str, str]
                     ) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    params = dict(pipeline.params)
    per_step: dict[str, dict[str, str]] = {}
    steps = {s.name for s in pipeline.steps}
    for key, value in overrides.items():
        step, dot, name = key.partition(".")
        if key in pipeline.params:
            params[key] = value
        elif dot and step in steps and name:
            per_step.setdefault(step, {})[name] = value
        else:
            known = ", ".join([*sorted(pipeline.params), "STEP.PARAM"])
            flag = f"; {key} is a spec field: use --{key}" if key in OVERRIDABLE else ""
            raise SpecError(f"{where}: --set {shown(key)}: no such pipeline parameter (known: {one_line(known)}){flag}")
    return params, per_step


def _after(pipeline: PipelineSpec, step: StepSpec) -> list[str]:
    if step.after is not None:
        return list(step.after)
    index = [s.name for s in pipeline.steps].index(step.name)
    return [pipeline.steps[index - 1].name] if index else []


def _run_order(pipeline: PipelineSpec, where: str) -> list[StepSpec]:
    """The steps, each after those it names (file order otherwise); unknown names and cycles refused."""
    names = [s.name for s in pipeline.steps]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SpecError(f"{where}: step '{twice}' is defined twice; give each step its own name")
    for step in pipeline.steps:
        for name in _after(pipeline, step):
            if name not in names:
                raise SpecError(f"{where}: step {step.name}: after: no step named {shown(name)} (steps: {', '.join(names)})")
    order: list[StepSpec] = []
    while len(order) < len(names):
        placed = {s.name for s in order}
        ready = [s for s in pipeline.steps if s.name not in placed and set(_after(pipeline, s)) <= placed]
        if not ready:
            stuck = ", ".join(s.name for s in pipeline.steps if s.name not in placed)
            raise SpecError(f"{where}: after: a cycle among steps {stuck}: none of them could ever start")
        order.append(ready[0])
    return order


def _substitute(value: str, step: str, params: dict[str, str], done: dict[str, ResolvedStep],
                ancestors: set[str], names: set[str], where: str) -> str:
    def step_ref(match: re.Match[str]) -> str:
        parts = _REF_PARTS.fullmatch(match.group(1))
        if parts is None:
            raise SpecError(f"{where}: step {step}: {shown(match.group(0))}: write {{steps.STEP.params.NAME}}")
        source, name = parts.groups()
        if source not in ancestors:
            why = "no such step" if source not in names else f"{step} does not run after it"
            raise SpecError(f"{where}: step {step}: {match.group(0)}: {shown(source)}: {why} "
                            f"(steps it runs after: {', '.join(sorted(ancestors)) or 'none'})")
        spec = done[source].spec
        if name not in spec.params:
            known = ", ".join(sorted(spec.params)) or "none"
            raise SpecError(f"{where}: step {step}: {match.group(0)}: step {source} has no parameter '{name}' (known: {one_line(known)})")
        return spec.param_value(name)

    value = _STEP_REF.sub(step_ref, value)
    return _PARAM_REF.sub(lambda m: params.get(m.group(1), m.group(0)), value)


def _step_spec(pipeline: PipelineSpec, step: StepSpec, path: Path, overrides: dict[str, str],
               fields: FieldOverrides, after_jobs: list[str], where: str) -> JobSpec:
    try:
        base = load_spec(_find_job(step.job, path.parent)).with_overrides(overrides, fields)
        spec = JobSpec.model_validate({**base.model_dump(), "name": f"{pipeline.name}.{step.name}", "after": after_jobs})
        spec.argv(1)  # a missing parameter is reported now, before anything runs
    except SpecError as exc:
        raise SpecError(f"{where}: step {step.name}: {exc}") from None
    except ValidationError as exc:
        raise SpecError(_describe_validation(f"{where}: step {step.name}", exc)) from None
    return spec


def _find_job(job: str, beside: Path) -> Path:
    if job.endswith(".toml") or "/" in job:
        return (beside / job).resolve()
    for directory in [beside, *spec_search_path()]:
        if (directory / f"{job}.toml").is_file():
            return directory / f"{job}.toml"
    raise SpecError(f"job {shown(job)}: no {job}.toml beside the pipeline file or in the job search path")


def find_pipeline(name_or_path: str) -> Path | None:
    """The pipeline file `supervise start NAME` means, or None when NAME is a job (or nothing)."""
    candidate = Path(name_or_path)
    if program_not_spec(name_or_path) is not None:
        return None  # a program given by its path: find_spec says what to do instead
    if candidate.suffix == ".toml" or "/" in name_or_path:
        paths = [candidate]
    else:
        paths = [d / f"{name_or_path}.toml" for d in spec_search_path()]
    path = next((p for p in paths if p.is_file()), None)
    return path if path is not None and is_pipeline_file(path) else None
