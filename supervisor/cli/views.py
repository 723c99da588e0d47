"""Views of the daemon's state: `status` (and its live view), `gpus`, `report`."""

from __future__ import annotations

import argparse

from supervisor.cli._args import client as _client
from supervisor.cli.pipelines import pipeline_block
from supervisor.cli.quarantine import quarantine_lines
from supervisor.core import formatting as _fmt
from supervisor.core import protocol
from supervisor.core.events import AttemptState, JobState, Verdict


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch:
        from supervisor.cli.watch import watch_command

        client = _client()
        return watch_command(lambda: client.status(args.job), plain_every_s=args.every)
    status = _client().status(args.job)
    if args.json:
        print(status.model_dump_json(indent=2))
    else:
        if not status.jobs:
            print("no jobs yet: `supervise start JOB`")
        for pipeline in status.pipelines:
            print(pipeline_block(pipeline))
        in_pipelines = {s.job for p in status.pipelines for s in p.steps} if not args.job else set()
        for job in status.jobs:
            if job.name not in in_pipelines:  # shown as a pipeline's step above
                print(status_block(job))
        print(_gpu_line(status.gpu, status.gpu_note))
        for line in quarantine_lines(status.quarantined):
            print(line)
        if status.web_note:
            print(status.web_note)
    # Like `systemctl is-failed`: a script can ask `supervise status JOB` whether the job failed.
    if args.job and status.pipelines:
        return 1 if status.pipelines[0].state in (JobState.FAILED, JobState.CANCELLED) else 0
    return 1 if args.job and status.jobs and status.jobs[0].state is JobState.FAILED else 0


def cmd_gpus(args: argparse.Namespace) -> int:
    response = _client().gpus()
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    print(_gpu_line(response.devices, response.note))
    for device in response.devices:
        for proc in device.processes:
            print(f"  GPU{device.index} pid {proc['pid']:>8} {proc.get('used_mib') or '?'} MiB")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from supervisor.cli.report import report_command

    return report_command(_client(), args.job, args.out)


def status_block(job: protocol.JobStatus) -> str:
    if job.shards is not None:
        return sharded_block(job, job.shards)
    a = job.attempt
    lines = [f"{job.name}: {job.state}  ({job.reason})" if job.reason else f"{job.name}: {job.state}"]
    if job.spec_error:  # stored by another version, say: it cannot be relaunched until started from its file
        lines.append(f"  spec no longer validates: {job.spec_error}; `supervise start` its spec file")
    if a is not None:
        # Only a job being watched has a verdict in the making, a rate and an ETA; an ended
        # attempt shows how it ended, never the last healthy reading.
        live = job.state is JobState.RUNNING and a.state is AttemptState.RUNNING
        pid = f"pid {job.program_pid} (wrapper {a.pid})" if job.program_pid and live else f"pid {a.pid}"
        lines.append(f"  attempt {_fmt.attempt(a.run_attempt, job.max_attempts, a.n)}  {pid}  host {a.host}  "
                     f"started {_fmt.timestamp(a.started)}{_ended(a)}")
        lines.append(f"  phase {a.phase or '-'}  verdict {a.verdict or (Verdict.HEALTHY if live else a.state)}")
        if live and job.status_line:
            lines.append(f"  status {job.status_line}")
        if job.stacks:
            lines.append(f"  {job.stacks[:300]}")
        nv = job.next_verdict
        if live and nv is not None and nv.near:
            lines.append(f"  {nv.verdict} in {_fmt.duration(nv.in_s)} if nothing changes: {nv.reason}")
        for b in job.stall_bounds if live else []:
            lines.append(f"  stall bound {_fmt.duration(b.bound_s)} ({b.source}) for {b.bar}, "
                         f"{_fmt.duration(b.in_s)} left")
        if a.progress is not None:
            p = a.progress
            rate = f"  {p.rate_s_per_it:.2f} s/it" if p.rate_s_per_it and live else ""
            lines.append(f"  progress {p.probe}: {_fmt.num(p.done)}/{_fmt.num(p.total)}{rate}"
                         f"{_eta(p) if live else ''}")
        if a.failure is not None:
            # A done attempt went on from its failure: `recovered`, the word `probe` says it with.
            word = "recovered" if a.verdict is Verdict.DONE else "failure"
            lines.append(f"  {word} {a.failure.kind}: {a.failure.line}")
        if (a.reason and a.verdict is not None and a.verdict not in (Verdict.DONE, Verdict.HEALTHY)
                and (a.failure is None or a.failure.line not in a.reason)):
            # No probe named a failure, or the verdict has more to say than the failure's line (its own memory
            # limit, whose kill the log only echoes): the verdict's reason is the evidence.
            lines.append(f"  reason {a.reason}")
        if used := _fmt.usage(a.usage):
            lines.append(f"  used {used}")
        if job.last_output_age_s is not None:
            lines.append(f"  last output {_fmt.duration(job.last_output_age_s)} ago")
        lines.append(f"  log {a.log_path}")
    for path in job.outputs:
        lines.append(f"  output {path}")
    if job.next_relaunch_in_s is not None:
        lines.append(f"  relaunch in {_fmt.duration(job.next_relaunch_in_s)}")
    return "\n".join(lines)


