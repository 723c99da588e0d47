"""reference/exit-codes.md, reference/events.md and reference/metrics.md, from supervisor/core/errors.py,
supervisor/core/events.py, supervisor/core/alert_routes.py and supervisor/daemon/metrics.py."""

from __future__ import annotations

import re
from enum import Enum

from .source import cell, doc, member_comments

# What each exit code means to a user and which verbs return it.  The generator stops when the code
# uses a code not described here (errors.TABLE, plus 0, 1 and 2) or this describes one it does not use.
EXIT_CODES = {
    0: ("ok", "every verb"),
    1: ("the job failed or gave up; the log shows a crash; no stack could be dumped (the job is not running, "
        "no py-spy, ptrace refused)", "`start --follow`, `restart --follow`, `status JOB`, `probe`, `stack`"),
    2: ("usage: an unknown option, a bad value (`--every 0`, `-n 0`, `--since soon`, `--kind nope`)",
        "every verb (argparse)"),
    65: ("bad job spec or probe pack", "`start`, `restart`, `probe`"),
    66: ("unknown job or attempt; a log that cannot be read",
         "`status JOB`, `stop`, `hold`, `release`, `stack`, `restart`, `rm`, `prune JOB`, `logs`, `events`, "
         "`attempts`, `report`, `probe`"),
    69: ("daemon or host unavailable", "every verb that talks to the daemon, `doctor`"),
    70: ("internal error in the daemon (its log has the traceback)", "every verb that talks to the daemon"),
    74: ("I/O: the store cannot be written, or is busy (another process holds its lock: try again), or a file "
         "the CLI writes", "every verb that talks to the daemon, `report --out`"),
    75: ("the job is already running (`supervise stop JOB` first)", "`start`, `rm`"),
    78: ("configuration", "every verb that starts the daemon, `config show`"),
}
# Verdicts the source leaves without a comment (the guide says more: guides/verdicts.md).
VERDICTS = {
    "healthy": "nothing wrong now",
    "stalled": "a bar did not advance within its bound, a phase showed no progress within `first_progress_s` or "
               "outlived `phase_deadline_s`, or a start-up phase printed nothing but \"still waiting\" lines for "
               "`waiting_s`",
    "silent": "no output at all for `silence_s` in `silence_phases`, or before any phase for "
              "`silence_before_phase_s`",
    "crashed": "a non-zero exit, exit 0 straight after a failure, a failure followed by a hang "
               "(`hang_after_failure_s`), or a fatal failure while it still runs",
    "oom": "CUDA out of memory in the log, or the kernel's OOM killer (cgroup `memory.events`, the kernel log)",
    "leaked": "the attempt's GPU memory was not released after it ended: not relaunched",
    "done": "exit 0 (or a requested shutdown once ready)",
}
_TREE_LINE = re.compile(r"[├└]── (\w+)\s+(.+)$")


