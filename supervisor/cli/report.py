"""`supervise report JOB`: a picture of a job's history, from the daemon's API.

Three panels on one time axis:
- attempts: one lane per attempt, coloured by phase, with markers where a failure was
  recognised and where the watchdog acted (verdicts, process-tree kills, relaunches,
  giving up); a sharded job's lanes are labelled with their shard (`#4 shard 1`, `#7 gather`);
- progress: each progress bar of each attempt, as percent done;
- GPU memory per device, from the samples the daemon stored over the job's time span.

PNG by default (matplotlib, Agg backend: no display needed); `.html` embeds the PNG
(base64) and adds a table of the attempts.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: never a display

import matplotlib.dates as mdates
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from supervisor.core import formatting as _fmt
from supervisor.core import protocol
from supervisor.core.actions import ActionKind, AttemptAction
from supervisor.core.errors import ConfigError, FileWriteError
from supervisor.core.events import EventKind, Phase, Verdict
from supervisor.core.host_url import LOCAL_HOST
from supervisor.core.payloads import ActionData, ProbeFields, VerdictData

_PAGE = 10_000  # events per API call
_MAX_EVENTS = 200_000
_MAX_POINTS_PER_CURVE = 2_000

PHASE_COLOURS: dict[str, str] = {
    "(none)": "#c7c7c7",
    Phase.STARTUP.value: "#9edae5",
    Phase.CONFIG.value: "#aec7e8",
    Phase.DISTRIBUTED_INIT.value: "#c5b0d5",
    Phase.MODEL_INIT.value: "#dbdb8d",
    Phase.WEIGHT_LOADING.value: "#ff7f0e",
    Phase.WEIGHTS_LOADED.value: "#ffbb78",
    Phase.KV_CACHE_PROFILE.value: "#bcbd22",
    Phase.CUDA_GRAPH_CAPTURE.value: "#8c564b",
    Phase.ENGINE_READY.value: "#17becf",
    Phase.RUNNING.value: "#1f77b4",
    Phase.DONE.value: "#2ca02c",
}
_ATTEMPT_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_VERDICT_MARKERS: dict[str, tuple[str, str]] = {  # verdict -> (marker, colour)
    Verdict.CRASHED: ("X", "#d62728"), Verdict.OOM: ("X", "#7f0000"), Verdict.STALLED: ("s", "#6a3d9a"),
    Verdict.SILENT: ("s", "#9e6ac8"), Verdict.LEAKED: ("P", "#e377c2"), Verdict.DONE: ("*", "#2ca02c"),
}
_RELAUNCH_COLOUR = "#2ca02c"


@dataclass
class History:
    """Everything the picture is drawn from, as the API returns it."""

    job: str
    attempts: list[protocol.AttemptInfo]
    events: list[protocol.EventInfo]
    gpu: protocol.JobGpuResponse | None
    now: float
    max_attempts: int = 1  # per run, as the job's spec allows now

    def relaunched(self) -> list[protocol.AttemptInfo]:
        """The attempts the next attempt of their run was launched after."""
        return [a for a, b in zip(self.attempts, self.attempts[1:], strict=False) if b.run == a.run and a.ended is not None]


def fetch_history(client: Any, job: str) -> History:
    attempts = client.attempts(job).attempts
    events: list[protocol.EventInfo] = []
    after = 0
    while len(events) < _MAX_EVENTS:
        page = client.events(job, after=after or None).events
        events.extend(page)
        if len(page) < _PAGE:
            break
        after = page[-1].id
    gpu = client.job_gpu(job)
    max_attempts = client.status(job).jobs[0].max_attempts
    return History(job, attempts, events, gpu, time.time(), max_attempts)


def report_command(client: Any, job: str, out: str | None) -> int:
    path = Path(out or f"{job}-report.png")
    suffix = path.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise ConfigError(f"--out {path}: the report is written as .png or .html")
    if not path.parent.is_dir():  # said before the history is fetched and drawn
        raise FileWriteError(f"--out {path}: no such directory {path.parent}")
    history = fetch_history(client, job)
    png = render_png(history)
    data = render_html(history, png).encode() if suffix != ".png" else png
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise FileWriteError(f"--out {path}: cannot write it: {exc.strerror or exc}") from exc
    print(f"supervise: wrote {path} ({len(history.attempts)} attempts, {len(history.events)} events, "
          f"{len(history.gpu.samples) if history.gpu else 0} GPU samples)")
    return 0


# -- the picture ---------------------------------------------------------------------------

def render_png(history: History, dpi: int = 110) -> bytes:
    figure = build_figure(history)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def build_figure(history: History) -> Figure:
    figure = Figure(figsize=(13, 8.5), layout="constrained")
    lanes, progress, memory = figure.subplots(3, 1, sharex=True, height_ratios=[1.3, 1.0, 1.0])
    figure.suptitle(_title(history), fontsize=12, fontweight="bold")
    _draw_attempts(lanes, history)
    _draw_progress(progress, history)
    _draw_gpu(memory, history)
    for axis in (lanes, progress, memory):
        axis.grid(axis="x", color="#dddddd", linewidth=0.6)
        axis.set_axisbelow(True)
    _mark_actions(history, (progress, memory))
    memory.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    memory.set_xlabel("time")
    start, end = _span(history)
    pad = max(1.0, (end - start) * 0.02)
    memory.set_xlim(_d(start - pad), _d(end + pad))
    return figure


def _title(history: History) -> str:
    start, end = _span(history)
    last = history.attempts[-1] if history.attempts else None
    outcome = f"last: {last.verdict or last.state}" if last else "no attempts"
    return (f"{history.job}: {len(history.attempts)} attempt{'s' if len(history.attempts) != 1 else ''}, "
            f"{_duration(end - start)}, {outcome}  ({_stamp(start)} to {_stamp(end)})")


def _draw_attempts(axis: Any, history: History) -> None:
    by_attempt = _events_by_attempt(history.events)
    seen_phases: list[str] = []
    for a in history.attempts:
        end = a.ended or history.now
        for phase, start, stop in phase_spans(a, by_attempt.get(a.n, []), end):
            axis.barh(a.n, _days(stop - start), left=_d(start), height=0.6, color=PHASE_COLOURS.get(phase, "#7f7f7f"),
                      edgecolor="white", linewidth=0.5)
            if phase not in seen_phases:
                seen_phases.append(phase)
        label: str = a.verdict or a.state
        if a.exit_code is not None:
            label += f" (exit {a.exit_code})" if a.exit_signal is None else f" (signal {a.exit_signal})"
        axis.annotate(label, (_d(end), a.n), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
        for event in by_attempt.get(a.n, []):
            _event_marker(axis, event, a.n)
    for a in history.relaunched():
        axis.plot(_d(a.ended or history.now), a.n + 0.38, marker=">", color=_RELAUNCH_COLOUR, markersize=8, linestyle="")
    axis.set_yticks([a.n for a in history.attempts], [lane_label(a) for a in history.attempts])
    axis.set_ylim(0.4, max((a.n for a in history.attempts), default=1) + 0.6)
    axis.invert_yaxis()
    axis.set_ylabel("attempt")
    handles: list[Any] = [Patch(color=PHASE_COLOURS.get(p, "#7f7f7f"), label=p) for p in seen_phases]
    handles += [
        Line2D([], [], marker="o", color="#d62728", linestyle="", markersize=5, label="failure line"),
        Line2D([], [], marker="X", color="#d62728", linestyle="", label="verdict: crashed/oom"),
        Line2D([], [], marker="s", color="#6a3d9a", linestyle="", label="verdict: stalled/silent"),
        Line2D([], [], marker="v", color="black", linestyle="", label="tree killed"),
        Line2D([], [], marker=">", color=_RELAUNCH_COLOUR, linestyle="", label="relaunched"),
    ]
    axis.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    axis.set_title("attempts and phases; markers where a failure was seen and where the watchdog acted",
                   fontsize=9, loc="left")


def lane_label(attempt: protocol.AttemptInfo) -> str:
    """`#4`, or `#4 shard 1` / `#7 gather` for a sharded job's attempts."""
    if attempt.shard is None:
        return f"#{attempt.n}"
    return f"#{attempt.n} " + ("gather" if attempt.shard < 0 else f"shard {attempt.shard}")