def _eta(p: protocol.ProgressInfo) -> str:
    """A watched bar's ETA, or, once it ran out with no step, how long the bar has stood still."""
    if p.eta_s:
        return f"  eta {_fmt.duration(p.eta_s)}"
    if p.still_s is not None:
        return f"  still {_fmt.duration(p.still_s)}"
    return ""


def _ended(a: protocol.AttemptInfo) -> str:
    """systemd's "since …; 2h ago" for an attempt: when it ended and how long it ran."""
    if a.ended is None:
        return ""
    return f"  ended {_fmt.timestamp(a.ended)}  ran {_fmt.duration(max(0.0, a.ended - a.started))}"


def sharded_block(job: protocol.JobStatus, shards: protocol.ShardsStatus) -> str:
    """One line for the job (shards done/running/failed, summed progress, ETA), one per shard below."""
    line = (f"{job.name}: {job.state}  shards {shards.done}/{shards.total} done, {shards.running} running, "
            f"{shards.failed} failed")
    if shards.progress_done is not None:
        line += f"  progress {_fmt.num(shards.progress_done)}/{_fmt.num(shards.progress_total)}"
    if shards.eta_s:
        line += f"  eta {_fmt.duration(shards.eta_s)}"
    lines = [line + (f"  ({job.reason})" if job.reason else "")]
    for shard in shards.shards:
        lines.append(_shard_line(shard))
    return "\n".join(lines)


def _shard_line(shard: protocol.ShardStatus) -> str:
    name = "gather " if shard.shard < 0 else f"shard {shard.shard}"
    line = f"  {name}  {shard.state:<8} host {shard.host}  attempts {shard.attempts}"
    a = shard.attempt
    if a is not None:
        line += f"  #{a.n} pid {a.pid}  phase {a.phase or '-'}"
        if a.progress is not None:
            line += f"  progress {_fmt.num(a.progress.done)}/{_fmt.num(a.progress.total)}"
            if shard.state is JobState.RUNNING:
                line += _eta(a.progress)
        if a.verdict is not None and a.verdict is not Verdict.DONE:
            line += f"  {a.verdict}: {(a.reason or '')[:80]}"
    if shard.next_relaunch_in_s is not None:
        line += f"  relaunch in {_fmt.duration(shard.next_relaunch_in_s)}"
    return line


def _gpu_line(devices: list[protocol.GpuDeviceInfo], note: str) -> str:
    if not devices:
        return f"GPUs: {note or 'none'}"
    return "GPUs: " + "  ".join(f"{d.index}:{d.used_mib}/{d.total_mib} MiB" for d in devices)
