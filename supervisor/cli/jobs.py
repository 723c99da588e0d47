"""Commands that change jobs: start, stop, hold, release, restart, rm, prune; and the lists: jobs, attempts."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from supervisor.cli._args import client as _client
from supervisor.cli._args import field_overrides
from supervisor.cli.logs import follow_job
from supervisor.cli.pipelines import start_pipeline
from supervisor.core import formatting as _fmt
from supervisor.core import protocol
from supervisor.core.events import JobState, Verdict
from supervisor.core.overrides import FieldOverrides
from supervisor.jobs.dependencies import with_after
from supervisor.spec.model import JobSpec, find_spec, parse_overrides
from supervisor.spec.pipeline import find_pipeline


def cmd_start(args: argparse.Namespace) -> int:
    overrides, fields = parse_overrides(args.overrides), field_overrides(args)
    if (pipeline := find_pipeline(args.job)) is not None:
        return start_pipeline(args, pipeline, overrides, fields)
    spec = with_after(find_spec(args.job).with_overrides(overrides, fields), args.after)
    return start_spec(spec, overrides, args.after, fields, follow=args.follow)


def start_spec(spec: JobSpec, overrides: dict[str, str], after: list[str], fields: FieldOverrides, *,
               follow: bool, accepted: Callable[[], None] | None = None) -> int:
    """Start ``spec`` (its file, ``overrides`` and ``fields`` applied) as `start` does; with ``follow``,
    follow it until it ends (exit 1 unless it is done).  ``accepted`` is called once the daemon has
    taken the spec (stored it), before anything is followed."""
    spec.argv(1)  # a missing template parameter is an error here, before the daemon is involved
    client = _client()
    response = client.start(spec.spec_path, overrides, after, fields)
    if accepted is not None:
        accepted()
    if _cancelled(response):
        return 1
    for note in response.notes:
        print(f"supervise: note: {note}")
    print(f"supervise: {response.message}" + (f"; log {response.log_path}" if response.log_path else ""))
    if not follow:
        return 0
    for path in spec.output_paths():
        print(f"supervise: {spec.name} writes its output to {path}")
    return follow_job(client, spec.name, response.attempt)


def _cancelled(response: protocol.StartResponse) -> bool:
    """A job whose `after` already gave up is never launched: said in one line, and the command fails."""
    if response.held is not JobState.CANCELLED:
        return False
    print(f"supervise: {response.message}", file=sys.stderr)
    return True


def cmd_stop(args: argparse.Namespace) -> int:
    response = _client().stop(args.job, args.grace)
    _print_stopped(response)
    return 0


def _print_stopped(response: protocol.StopResponse) -> None:
    print(response.message)
    for proc in response.processes:
        orphan = "  (re-parented)" if proc.reparented else ""
        print(f"  {proc.signal:<8} {proc.pid:>8}  {proc.name}{orphan}")


def cmd_hold(args: argparse.Namespace) -> int:
    print(f"supervise: {_client().hold(args.job).message}")
    return 0


def cmd_stack(args: argparse.Namespace) -> int:
    """Each Python process's stack as py-spy prints it; exit 1 when nothing could be dumped."""
    response = _client().stacks(args.job)
    print(f"supervise: {response.message}")
    for proc in response.processes:
        if proc.stack:
            print(f"\n== pid {proc.pid}: {proc.name}\n{proc.stack.rstrip()}")
        else:
            print(f"\n== pid {proc.pid}: {proc.name}: {proc.error}")
    return 0 if any(p.stack for p in response.processes) else 1


def cmd_release(args: argparse.Namespace) -> int:
    print(f"supervise: {_client().release(args.job).message}")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    client = _client()
    response = client.restart(args.job, args.grace, field_overrides(args), reload=args.reload)
    if response.stopped is not None:
        _print_stopped(response.stopped)
    started = response.started
    if _cancelled(started):
        return 1
    for note in started.notes:
        print(f"supervise: note: {note}")
    print(f"supervise: {started.message}" + (f"; log {started.log_path}" if started.log_path else ""))
    if not args.follow:
        return 0
    return follow_job(client, args.job, response.started.attempt)


def cmd_rm(args: argparse.Namespace) -> int:
    response = _client().remove(args.job, logs=args.logs)
    print(f"supervise: {response.message}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    response = _client().prune(args.job)
    for pruned in response.removed:
        print(f"  removed {pruned.job}#{pruned.attempt} {pruned.log_path} ({_fmt.size(pruned.bytes)})")
    print(f"supervise: {response.message}")
    return 0


def cmd_attempts(args: argparse.Namespace) -> int:
    response = _client().attempts(args.job)
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    # A sharded job's attempts are numbered across its shards: which shard each ran is a column of its own.
    sharded = any(a.shard is not None for a in response.attempts)
    moved = len({a.host for a in response.attempts}) > 1  # a host pool, or a `--host` changed: each attempt's host
    shard_head = f"{'shard':>6}" if sharded else ""
    print(f"{'#':>3}{shard_head}  {'started':<19} {'duration':>9}  {'phase':<18} {'progress':<12} {'verdict':<8} "
          f"{'fingerprint':<12} action")
    for a in response.attempts:
        duration = _fmt.duration((a.ended or time.time()) - a.started)
        progress = f"{_fmt.num(a.progress.done)}/{_fmt.num(a.progress.total)}" if a.progress and a.progress.total else "-"
        shard = f"{_fmt.shard(a.shard):>6}" if sharded else ""
        print(f"{a.n:>3}{shard}  {_fmt.timestamp(a.started):<19} {duration:>9}  {a.phase or '-':<18} {progress:<12} "
              f"{a.verdict or a.state:<8} {(a.fingerprint or '-')[:12]:<12} {a.action or ''}")
        if a.reason and a.verdict not in (None, Verdict.DONE):
            print(f"     {a.reason}")
        if moved:
            print(f"     host: {a.host}")
        if a.checkpoint:
            print(f"     from checkpoint: {a.checkpoint}")
        if a.params is not None:  # a `[restart.adjust]` rule changed them
            print("     params: " + " ".join(f"{k}={v}" for k, v in sorted(a.params.items())))
        if used := _fmt.usage(a.usage):
            print(f"     used: {used}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.names or args.specs:
        return _names(args.names, args.specs)
    response = _client().status()
    if args.json:
        print(protocol.JobsResponse(jobs=response.jobs).model_dump_json(indent=2))
        return 0
    if not response.jobs:
        print("no jobs yet: `supervise start JOB`")  # as `status` says it: an empty answer looked like a hang
    for job in response.jobs:
        a = job.attempt
        if job.shards is not None:  # its latest attempt is one shard's: the shards say more
            sh = job.shards
            where = f"shards {sh.done}/{sh.total} done, {sh.running} running, {sh.failed} failed"
        else:
            where = "attempt " + (_fmt.attempt(a.run_attempt, job.max_attempts, a.n) if a else f"0/{job.max_attempts}")
        print(f"{job.name:<20} {job.state:<10} {where}  {job.reason}")
    return 0


def _names(known: bool, specs: bool) -> int:
    """Names for shell completion (the console script answers this without the CLI: supervisor/shell_names.py)."""
    from supervisor.shell_names import print_names

    return print_names(known, specs)