def _event_marker(axis: Any, event: protocol.EventInfo, lane: int) -> None:
    x = _d(event.ts)
    if event.kind is EventKind.FAILURE:
        axis.plot(x, lane - 0.22, marker="o", color="#d62728", markersize=5, linestyle="")
    elif event.kind is EventKind.VERDICT:
        verdict = VerdictData.of(event).verdict
        marker, colour = _VERDICT_MARKERS.get(verdict.value if verdict else "", ("D", "black"))
        axis.plot(x, lane, marker=marker, color=colour, markersize=10, markeredgecolor="black", linestyle="")
    elif event.kind is EventKind.ACTION:
        if ActionData.of(event).is_kill:
            axis.plot(x, lane - 0.38, marker="v", color="black", markersize=7, linestyle="")
        elif (said := AttemptAction.read(event.message)) is not None and said.kind is ActionKind.GIVE_UP:
            axis.plot(x, lane + 0.38, marker="X", color="black", markersize=8, linestyle="")


def phase_spans(attempt: protocol.AttemptInfo, events: list[protocol.EventInfo], end: float) -> list[tuple[str, float, float]]:
    """(phase, start, stop) for one attempt: phases only move forward, as the watchdog sees them."""
    order = [p.value for p in Phase]
    spans: list[tuple[str, float, float]] = []
    current, since = "(none)", attempt.started
    for event in events:
        phase = event.phase or (ProbeFields.of(event).phase if event.kind is EventKind.PROGRESS else None)
        if event.kind not in (EventKind.PHASE, EventKind.PROGRESS) or phase not in order:
            continue
        if current != "(none)" and order.index(phase) <= order.index(current):
            continue
        at = max(event.ts, since)
        if at > since:
            spans.append((current, since, at))
        current, since = phase, at
    spans.append((current, since, max(end, since)))
    return spans


