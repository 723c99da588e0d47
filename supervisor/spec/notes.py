"""What `start` tells the user about a spec besides starting it, one line each: that it replaces
the spec an existing job of that name was started with (and which fields changed), and health
settings that can never apply because no probe pack of the spec reaches the phases they name.

Neither refuses the start: a changed spec is usually an edit the user meant (the job's history
carries on under the same name), and an unreachable setting is harmless, only ineffective."""

from __future__ import annotations

from typing import Any

from supervisor.core.events import Phase
from supervisor.probes import Pack
from supervisor.spec.model import JobSpec
from supervisor.spec.tables import HealthSpec

# Health fields keyed by (or listing) phases: each means nothing for a phase no pack recognises.
_PHASE_FIELDS = ("stall_floor_by_phase", "first_progress_s", "phase_deadline_s", "silence_phases", "waiting_phases")


def changed_fields(stored: dict[str, Any], spec: JobSpec) -> list[str]:
    """The fields (dotted: `health.stall_floor_s`, `params.lr`) that differ between a stored spec and ``spec``."""
    # Each side flattened once: flattening per key made a spec of 20,000 `env` entries take minutes.
    old, new = _flat(stored), _flat(spec.model_dump(mode="json"))
    return sorted(k for k in old.keys() | new.keys() if k != "spec_path" and old.get(k) != new.get(k))


def spec_change(job: str, stored: dict[str, Any], spec: JobSpec) -> str | None:
    """One line naming what differs between the spec the job ran with and ``spec``; None if nothing."""
    changed = changed_fields(stored, spec)
    old_path = stored.get("spec_path", "")
    if not changed and old_path == spec.spec_path:
        return None
    where = f"from {old_path} to {spec.spec_path}" if old_path != spec.spec_path else f"in {spec.spec_path}"
    what = ", ".join(changed) if changed else "no field"
    return f"job '{job}' keeps its history, but its spec changed {where}: {what}"


def unreachable_health(spec: JobSpec, packs: list[Pack]) -> str | None:
    """One line naming the health settings the spec sets for phases none of its packs reaches."""
    # Any probe that implies a phase reaches it (a metric line too: the watchdog enters it as `probe` does).
    reached = {p.phase for pack in packs for p in pack.probes if p.phase is not None}
    problems = []
    for name in _PHASE_FIELDS:
        phases: list[Phase] = list(getattr(spec.health, name))
        if phases == list(HealthSpec.model_fields[name].get_default(call_default_factory=True)):
            continue  # the defaults name every phase some pack may reach: only the user's choice is checked
        missing = [p.value for p in phases if p not in reached]
        if missing:
            problems.append(f"health.{name} ({', '.join(missing)})")
    if not problems:
        return None
    packs_text = ", ".join(p.name for p in packs) or "none"
    return (f"never applies: {'; '.join(problems)}: no probe pack of this job ({packs_text}) recognises "
            "that phase; add a pack that does or remove the setting")


def idle_learned_min(spec: JobSpec) -> str | None:
    """One line when ``learned_min_s`` can never let history tighten a bound: it is not under any
    floor it would replace."""
    health = spec.health
    least = health.learned_min_s
    floors = [health.stall_floor_s, *health.stall_floor_by_phase.values()]
    if least is None or least < max(floors):
        return None
    return (f"never applies: health.learned_min_s ({least:g}s) is not under the stall floor ({max(floors):g}s): "
            "history can only tighten a bound down to it; lower it or remove it")


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return out
