"""Job specs: `jobs/*.toml` validated by pydantic, and `--set key=value` overrides.

A spec's command is a list of argv templates.  `{name}` in an item is replaced by the
parameter `name` (from `[params]` or `--set name=value`) *inside that single item*: a
value is never split and never seen by a shell, so `--set out='; rm -rf /'` is just an
odd directory name.  Built-in names: `{python}` (the job's interpreter), `{spec_dir}`
(the directory of the spec file), `{state_dir}` (this machine's supervise state directory,
$SUPERVISE_HOME: where the built-in jobs write by default, since their spec_dir may be a
read-only site-packages), `{job}`, `{attempt}` and `{last_checkpoint}` (the newest complete
checkpoint `checkpoints` matches, "" when none: jobs/checkpoints.py).  Only plain `{name}` is
substituted: a format spec or conversion (`{v:>99999999}`, `{v!r}`) is refused, and `{{`
and `}}` stand for literal braces.
"""

from __future__ import annotations

import os
import re
import string
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from supervisor.core.config import default_paths
from supervisor.core.errors import SpecError, one_line, shown
from supervisor.core.host_url import LOCAL_HOST, is_local
from supervisor.core.overrides import OVERRIDABLE, FieldOverrides
from supervisor.core.textfile import read_toml
from supervisor.spec.disk import DiskSpec
from supervisor.spec.forewarn import first_signal_name
from supervisor.spec.placement import Placement, check_placement, place
from supervisor.spec.search import JOB_NAME, program_not_spec, spec_search_path
from supervisor.spec.tables import (
    AlertSpec,
    GpuSpec,
    HealthSpec,
    LimitsSpec,
    RestartSpec,
    Seconds,
    SecondsOrOff,
    SlurmSpec,
    _no_nul,
    _Strict,
)

_PACK_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")  # looked up as <name>.toml
_BUILTIN_PARAMS = ("python", "spec_dir", "state_dir", "job", "attempt", "shard", "num_shards", "last_checkpoint")