def _draw_progress(axis: Any, history: History) -> None:
    curves: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for event in history.events:
        if event.kind is not EventKind.PROGRESS:
            continue
        progress = ProbeFields.of(event).progress
        fraction = progress.fraction if progress is not None else None
        if fraction is None:
            continue
        curves[(event.attempt, event.probe or "progress")].append((event.ts, 100.0 * fraction))
    styles = ("-", "--", ":", "-.")
    lanes = {a.n: lane_label(a) for a in history.attempts}
    probe_style: dict[str, str] = {}
    for (n, probe), points in sorted(curves.items()):
        style = probe_style.setdefault(probe, styles[len(probe_style) % len(styles)])
        points = _thin(points)
        axis.step([_d(t) for t, _ in points], [v for _, v in points], where="post", linestyle=style,
                  color=_ATTEMPT_COLOURS[(n - 1) % len(_ATTEMPT_COLOURS)], linewidth=1.6,
                  label=f"{lanes.get(n, f'#{n}')} {probe.split('.')[-1]}")
    axis.set_ylim(-3, 103)
    axis.set_ylabel("progress (%)")
    if curves:
        axis.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    else:
        axis.text(0.5, 0.5, "no progress bar with a known total was seen", transform=axis.transAxes,
                  ha="center", va="center", color="#777777")
    axis.set_title("progress bars (percent done), one colour per attempt", fontsize=9, loc="left")


