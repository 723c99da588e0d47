"""`supervise start PIPELINE` and how `status` shows a pipeline: one line (state, current step, its
progress, the overall ETA when the steps' history gives one), then each step."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from supervisor.cli._args import client as _client
from supervisor.core import formatting as _fmt
from supervisor.core import protocol
from supervisor.core.errors import SpecError
from supervisor.core.events import JobState
from supervisor.core.overrides import FieldOverrides
from supervisor.spec.pipeline import load_pipeline, resolve

FINAL = (JobState.DONE, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED)


def start_pipeline(args: argparse.Namespace, path: Path, overrides: dict[str, str], fields: FieldOverrides) -> int:
    if args.after:
        raise SpecError(f"{path}: --after applies to a job; a pipeline's steps say their own `after`")
    resolve(load_pipeline(path), path, overrides, fields)  # every problem said here, before the daemon is involved
    client = _client()
    response = client.start_pipeline(str(path.resolve()), overrides, fields)
    print(f"supervise: {response.message}")
    if not args.follow:
        return 0
    shown: tuple[JobState, str | None] | None = None
    while True:  # one line each time the pipeline's state or current step changes
        status = client.status(response.pipeline).pipelines[0]
        line = pipeline_line(status)
        if (status.state, status.current) != shown:
            shown = (status.state, status.current)
            print(line, flush=True)
        if status.state in FINAL:
            return 0 if status.state is JobState.DONE else 1
        time.sleep(1.0)


def pipeline_line(p: protocol.PipelineStatus) -> str:
    position = ""
    if p.current is not None:
        index = [s.step for s in p.steps].index(p.current) + 1
        position = f"  step {index}/{len(p.steps)} {p.current}"
        step = p.steps[index - 1]
        position += _progress(step.attempt)
    if p.eta_s is not None:  # from the steps' history; nothing is said without it (--json: eta_note)
        position += f"  ETA {_fmt.duration(p.eta_s)} overall"
    return f"{p.name} (pipeline): {p.state}{position}  ({p.reason})"


def pipeline_block(p: protocol.PipelineStatus) -> str:
    lines = [pipeline_line(p)]
    for i, step in enumerate(p.steps, 1):
        note = "skipped: done with the same inputs" if step.skipped and step.state is JobState.DONE else step.reason
        attempt = f"  attempt {step.attempt.n}" if step.attempt is not None else ""
        lines.append(f"  {i}. {step.step:<12} {step.state:<9}{attempt}{_progress(step.attempt)}  ({note})  job {step.job}")
    return "\n".join(lines)


def _progress(attempt: protocol.AttemptInfo | None) -> str:
    if attempt is None or attempt.progress is None or not attempt.state.active:
        return ""
    p = attempt.progress
    eta = f" eta {_fmt.duration(p.eta_s)}" if p.eta_s else ""
    return f"  {_fmt.num(p.done)}/{_fmt.num(p.total)}{eta}"

