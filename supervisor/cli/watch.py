"""`supervise status --watch`: a live view of every job, redrawn from the API about twice a second.

On a terminal it is a `rich` table: state, attempt n/max, phase, a progress bar with
done/total, rate and ETA of the active progress bar, the watchdog's verdict, time since the
job last wrote output, and GPU memory per device.  When stdout is not a terminal (a pipe,
a file, `watch`-less cron), it prints plain lines every few seconds instead.  Ctrl-C exits
cleanly and leaves the jobs running.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from supervisor.core import formatting as _fmt
from supervisor.core import protocol
from supervisor.core.errors import DaemonError
from supervisor.core.events import AttemptState, JobState, Verdict

_STATE_STYLE = {JobState.RUNNING: "bold green", JobState.DONE: "green", JobState.FAILED: "bold red",
                JobState.BACKOFF: "yellow", JobState.UNREACHABLE: "bold yellow", JobState.WAITING: "yellow", JobState.STARTING: "cyan",
                JobState.STOPPED: "dim"}
_NAME_MAX = 32  # a job name wider than this is cut in the middle
_COUNTDOWN_S = 30.0  # a next verdict closer than this is shown beside the job
_VERDICT_STYLE: dict[str, str] = {Verdict.HEALTHY: "green", Verdict.DONE: "green", Verdict.STALLED: "bold yellow",
                  Verdict.SILENT: "bold yellow", Verdict.CRASHED: "bold red", Verdict.OOM: "bold red",
                  Verdict.LEAKED: "bold magenta"}

StatusSource = Callable[[], protocol.StatusResponse]


def watch_command(fetch: StatusSource, *, interval_s: float = 0.5, plain_every_s: float = 5.0,
                  tty: bool | None = None, out: TextIO | None = None) -> int:
    """Run the view until Ctrl-C; `fetch` returns a fresh status (the API's `/v1/status`)."""
    stream = out or sys.stdout
    is_tty = stream.isatty() if tty is None else tty
    try:
        if is_tty:
            _live(fetch, interval_s, Console(file=stream))
        else:
            _plain(fetch, plain_every_s, stream)
    except KeyboardInterrupt:
        pass
    return 0


def _live(fetch: StatusSource, interval_s: float, console: Console) -> None:
    with Live(_fetch_view(fetch), console=console, auto_refresh=False, transient=False,
              vertical_overflow="ellipsis") as live:
        while True:
            time.sleep(interval_s)
            live.update(_fetch_view(fetch), refresh=True)


def _fetch_view(fetch: StatusSource) -> RenderableType:
    try:
        return render(fetch())
    except DaemonError as exc:
        return Text(f"supervise · {_fmt.clock(time.time())} · daemon unreachable: {exc} (retrying; Ctrl-C to exit)",
                    style="bold red")


def _plain(fetch: StatusSource, every_s: float, stream: TextIO) -> None:
    while True:
        try:
            lines = plain_lines(fetch())
        except DaemonError as exc:
            lines = [f"{_fmt.clock(time.time())} daemon unreachable: {exc}"]
        stream.write("\n".join(lines) + "\n")
        stream.flush()
        time.sleep(every_s)


# -- the terminal view ---------------------------------------------------------------------

def render(status: protocol.StatusResponse, now: float | None = None) -> RenderableType:
    now = time.time() if now is None else now
    header = Text.assemble(("supervise", "bold"), f" · daemon pid {status.daemon_pid} v{status.daemon_version} · ",
                           _fmt.clock(now), " · ", (f"{len(status.jobs)} job{'s' if len(status.jobs) != 1 else ''}", ""),
                           (" · Ctrl-C to exit", "dim"))
    jobs = Table(expand=False, box=None, pad_edge=False, header_style="bold", show_edge=False)
    # The job column keeps its width on a narrow terminal (the others give way): two jobs cut
    # to `cra…` would look the same.  A name longer than _NAME_MAX is cut in the middle.
    name_width = min(_NAME_MAX, max((len(j.name) for j in status.jobs), default=3))
    jobs.add_column("JOB", justify="left", no_wrap=True, min_width=name_width)
    for column, justify in (("STATE", "left"), ("ATTEMPT", "right"), ("PHASE", "left"),
                            ("PROGRESS", "left"), ("DONE", "right"), ("RATE", "right"), ("ETA", "right"),
                            ("HEALTH", "left"), ("OUTPUT", "right")):
        jobs.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    notes: list[Text] = []
    for job in status.jobs:
        jobs.add_row(*_job_cells(job))
        note = _job_note(job)
        if note:
            notes.append(Text.assemble(("  " + job.name + ": ", "bold"), (note, "dim"), no_wrap=True, overflow="ellipsis"))
    parts: list[RenderableType] = [header, Text(""), jobs if status.jobs else Text("no jobs yet: `supervise start JOB`")]
    parts.extend(notes)
    parts.append(Text(""))
    parts.append(_gpu_view(status))
    if status.web_note:
        parts.append(Text(status.web_note, style="yellow"))
    return Group(*parts)


def _job_cells(job: protocol.JobStatus) -> list[RenderableType]:
    a = job.attempt
    state = Text(job.state, style=_STATE_STYLE.get(job.state, ""))
    attempt = _attempt_text(job)
    phase = (a.phase or "-") if a else "-"
    bar: RenderableType = Text("-")
    done = rate = eta = "-"
    if a is not None and a.progress is not None:
        p = a.progress
        if p.total:
            bar = ProgressBar(total=p.total, completed=min(p.done, p.total), width=24,
                              complete_style="green" if p.done >= p.total else "cyan", finished_style="green")
        done = f"{_fmt.num(p.done)}/{_fmt.num(p.total)}" if p.total else _fmt.num(p.done)
        rate = _rate(p.rate_s_per_it)
        if job.state is JobState.RUNNING and p.eta_s is not None:
            eta = _fmt.duration(p.eta_s)
        elif job.state is JobState.RUNNING and p.still_s is not None:  # the ETA ran out: how long it stood still
            eta = f"still {_fmt.duration(p.still_s)}"
    verdict = _verdict(job)
    health = Text(verdict, style=_VERDICT_STYLE.get(verdict, ""))
    output = f"{_fmt.duration(job.last_output_age_s)} ago" if job.last_output_age_s is not None else "-"
    return [Text(short_name(job.name), style="bold"), state, attempt, phase, bar, done, rate, eta, health, output]


def _job_note(job: protocol.JobStatus) -> str:
    a = job.attempt
    if job.next_relaunch_in_s is not None:
        return f"relaunch in {_fmt.duration(job.next_relaunch_in_s)}: {job.reason}"
    nv = job.next_verdict
    # A job with a failure on screen and still "healthy" is waiting out the hang rule: say so.
    # A stall countdown is shown only when it is close, or every bar would carry one.
    if nv is not None and (nv.verdict in (Verdict.CRASHED, Verdict.OOM) or nv.in_s <= _COUNTDOWN_S):
        return f"{nv.verdict} in {_fmt.duration(nv.in_s)} if nothing changes: {nv.reason}"[:160]
    if a is not None and a.failure is not None and job.state is not JobState.DONE:
        return f"{a.failure.kind}: {a.failure.line}"[:160]
    if job.state in (JobState.FAILED, JobState.WAITING, JobState.BACKOFF, JobState.STOPPED, JobState.UNREACHABLE) and job.reason:
        return job.reason[:160]
    return ""


def _gpu_view(status: protocol.StatusResponse) -> RenderableType:
    if not status.gpu:
        return Text(f"GPUs: {status.gpu_note or 'none'}", style="dim")
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for column, justify in (("GPU", "right"), ("MEMORY", "left"), ("USED / TOTAL", "right"), ("UTIL", "right"),
                            ("TEMP", "right"), ("POWER", "right"), ("PROCESSES (pid:memory)", "left")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for d in status.gpu:
        share = d.used_mib / d.total_mib if d.total_mib else 0.0
        style = "red" if share > 0.9 else "yellow" if share > 0.5 else "green"
        procs = " ".join(f"{p.get('pid')}:{p.get('used_mib') or '?'}MiB" for p in d.processes) or "-"
        table.add_row(str(d.index), ProgressBar(total=max(d.total_mib, 1), completed=d.used_mib, width=24,
                                                complete_style=style, finished_style=style),
                      f"{d.used_mib:,}/{d.total_mib:,} MiB", f"{d.util_pct}%" if d.util_pct is not None else "-",
                      f"{d.temperature_c}°C" if d.temperature_c is not None else "-",
                      f"{d.power_w:.0f} W" if d.power_w is not None else "-", procs)
    return table


# -- plain lines ---------------------------------------------------------------------------

def plain_lines(status: protocol.StatusResponse, now: float | None = None) -> list[str]:
    clock = _fmt.clock(time.time() if now is None else now)
    lines = []
    for job in status.jobs:
        a = job.attempt
        parts = [clock, job.name, job.state]
        if a is not None:
            parts += [f"attempt {_attempt_text(job)}", f"phase {a.phase or '-'}"]
            if a.progress is not None:
                p = a.progress
                pct = f" ({100 * p.done / p.total:.0f}%)" if p.total else ""
                parts.append(f"progress {_fmt.num(p.done)}/{_fmt.num(p.total)}{pct}")
                if p.rate_s_per_it:
                    parts.append(_rate(p.rate_s_per_it))
                if p.eta_s is not None and job.state is JobState.RUNNING:
                    parts.append(f"eta {_fmt.duration(p.eta_s)}")
        parts.append(f"health {_verdict(job)}")
        if job.last_output_age_s is not None:
            parts.append(f"output {_fmt.duration(job.last_output_age_s)} ago")
        note = _job_note(job)
        if note:
            parts.append(f"({note})")
        lines.append("  ".join(parts))
    if not status.jobs:
        lines.append(f"{clock}  no jobs yet")
    if status.gpu:
        lines.append(f"{clock}  GPUs: " + "  ".join(_plain_gpu(d) for d in status.gpu))
    else:
        lines.append(f"{clock}  GPUs: {status.gpu_note or 'none'}")
    if status.web_note:
        lines.append(f"{clock}  {status.web_note}")
    return lines


# -- formatting ----------------------------------------------------------------------------

def short_name(name: str, width: int = _NAME_MAX) -> str:
    """The name cut in the middle to `width`: names that differ at the start or the end (the
    usual case: `crawl-shard-01`, `crawl-shard-02`) stay apart."""
    if len(name) <= width:
        return name
    head = width // 2
    tail = width - 1 - head
    return name[:head] + "…" + (name[-tail:] if tail else "")


def _plain_gpu(d: protocol.GpuDeviceInfo) -> str:
    extra = [f"{d.util_pct}%" if d.util_pct is not None else "", f"{d.temperature_c}°C" if d.temperature_c is not None else "",
             f"{d.power_w:.0f}W" if d.power_w is not None else ""]
    return f"{d.index}:{d.used_mib}/{d.total_mib} MiB" + "".join(f" {e}" for e in extra if e)


def _attempt_text(job: protocol.JobStatus) -> str:
    a = job.attempt
    return "-" if a is None else _fmt.attempt(a.run_attempt, job.max_attempts, a.n)


def _verdict(job: protocol.JobStatus) -> str:
    a = job.attempt
    if a is None:
        return "-"
    if a.verdict:
        return a.verdict
    return Verdict.HEALTHY if a.state is AttemptState.RUNNING else a.state


def _rate(seconds_per_item: float | None) -> str:
    if not seconds_per_item:
        return "-"
    if seconds_per_item < 1:
        return f"{1 / seconds_per_item:.1f} it/s"
    return f"{seconds_per_item:.1f} s/it"