def _draw_gpu(axis: Any, history: History) -> None:
    samples = history.gpu.samples if history.gpu else []
    series: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for s in samples:
        series[s.gpu].append((s.ts, s.used_mib / 1024, s.total_mib / 1024))
    for gpu, points in sorted(series.items()):
        points = _thin(points)
        total = max(p[2] for p in points)
        axis.plot([_d(t) for t, _, _ in points], [u for _, u, _ in points], linewidth=1.6,
                  label=f"GPU {gpu} (of {total:.0f} GiB)")
    axis.set_ylabel("GPU memory used (GiB)")
    if series:
        axis.set_ylim(bottom=0)
        axis.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    else:
        axis.text(0.5, 0.5, "no GPU samples stored for this time span (no NVML on the host?)",
                  transform=axis.transAxes, ha="center", va="center", color="#777777")
    host = history.gpu.host if history.gpu else LOCAL_HOST
    axis.set_title(f"GPU memory per device on {host}; dotted lines: watchdog verdicts and relaunches",
                   fontsize=9, loc="left")


def _mark_actions(history: History, axes: tuple[Any, ...]) -> None:
    verdicts = [(event.ts, VerdictData.of(event).verdict) for event in history.events if event.kind is EventKind.VERDICT]
    marks = [(ts, _VERDICT_MARKERS.get(verdict.value, ("", "#555555"))[1])
             for ts, verdict in verdicts if verdict is not None and verdict is not Verdict.DONE]
    marks += [(a.ended or history.now, _RELAUNCH_COLOUR) for a in history.relaunched()]
    for ts, colour in marks:
        for axis in axes:
            axis.axvline(_d(ts), color=colour, linestyle=":", linewidth=1.2)


# -- the HTML page -------------------------------------------------------------------------

def render_html(history: History, png: bytes) -> str:
    rows = []
    sharded = any(a.shard is not None for a in history.attempts)
    for a in history.attempts:
        progress = f"{_num(a.progress.done)}/{_num(a.progress.total)}" if a.progress else "-"
        exit_text = "-" if a.exit_code is None else (f"signal {a.exit_signal}" if a.exit_signal else str(a.exit_code))
        cells = [f"#{a.n}", _fmt.attempt(a.run_attempt, history.max_attempts, a.n), _stamp(a.started), _duration((a.ended or history.now) - a.started), a.phase or "-", progress,
                 a.verdict or a.state, exit_text, (a.fingerprint or "-")[:12], a.action or "-",
                 (a.failure.line if a.failure else a.reason) or "-"]
        if sharded:
            cells.insert(1, "-" if a.shard is None else ("gather" if a.shard < 0 else str(a.shard)))
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    names = ["attempt", "in its run", "started", "duration", "phase reached", "progress", "verdict",
             "exit", "fingerprint", "action", "failure / reason"]
    header = "".join(f"<th>{h}</th>" for h in names[:1] + ["shard"] * sharded + names[1:])
    image = base64.b64encode(png).decode()
    title = html.escape(_title(history))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(history.job)}: supervise report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{title}</h1>
<img alt="attempts, progress and GPU memory of {html.escape(history.job)}" src="data:image/png;base64,{image}">
<h2>Attempts</h2>
<table><thead><tr>{header}</tr></thead><tbody>
{chr(10).join(rows)}
</tbody></table>
<p>Generated by <code>supervise report</code> at {html.escape(_stamp(history.now))}.</p>
</body></html>
"""


# -- helpers -------------------------------------------------------------------------------

def _events_by_attempt(events: list[protocol.EventInfo]) -> dict[int, list[protocol.EventInfo]]:
    grouped: dict[int, list[protocol.EventInfo]] = defaultdict(list)
    for event in events:
        grouped[event.attempt].append(event)
    return grouped


def _span(history: History) -> tuple[float, float]:
    starts = [a.started for a in history.attempts]
    ends = [a.ended or history.now for a in history.attempts]
    if not starts:
        return history.now - 60, history.now
    return min(starts), max(ends)


def _thin(points: list[Any]) -> list[Any]:
    if len(points) <= _MAX_POINTS_PER_CURVE:
        return points
    step = len(points) / _MAX_POINTS_PER_CURVE
    return [points[int(i * step)] for i in range(_MAX_POINTS_PER_CURVE)] + [points[-1]]


def _d(ts: float) -> Any:
    return mdates.date2num(dt.datetime.fromtimestamp(ts))


def _days(seconds: float) -> float:
    return seconds / 86400.0


def _stamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