def exit_codes() -> str:
    import supervisor.core.errors as errors

    used = {row.cls.exit_code for row in errors.TABLE} | {0, 1, 2}
    if used != set(EXIT_CODES):
        raise SystemExit(f"docs/refgen/tables.py: EXIT_CODES has {sorted(EXIT_CODES)}, the code uses {sorted(used)}")
    what = {m.group(1): m.group(2).strip() for m in map(_TREE_LINE.search, (errors.__doc__ or "").splitlines()) if m}
    out = ["# Exit codes and errors", "",
           "Generated from `supervisor/core/errors.py` (its `TABLE`) by `python docs/gen_reference.py`; do not edit by",
           "hand.", "", "## Exit codes", "",
           "| code | meaning | e.g. |", "|-----:|---------|------|"]
    out += [f"| {code} | {cell(meaning)} | {cell(verbs)} |" for code, (meaning, verbs) in sorted(EXIT_CODES.items())]
    out += ["",
            "`probe`, like `grep` for a match: 1 when the log shows a crash (outcome `crashed` or `oom`), 0 for any",
            "other outcome (`ready`, `done`, `incomplete`); 65 when no probe pack loads (a broken `--pack-file`, an",
            "unknown `--pack`, or none found at all); 66 when the log cannot be read. `status JOB` exits 1 when the",
            "job failed, like `systemctl is-failed`. Ctrl-C exits 130 and leaves the job running.", "",
            "## Errors", "",
            "Every error is one line on stderr, `supervise: ...`, never a traceback. An error the daemon finds is",
            "answered as an `ErrorBody` (its `kind` below, with the HTTP status) and the CLI raises the same class, so",
            "it exits with the same code as if the CLI had found it.", "",
            "| kind | class | HTTP status | exit code | what |", "|---|---|---:|---:|---|"]
    for row in errors.TABLE:
        out.append(f"| `{row.kind.value}` | `{row.cls.__name__}` | {row.status} | {row.cls.exit_code} | "
                   f"{cell(what.get(row.cls.__name__, ''))} |")
    return "\n".join(out).rstrip() + "\n"


def _enum_table(cls: type[Enum], heading: str, extra: dict[str, str] | None = None) -> list[str]:
    notes = member_comments(cls)
    out = [f"## {heading}", ""]
    if cls.__doc__ and cls.__doc__ != Enum.__doc__ and "An enumeration" not in cls.__doc__:
        out += [doc(cls), ""]
    out += ["| value | notes |", "|---|---|"]
    for member in cls:
        note = (extra or {}).get(member.value) or notes.get(member.name, "")
        out.append(f"| `{member.value}` | {cell(note)} |")
    return out + [""]


def events() -> str:
    from supervisor.core.alert_routes import AlertKind, Severity
    from supervisor.core.events import (AttemptState, BoundKind, EventKind, FailureKind, JobState, Outcome, Phase,
                                   ProbeKind, Verdict)

    out = ["# Events, verdicts and states", "",
           "Generated from `supervisor/core/events.py` and `supervisor/core/alert_routes.py` by `python docs/gen_reference.py`; do",
           "not edit by hand. These strings are canonical: probe packs, the store, the API, `--json` output, alerts",
           "and metrics labels all use exactly them. What each verdict means in practice:",
           "[how a job is judged](../guides/verdicts.md).", ""]
    out += _enum_table(EventKind, "Event kinds", {"phase": "a probe saw the job enter a phase",
                                                  "progress": "a progress bar moved (done, total, rate)",
                                                  "failure": "a failure line or traceback (kind, fingerprint)",
                                                  "metric": "a number a probe read (a loss, a throughput)",
                                                  "info": "a line worth keeping that is none of the above"})
    out += _enum_table(Phase, "Phases")
    missing = [v.value for v in Verdict if v.value not in VERDICTS and v.name not in member_comments(Verdict)]
    if missing:
        raise SystemExit(f"docs/refgen/tables.py: VERDICTS has no note for {missing}")
    out += _enum_table(Verdict, "Verdicts", VERDICTS)
    out += _enum_table(JobState, "Job states", {"waiting": "for GPU memory other processes hold, for the jobs it "
                                                           "runs `after`, or in a batch scheduler's queue"})
    out += _enum_table(AttemptState, "Attempt states")
    out += _enum_table(FailureKind, "Failure kinds")
    out += _enum_table(Outcome, "Outcomes")
    out += _enum_table(ProbeKind, "Probe kinds")
    out += _enum_table(BoundKind, "Stall bound kinds")
    out += ["## Alert kinds", "", doc(AlertKind), "", "| kind | severity | notes |", "|---|---|---|"]
    notes = member_comments(AlertKind)
    out += [f"| `{k.value}` | `{k.severity.value}` | {cell(notes.get(k.name, ''))} |" for k in AlertKind]
    out += ["", *_enum_table(Severity, "Alert severities")]
    return "\n".join(out).rstrip() + "\n"
