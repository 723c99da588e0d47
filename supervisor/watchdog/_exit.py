"""The judgement at exit: done, crashed or oom, from how the process ended and what it logged."""

from __future__ import annotations

import signal as signal_module
from dataclasses import replace

from supervisor.core.events import Phase, Verdict
from supervisor.core.resource_limits import LimitHit, LimitKind
from supervisor.watchdog._conditions import Judgement
from supervisor.watchdog._evidence import BarAt, Exited, LimitFigures
from supervisor.watchdog._facts import Facts
from supervisor.watchdog._rules import failure_evidence

_SIGKILL = int(signal_module.SIGKILL)
# Signals that ask a program to shut down (systemd, Slurm's scancel, a container runtime, Ctrl-C).
_SHUTDOWN_SIGNALS = (int(signal_module.SIGTERM), int(signal_module.SIGINT))


def judge_exit(facts: Facts, returncode: int | None, signal: int | None, killed_by_us: bool,
               last_unhealthy: Judgement | None, kernel_oom: str | None = None,
               limit_hit: LimitHit | None = None) -> Judgement:
    """``last_unhealthy``: what ``check()`` last found wrong while it ran, if anything;
    ``kernel_oom``: what the kernel said of an OOM kill of the attempt (None: nothing);
    ``limit_hit``: one of the attempt's own `[limits]` that the kernel enforced (None: none)."""
    signal = _exit_signal(returncode, signal)
    evidence = _exit_evidence(facts, returncode, signal)
    failure = facts.primary_failure
    oom = facts.oom
    how = _describe_exit(returncode, signal)
    if killed_by_us and last_unhealthy is not None and oom is None:
        # We stopped it because of what check() found: that is the verdict that counts,
        # however the process then ended.
        return Judgement(last_unhealthy.verdict, last_unhealthy.reason, replace(evidence, before=last_unhealthy.evidence))
    if returncode == 0 and signal is None:
        if failure is None:
            return Judgement(Verdict.DONE, "exited 0", evidence)
        if facts.advanced_since_failure and facts.fatal is None:
            # It logged an error, then made progress again (or answered requests) and finished: a
            # recovery.  Never from a fatal one: its engine was dead whatever it printed next.
            return Judgement(Verdict.DONE, f"exited 0; recovered after logging: {failure.line}", evidence)
        # Exit 0 straight after a failure is a shutdown, not success: `vllm serve` exits 0
        # after "Worker proc VllmWorker-1 died unexpectedly" and EngineDeadError (seen on 2 H200s).
        return Judgement(Verdict.CRASHED, f"exited 0 right after a failure: {failure.line}", evidence)
    if limit_hit is not None and not killed_by_us:
        # The kernel's own count in the attempt's cgroup: said before what the log reads (a DataLoader's
        # "worker killed", a Python MemoryError), which is only the echo of it.
        return _limit_judgement(limit_hit, how, evidence)
    if oom is not None:
        return Judgement(Verdict.OOM, f"CUDA out of memory ({how}): {oom.line}", evidence)
    if (signal in _SHUTDOWN_SIGNALS and not killed_by_us and facts.advanced_since_failure and facts.fatal is None
            and facts.phase is not None and facts.phase.rank >= Phase.ENGINE_READY.rank):
        # A server that was ready, asked to shut down from outside: the end of its service, not a crash.
        return Judgement(Verdict.DONE, f"{how} after it was ready: a requested shutdown", evidence)
    if signal == _SIGKILL and not killed_by_us:
        # Only the kernel's own word makes it an OOM kill: a `kill -9` by hand looks the same.
        if kernel_oom is not None:
            return Judgement(Verdict.OOM, f"killed by the kernel's OOM killer: {kernel_oom}",
                             replace(evidence, kernel=kernel_oom))
        return Judgement(Verdict.KILLED, "SIGKILL from outside the supervisor (the kernel reported no OOM kill)",
                         evidence)
    if failure is not None:
        return Judgement(Verdict.CRASHED, f"{how}: {failure.line}", evidence)
    if killed_by_us:
        return Judgement(Verdict.CRASHED, f"stopped by the supervisor ({how})", evidence)
    tail = facts.tail.lines
    # The cause may still be in the log in words no probe knows (a one-line refusal, a program's own
    # message): its last line is the best pointer there is.
    ends = f"; the log ends: {tail[-1]}" if tail else "; the log is empty"
    return Judgement(Verdict.CRASHED, f"{how}, no error line recognised in the log{ends}", evidence)


def _limit_judgement(hit: LimitHit, how: str, evidence: Exited) -> Judgement:
    figures = replace(evidence, limit=LimitFigures(hit.kind.value, hit.limit, hit.events))
    if hit.kind is LimitKind.MEMORY:
        return Judgement(Verdict.OOM, f"killed by {hit.describe()}; {how}", figures)
    return Judgement(Verdict.LIMIT, f"{how} after {hit.describe()}", figures)


def _exit_evidence(facts: Facts, returncode: int | None, signal: int | None) -> Exited:
    progress = facts.progress
    bar = None if progress is None else BarAt(progress.probe, progress.done, progress.total)
    failure = facts.oom or facts.primary_failure
    blamed = None if failure is None else failure_evidence(failure, facts.failure_count)
    # No failure probe matched: what the log said last.
    last_lines = facts.tail.lines if blamed is None and facts.tail.lines else None
    return Exited(returncode, signal, _signal_name(signal), facts.phase_name, bar, blamed, last_lines)


def _exit_signal(returncode: int | None, signal: int | None) -> int | None:
    # A shell reports death by signal N as status 128+N, and subprocess as -N.
    if signal is not None:
        return signal
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if 128 < returncode <= 128 + 64:
        return returncode - 128
    return None


def _signal_name(signal: int | None) -> str | None:
    if signal is None:
        return None
    try:
        return signal_module.Signals(signal).name
    except ValueError:
        return f"signal {signal}"


def _describe_exit(returncode: int | None, signal: int | None) -> str:
    if signal is not None:
        return f"killed by {_signal_name(signal)}"
    if returncode is None:
        return "exited with unknown status"
    return f"exited {returncode}"