class JobSpec(_Strict):
    name: str
    description: str = ""
    host: str = LOCAL_HOST
    python: str = ""  # the job's interpreter; empty: the supervisor's own
    workdir: str = "."  # relative to the spec file
    command: Annotated[list[str], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    params: dict[str, str] = Field(default_factory=dict)
    # None: every pack found (built in, and in $SUPERVISE_PROBE_PATH), as `supervise probe` reads a log.
    probes: list[str] | None = None
    probe_files: list[str] = Field(default_factory=list)
    # Where the job writes its results (templates, as in `command`): shown by `status` and `--follow`.
    outputs: list[str] = Field(default_factory=list)
    unbuffered: bool = True  # PYTHONUNBUFFERED=1 unless the spec turns it off
    stop_grace_s: Seconds = 10.0
    # One attempt's wall-clock limit, in seconds (systemd's RuntimeMaxSec, Slurm's --time): past it the
    # attempt is stopped as `stop` does and judged `timeout`; relaunched only if restart.on names timeout.
    max_runtime: SecondsOrOff = None
    # A signal name ("SIGUSR1") the program gets before any kill (stop, a watchdog kill, max_runtime), to
    # save a checkpoint as with Slurm's --signal; local jobs only.
    kill_signal_first: str | None = None
    # How long the program has after kill_signal_first before the SIGTERM (less if it exits); 60 s when unset.
    checkpoint_grace_s: Seconds | None = None
    # PyTorch's flight recorder per attempt, dumped before a hang's kill (local jobs): "auto" where the
    # command runs torchrun / python -m torch.distributed.run, "on" for a launcher not seen as such.
    flight_recorder: Literal["auto", "on", "off"] = "auto"
    disk: DiskSpec = Field(default_factory=DiskSpec)  # the output folder's free space, watched (spec/disk.py)
    # A glob (a template, as in `command`; relative to `workdir`) of the job's checkpoints, on its
    # host: the newest complete one is `{last_checkpoint}` at each launch (jobs/checkpoints.py).
    checkpoints: str = ""
    # A file inside a checkpoint that says it was written whole ("COMPLETE"); empty: each counts.
    checkpoint_complete: str = ""
    restart: RestartSpec = Field(default_factory=RestartSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    alerts: AlertSpec = Field(default_factory=AlertSpec)
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    # What one attempt may use (memory, CPU time, tasks), enforced in its own cgroup: local jobs only.
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)  # used where `host` is a Slurm host
    # Jobs whose current run must be `done` before this one launches (supervisor/jobs/dependencies.py).
    after: list[str] = Field(default_factory=list)
    shards: Annotated[int, Field(ge=1, le=1024)] = 1  # > 1: one job of N shard attempts at once (sharding.py)
    # A sharded job's hosts, shard i on hosts[i % len]; with one shard, a pool: the job runs on the first
    # host not quarantined, and moves to the next after a host-level verdict (jobs/quarantine.py).
    hosts: list[str] = Field(default_factory=list)
    gather: list[str] = Field(default_factory=list)  # argv templates run once every shard is done
    spec_path: str = ""  # filled by the loader, not by the file
    shard_index: int = 0  # filled for each shard of a sharded job, not by the file

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not JOB_NAME.fullmatch(value):
            raise ValueError("1 to 64 letters, digits, '.', '_' and '-', starting with a letter or digit")
        return value

    @field_validator("kill_signal_first")
    @classmethod
    def _valid_first_signal(cls, value: str | None) -> str | None:
        return None if value is None else first_signal_name(value)

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _no_true_runtime(cls, value: object) -> object:
        # `true` would read as 1 second; `false` (like "off") means no limit.
        if value is True:
            raise ValueError("a number of seconds, or \"off\"; got true")
        return value

    @field_validator("after")
    @classmethod
    def _valid_after(cls, value: list[str]) -> list[str]:
        for name in value:
            if not JOB_NAME.fullmatch(name):
                raise ValueError(f"after: {shown(name)} is not a job name")
        return value

    @field_validator("probes")
    @classmethod
    def _valid_pack_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not _PACK_NAME_RE.fullmatch(name):
                raise ValueError(f"probe pack name {shown(name)}: letters, digits, '_' and '-' only "
                                 "(a pack file goes in probe_files)")
        return value

    @field_validator("command", "gather")
    @classmethod
    def _valid_templates(cls, value: list[str]) -> list[str]:
        for item in value:
            _template_fields(_no_nul(item))
        return value

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        # execve cannot pass these: they used to fail at launch, with the attempt left `launching`.
        for key, item in value.items():
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"environment variable name {shown(key)}: must be non-empty, without '=' or NUL")
            _template_fields(_no_nul(item))
        return value

    @field_validator("params")
    @classmethod
    def _valid_params(cls, value: dict[str, str]) -> dict[str, str]:
        for item in value.values():
            _no_nul(item)
        # `--set shards=3` once changed the field, not the job's own parameter: the names stay apart.
        clash = sorted(set(value) & set(cls.model_fields))
        if clash:
            raise ValueError(f"parameter {shown(clash[0])} has the name of a spec field; rename the parameter")
        return value

    @field_validator("outputs")
    @classmethod
    def _valid_outputs(cls, value: list[str]) -> list[str]:
        for item in value:
            _template_fields(_no_nul(item))
        return value

    @field_validator("disk")
    @classmethod
    def _valid_disk_path(cls, value: DiskSpec) -> DiskSpec:
        _template_fields(value.path)
        return value

    @field_validator("checkpoint_complete")
    @classmethod
    def _valid_marker(cls, value: str) -> str:
        if value and (value in (".", "..") or "/" in _no_nul(value)):
            raise ValueError(f"{shown(value)}: a file name inside each checkpoint, without '/'")
        return value

    @model_validator(mode="after")
    def _marker_needs_checkpoints(self) -> JobSpec:
        if self.checkpoint_complete and not self.checkpoints:
            raise ValueError("`checkpoint_complete` needs `checkpoints` (the glob of the checkpoints it is found in)")
        return self

    @model_validator(mode="after")
    def _adjusted_params_exist(self) -> JobSpec:
        # Found at `supervise check`, not at the first OOM hours into the run.
        for verdict, rule in self.restart.adjust.items():
            try:
                rule.check_against(self.params)
            except ValueError as exc:
                raise ValueError(f"restart.adjust.{verdict.value}: {exc}") from None
        return self

    @field_validator("python", "workdir", "checkpoints")
    @classmethod
    def _valid_path_template(cls, value: str) -> str:
        _template_fields(_no_nul(value))
        return value

    @model_validator(mode="after")
    def _remote_needs_explicit_paths(self) -> JobSpec:
        # On another machine the supervisor's own interpreter and a directory resolved
        # here mean nothing: a remote job names both.
        for host in {self.host, *self.hosts} - {LOCAL_HOST}:
            if not self.python:
                raise ValueError(f"host {host}: set `python` to the interpreter on that machine")
            if not (self.workdir.startswith("/") or self.workdir.startswith("~")):
                raise ValueError(f"host {host}: `workdir` must be an absolute path on that machine")
            if self.kill_signal_first is not None:
                # The signal is sent from this machine to a pid of this machine; elsewhere it would miss.
                raise ValueError(f"host {host}: `kill_signal_first` needs a local job (the signal is sent from this machine)")
            if self.flight_recorder == "on":
                # Its dump files and pipes are on that machine: this daemon could neither ask for nor read them.
                raise ValueError(f"host {host}: `flight_recorder = \"on\"` needs a local job (its dumps are read here)")
            if self.limits.resource_limits() is not None:
                # Enforced by a cgroup the daemon makes on this machine; Slurm has its own (--mem, --cpus-per-task).
                hint = " (on Slurm: [slurm] extra = [\"--mem=8G\"])" if host.startswith("slurm") else ""
                raise ValueError(f"host {host}: `[limits]` needs a local job (the attempt's cgroup is made on this "
                                 f"machine); remove [limits]{hint}")
            if self.health.watchdog_s is not None:
                # Its NOTIFY_SOCKET is a file on this machine: a program elsewhere could never ping it.
                raise ValueError(f"host {host}: `health.watchdog_s` needs a local job (its NOTIFY_SOCKET is local)")
        return self

    @model_validator(mode="after")
    def _grace_needs_a_signal(self) -> JobSpec:
        # A grace with no signal to start it would be silently ignored: said instead.
        if self.checkpoint_grace_s is not None and self.kill_signal_first is None:
            raise ValueError("`checkpoint_grace_s` needs `kill_signal_first` (the signal that asks for the checkpoint)")
        return self

    @model_validator(mode="after")
    def _valid_placement(self) -> JobSpec:
        check_placement(self.shards, self.hosts, self.gpu.devices, self.gpu.devices_per_shard)
        # One shard: `hosts` is a pool, the job runs on the first healthy one (runner/_waits.py);
        # a `host` beside it would be ignored.  ("local", the default, cannot be told from unset.)
        if self.shards == 1 and self.hosts and self.host != LOCAL_HOST:
            raise ValueError(f"`host` ({shown(self.host)}) and `hosts` both set: with one shard `hosts` is a pool "
                             "the job runs on (the first healthy host, moving on after a host fault); keep one")
        return self

    def for_shard(self, placement: Placement) -> JobSpec:
        """The spec one shard runs: its index, its host and its devices (CUDA_VISIBLE_DEVICES)."""
        gpu, env = self.gpu, dict(self.env)
        if placement.devices is not None:
            gpu = gpu.model_copy(update={"devices": list(placement.devices)})
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, placement.devices))
            # NVML numbers devices in PCI bus order; CUDA's own default order may differ.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return self.model_copy(update={"shard_index": placement.shard, "host": placement.host, "gpu": gpu,
                                       "env": env})

    def placements(self) -> list[Placement]:
        return place(self.shards, self.host, self.hosts, self.gpu.devices, self.gpu.devices_per_shard)

    @property
    def spec_dir(self) -> Path:
        return Path(self.spec_path).parent if self.spec_path else Path.cwd()

    def with_overrides(self, overrides: dict[str, str], fields: FieldOverrides | None = None) -> JobSpec:
        """Apply `--set` values (params only, by name) and the spec fields' own flags (`--shards`, ...)."""
        params = dict(self.params)
        for key, value in overrides.items():
            if key in params or (_is_referenced(self, key) and key not in JobSpec.model_fields):
                params[key] = value
            else:
                known = one_line(", ".join(sorted(params)) or "none")
                flag = f"; {key} is a spec field: use --{key}" if key in OVERRIDABLE else ""
                raise SpecError(
                    f"{self.spec_path or self.name}: --set {shown(key)}: no such parameter (known: {known}){flag}"
                )
        try:  # validated again: an override may not bring in what the file could not (a NUL, a format spec)
            return JobSpec.model_validate({**self.model_dump(), "params": params,
                                           **(fields.given() if fields is not None else {})})
        except ValidationError as exc:
            raise SpecError(_describe_validation(self.spec_path or self.name, exc)) from exc

    def param_value(self, name: str) -> str:
        """The parameter ``name`` as the command sees it (built-ins such as {state_dir} expanded)."""
        return self._expand("{" + name + "}", attempt=0)

    def interpreter(self) -> str:
        return self.python or sys.executable

    def resolved_workdir(self) -> str:
        """The working directory: relative to the spec file locally; as written on a remote host."""
        expanded = self._expand(self.workdir, attempt=0)
        if not is_local(self.host):
            return expanded
        return str((self.spec_dir / expanded).resolve())

    def argv(self, attempt: int, checkpoint: str = "") -> list[str]:
        """The command with every template expanded; each item stays one argv item."""
        values = self._template_values(attempt, checkpoint)
        return [self._expand(item, attempt, values) for item in self.command]

    def output_paths(self) -> list[str]:
        """The declared outputs with their templates expanded."""
        values = self._template_values(0)
        return [self._expand(item, 0, values) for item in self.outputs]

    def disk_folder(self) -> str:
        """The folder whose free space is watched: ``disk.path``, else the first output, else the
        working directory; relative to the working directory."""
        chosen = self.disk.path or (self.outputs[0] if self.outputs else "")
        if not chosen:
            return self.resolved_workdir()
        return os.path.join(self.resolved_workdir(), self._expand(chosen, 0))

    def checkpoint_glob(self) -> str:
        """`checkpoints` expanded, "" when unset (relative: to the working directory)."""
        return self._expand(self.checkpoints, attempt=0) if self.checkpoints else ""

    def environment(self, attempt: int, checkpoint: str = "") -> dict[str, str]:
        # The values once for all entries: worked out per entry, a spec of 20,000 `env` entries
        # (near the 1 MiB limit) took 2.8 s to expand, on the daemon's loop.
        values = self._template_values(attempt, checkpoint)
        env = {key: self._expand(value, attempt, values) for key, value in self.env.items()}
        if self.unbuffered:
            env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _expand(self, template: str, attempt: int, values: dict[str, str] | None = None) -> str:
        if values is None:
            values = self._template_values(attempt)
        try:
            missing = [name for name in _template_fields(template) if name not in values]
        except ValueError as exc:
            raise SpecError(f"{self.spec_path or self.name}: {exc}") from None
        if missing:
            raise SpecError(
                f"{self.spec_path or self.name}: command uses {{{missing[0]}}} but no parameter "
                f"'{missing[0]}' is defined; add it under [params] or pass --set {missing[0]}=VALUE"
            )
        return "".join(text + (values[name] if name is not None else "")
                       for text, name, _, _ in string.Formatter().parse(template))

    def _template_values(self, attempt: int, checkpoint: str = "") -> dict[str, str]:
        """What a template's {names} stand for: the built-ins, then the parameters."""
        values = {
            "last_checkpoint": checkpoint,
            "python": self.interpreter(),
            "spec_dir": str(self.spec_dir),
            "state_dir": str(default_paths().state_dir),
            "job": self.name,
            "attempt": str(attempt),
            "shard": str(self.shard_index),
            "num_shards": str(self.shards),
        }
        values.update({k: _expand_param(v, values) for k, v in self.params.items()})
        return values


