"""A job spec checked before anything is stored or launched: its file, overrides and templates,
its probe packs, its command and working directory, its host's address; and the notes `start`
prints beside it.  The file reads run in a thread: a spec or a pack may sit on a slow or hung file
system, and the loop serves every job."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.core import protocol
from supervisor.core.errors import ConnectionLost, HostError, SpecError
from supervisor.core.overrides import FieldOverrides
from supervisor.core.resource_limits import refusal
from supervisor.daemon.api._http import _checked_name
from supervisor.hosts.reach import refuse_if_nothing_listens
from supervisor.jobs.dependencies import with_after
from supervisor.probes import load_packs
from supervisor.spec.command_check import check_local_command
from supervisor.spec.model import JobSpec, load_spec
from supervisor.spec.notes import changed_fields, idle_learned_min, spec_change, unreachable_health
from supervisor.store.database import JobRow

if TYPE_CHECKING:
    from supervisor.hosts.registry import Hosts


async def validated_spec(body: protocol.StartRequest, hosts: Hosts) -> JobSpec:
    """Everything a runner needs, checked before anything is stored: the spec with its
    overrides, its argv templates, its probe packs and its host's address."""
    _checked_name(body.spec_path, "spec_path")
    # In a thread: the spec and its packs may sit on a slow or hung file system, and the loop serves every job.
    spec = await asyncio.to_thread(load_checked_spec, body)
    check_hosts(spec, hosts)
    try:
        await refuse_if_nothing_listens(spec.host)
    except ConnectionLost as exc:
        raise ConnectionLost(f"could not start {spec.name}: {exc}") from exc
    return spec


def check_hosts(spec: JobSpec, hosts: Hosts) -> None:
    for field, host in [("host", spec.host), *(("hosts", h) for h in spec.hosts)]:
        try:
            hosts.check(host)  # parses an ssh:// address (connecting is the runner's job, with retries)
        except (HostError, SpecError) as exc:  # SpecError: a scheme no host kind has
            raise SpecError(f"{spec.spec_path}: field '{field}': {exc}") from exc
    limits = spec.limits.resource_limits()
    if limits is not None:  # the spec allows [limits] on local jobs only: the local host's cgroups say
        capabilities = hosts.local.host.capabilities
        refused = refusal(limits, capabilities.cgroup_controllers, capabilities.cgroup_note)
        if refused is not None:
            # 69, not 65: the spec is sound and would run on a host that gives attempts these controllers.
            raise HostError(f"could not start {spec.name}: {refused}")


def start_notes(spec: JobSpec, stored: dict[str, Any] | None) -> list[str]:
    changed = spec_change(spec.name, stored, spec) if stored is not None else None
    packs = load_packs(spec.probes, spec.probe_files)
    return [note for note in (changed, unreachable_health(spec, packs), idle_learned_min(spec)) if note]


def reloaded_spec(current: JobSpec, fields: FieldOverrides) -> JobSpec:
    """`restart --reload`: the job's spec file as it is now, with this restart's field flags and the
    `after` the job was started with.  Its params are the file's: `--set` values given to an earlier
    start are not carried over (the note names every field that changed, params included)."""
    if not current.spec_path:
        raise SpecError(f"job '{current.name}' has no spec file to reload; `supervise start` one")
    spec = load_spec(Path(current.spec_path))
    if spec.name != current.name:
        raise SpecError(f"{current.spec_path} now names job '{spec.name}', not '{current.name}': "
                        f"`supervise start {current.spec_path}` starts that one")
    spec = with_after(spec.with_overrides({}, fields), current.after)
    spec.argv(1)  # a missing template parameter is said before the job is stopped
    return spec


def restart_note(current: JobSpec, stored: dict[str, Any], *, reloaded: bool) -> str | None:
    """One line on the spec file of a job being restarted: what `--reload` took from it, or that it
    changed (or no longer loads) since the job was started and was not taken.  None: nothing to say."""
    if reloaded:
        changed = changed_fields(stored, current)
        return f"took {current.spec_path} anew: " + (f"changed {', '.join(changed)}" if changed else "nothing changed")
    if not current.spec_path:
        return None
    restart = f"`supervise restart {current.name} --reload` takes the file"
    try:
        on_disk = load_spec(Path(current.spec_path))
    except SpecError as exc:
        return f"{exc}: restarted with the spec it was started with"
    changed = changed_fields(stored, on_disk)
    if not changed:
        return None
    return (f"{current.spec_path} changed since {current.name} was started ({', '.join(changed)}): restarted with "
            f"the spec it was started with; {restart}")


def load_checked_spec(body: protocol.StartRequest) -> JobSpec:
    spec = with_after(load_spec(Path(body.spec_path)).with_overrides(body.overrides, body.fields), body.after)
    spec.argv(1)  # expand templates now: a missing parameter is reported before anything runs
    check_local_command(spec)
    if spec.shards > 1 and spec.gather:
        spec.model_copy(update={"command": spec.gather}).argv(1)
    load_packs(spec.probes, spec.probe_files)
    return spec


def stored_spec(row: JobRow) -> JobSpec:
    if row.spec is None:
        raise SpecError(f"job '{row.name}': its stored spec no longer validates ({row.spec_error}); "
                        f"`supervise start` its spec file")
    return row.spec