def _expand_param(value: str, builtins: dict[str, str]) -> str:
    """A parameter's value with the built-ins in it (e.g. "{spec_dir}/data"); parameters do not
    refer to each other, so any other field, and a value that is no template at all, stays as written."""
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError:
        return value
    out = []
    for text, name, spec, conversion in parsed:
        out.append(text)
        if name is None:
            continue
        if name in builtins and not spec and conversion is None:
            out.append(builtins[name])
        else:
            out.append("{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
    return "".join(out)




def _template_fields(template: str) -> list[str]:
    """The parameter names ``template`` uses; ValueError unless every field is a plain ``{name}``."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"bad template {shown(template)}: {exc} (write a literal brace as {{{{ or }}}})") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"bad template {shown(template)}: {shown(name, 40)} is not a parameter name")
        if spec or conversion is not None:
            # `{v:>99999999}` built a 100 MB argument; only plain substitution is offered.
            raise ValueError(f"bad template {shown(template)}: write {{{name}}} alone, without '!' or ':' "
                             "(write a literal brace as {{ or }})")
        names.append(name)
    return names


def _is_referenced(spec: JobSpec, key: str) -> bool:
    templates = [*spec.command, *spec.env.values(), spec.workdir]
    return any(key in _template_fields(t) for t in templates) and key not in _BUILTIN_PARAMS


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {pair!r}: expected KEY=VALUE")
        overrides[key.strip()] = value
    return overrides


def load_spec(path: Path) -> JobSpec:
    """Read and validate one spec file; every problem is one SpecError line naming file and field."""
    raw = read_toml(path, "job spec", SpecError)
    raw.setdefault("name", path.stem)
    raw["spec_path"] = str(path.resolve())
    # A relative pack file is the spec's neighbour, wherever the daemon runs from.
    files = raw.get("probe_files")
    if isinstance(files, list):
        raw["probe_files"] = [str(path.resolve().parent / f) if isinstance(f, str) and f and not os.path.isabs(f)
                              else f for f in files]
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_describe_validation(path, exc)) from exc


def parse_stored(data: Any) -> JobSpec | str:
    """A spec as the store keeps it (JSON data), parsed: the spec, or why it no longer validates
    (one line: a spec stored by another version, a field since removed)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        return one_line("; ".join(_describe_error(error) for error in exc.errors()), 300)
    except SpecError as exc:  # a check past the fields' own (placement)
        return str(exc)


def _describe_validation(path: Path | str, exc: ValidationError) -> str:
    """Every problem at once, in the spec's terms: `unknown field 'comand' (did you mean 'command'?)`;
    one line, at most 300 characters besides the path, however long the input."""
    problems = [_describe_error(error) for error in exc.errors()]
    return f"{path}: " + one_line("; ".join(problems), 300)


def _describe_error(error: Any) -> str:
    loc = [str(p) for p in error["loc"]]
    where = one_line(".".join(loc) or "(top level)", 80)
    if error["type"] == "extra_forbidden":
        hint = _did_you_mean(loc[-1], _fields_at(loc[:-1]))
        return f"unknown field '{where}'{hint}"
    if error["type"] == "missing":
        return f"field '{where}' is required"
    got = error.get("input")
    echoed = error["type"] == "value_error"  # our own validators quote the value already
    got_text = f"; got {shown(got)}" if got is not None and not isinstance(got, dict) and not echoed else ""
    return f"field '{where}': {str(error['msg']).removeprefix('Value error, ')}{got_text}"


def _fields_at(loc: list[str]) -> list[str]:
    """The field names the spec allows at `loc` (a table such as `restart` or `health`)."""
    model: type[BaseModel] = JobSpec
    for part in loc:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [name for name in model.model_fields if name != "spec_path"]


def _did_you_mean(name: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else (f" (known: {', '.join(known)})" if known else "")


def find_spec(name_or_path: str) -> JobSpec:
    candidate = Path(name_or_path)
    if (said := program_not_spec(name_or_path)) is not None:  # `start train.py`: a program, not a spec
        raise SpecError(said)
    if candidate.suffix == ".toml" or os.sep in name_or_path:
        return load_spec(candidate)
    for directory in spec_search_path():
        path = directory / f"{name_or_path}.toml"
        if path.is_file():
            return load_spec(path)
    searched = ", ".join(str(d) for d in spec_search_path())
    raise SpecError(f"no job spec '{name_or_path}.toml' in {searched}; pass a path to a .toml file")
