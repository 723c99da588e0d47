"""`supervise`: the command line.  It talks only to the daemon's API (starting the daemon
when none runs), except `probe`, which reads a log offline, and `daemon --foreground`.

    jobs      start, stop, hold, release, stack, restart, rm, prune, attempts, jobs
    logs      logs, events, and following a job's events
    system    daemon (run, stop, restart), config, doctor, web
    probe     reading a finished log offline (no daemon, so none of the client is imported)
    views     status (and its live view), gpus, report
    quarantine  the GPUs and hosts kept away from, and lifting a quarantine

Exit codes (docs/reference/exit-codes.md): 0 success; 1 the job failed / gave up; 2 usage; 65 bad spec or
probe pack; 66 unknown job; 69 daemon or host unavailable; 70 internal error in the daemon;
74 store or file I/O; 75 the job is already running; 78 configuration.  An error the daemon
finds exits with the same code as if the CLI had found it (errors.TABLE).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import cast

from supervisor import __version__
from supervisor.cli._args import (
    add_field_flags,
    add_since,
    attempt_number,
    every_seconds,
    gpu_list,
    grace_seconds,
    grep_pattern,
    job_name,
    line_count,
    quarantine_place,
    report_out,
)
from supervisor.cli.completion import SHELLS
from supervisor.core.errors import SuperviseError
from supervisor.core.events import EventKind

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(words[0] if words and not words[0].startswith("-") else None)
    command = None
    if words[:1] == ["run"] and "--" in words:
        # `run NAME [flags] -- CMD ARGS`: the words after `--` are the command's, split off before
        # argparse sees them (it cannot take flags after NAME and a free-form tail after them).
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1:]
    args = parser.parse_args(words)
    if command is not None:
        args.stray = args.argv  # words before `--` that are no flag of run's: refused by run
        args.argv = command
    try:
        return int(args.func(args) or 0)
    except SuperviseError as exc:
        print(f"supervise: {' '.join(str(exc).splitlines())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("supervise: interrupted (the job keeps running under the daemon)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: the verb a run names, whose parser alone is built (the
    others take their calls and keep nothing: building all of them was a twentieth of `supervise probe`'s
    start).  A word that is no verb gets the whole parser, which says so and lists them."""
    parser = argparse.ArgumentParser(prog="supervise", description="Supervise long-running GPU jobs.")
    parser.add_argument("--version", action="version", version=f"supervise {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = _adder(sub, only)
    _job_commands(add)
    _reading_commands(add)
    _system_commands(add)
    if only is not None and only not in sub.choices:
        return _parser()
    return parser


Command = Callable[[argparse.Namespace], int]


class _Verb:
    """A verb's handler named ``"module:function"`` (``supervisor.cli.<module>.<function>``) and
    imported when the verb runs: the parser is built for every command, and importing every verb's
    module with it loaded the daemon's client (httpx, the API's models) into `probe` and
    `completion` too, ~0.4 s of their start.  A name no mypy can follow, so one test imports every
    verb's target (tests/test_cli_imports.py)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.module, _, self.function = target.partition(":")

    def resolve(self) -> Command:
        handler: Command = getattr(importlib.import_module(f"supervisor.cli.{self.module}"), self.function)
        return handler

    def __call__(self, args: argparse.Namespace) -> int:
        return self.resolve()(args)


def _verb(target: str) -> Command:
    return _Verb(target)


def verbs() -> dict[str, _Verb]:
    """Every verb of the parser and its lazily imported handler (for the test that imports each)."""
    found: dict[str, _Verb] = {}
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                func = sub.get_default("func")
                if isinstance(func, _Verb):
                    found[name] = func
    return found


class _Unbuilt:
    """The parser of a verb this run does not name: it takes every call made to build it (arguments,
    groups, defaults) and keeps nothing."""

    def __getattr__(self, _name: str) -> Callable[..., _Unbuilt]:
        return self._take

    def _take(self, *_args: object, **_kwargs: object) -> _Unbuilt:
        return self


Adder = Callable[[str, Command, str], argparse.ArgumentParser]


def _adder(sub: argparse._SubParsersAction, only: str | None = None) -> Adder:  # type: ignore[type-arg]
    def add(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        if only is not None and name != only:
            return cast(argparse.ArgumentParser, _Unbuilt())
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    return add


def _job_commands(add: Adder) -> None:
    p = add("start", _verb("jobs:cmd_start"), "start a job or a pipeline (a name from jobs/ or a path to a .toml file)")
    p.add_argument("job")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a [params] parameter (one argv item; never seen by a shell); STEP.KEY for one pipeline step")
    p.add_argument("--after", action="append", default=[], metavar="JOB",
                   help="launch only once JOB's current run is done (cancelled if it gives up); repeatable")
    p.add_argument("--follow", "-f", action="store_true", help="follow events until the job ends")
    add_field_flags(p)

    p = add("run", _verb("run:cmd_run"), "run a command as a supervised job without writing a spec: "
                                            "supervise run NAME -- CMD ARGS...")
    p.add_argument("name", type=job_name, help="the job's name (what status, logs and stop take)")
    p.add_argument("--after", action="append", default=[], metavar="JOB",
                   help="launch only once JOB's current run is done (cancelled if it gives up); repeatable")
    p.add_argument("--gpus", type=gpu_list, default=None, metavar="LIST",
                   help="the GPUs it uses: 0,1 or all (default: all); their memory is watched and awaited around relaunches")
    p.add_argument("--follow", "-f", action="store_true", help="follow events until the job ends")
    add_field_flags(p)
    # After `--` every word is the command's, its own options too (main() splits them off).
    p.add_argument("argv", nargs="*", metavar="-- CMD ARGS",
                   help="the command and its arguments, after `--`, each taken literally (no shell)")
    p.set_defaults(stray=[])

    p = add("stop", _verb("jobs:cmd_stop"), "stop a job: SIGTERM to its whole tree, then SIGKILL after a grace period")
    p.add_argument("job")
    p.add_argument("--grace", type=grace_seconds, default=None, help="seconds between TERM and KILL (0 to 86400)")

    p = add("hold", _verb("jobs:cmd_hold"), "postpone any kill of a running job (a pending warn_then_kill included) until release")
    p.add_argument("job")

    p = add("stack", _verb("jobs:cmd_stack"), "dump the Python stacks of a running job's processes now (py-spy): where it is stuck")
    p.add_argument("job")

    p = add("release", _verb("jobs:cmd_release"), "let kills of a held job come again (a pending kill counts down again from now)")
    p.add_argument("job")

    p = add("restart", _verb("jobs:cmd_restart"), "stop a job if it runs, then start it again with its stored spec and --set values")
    p.add_argument("job")
    p.add_argument("--grace", type=grace_seconds, default=None, help="seconds between TERM and KILL (0 to 86400)")
    p.add_argument("--follow", "-f", action="store_true", help="follow events until the job ends")
    p.add_argument("--reload", action="store_true",
                   help="take the job's spec file as it is now (without it: the spec it was started with, "
                        "and a file changed since is said)")
    add_field_flags(p)

    p = add("accounting", _verb("accounting:cmd_accounting"), "one row per attempt (job, host, start, end, duration, verdict, CPU, "
                                          "peak memory, GPU-hours, exit), as sacct gives")
    add_since(p, "attempts that ran since then")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object per line")
    fmt.add_argument("--csv", action="store_true", help="comma-separated, with a header line")

    p = add("rm", _verb("jobs:cmd_rm"), "forget a job that is not running (its attempt logs are kept unless --logs)")
    p.add_argument("job")
    p.add_argument("--logs", action="store_true", help="delete its attempt logs too")

    p = add("prune", _verb("jobs:cmd_prune"), "delete old attempt logs as the retention settings say (never a running attempt's)")
    p.add_argument("job", nargs="?", help="only this job (default: every job)")

    p = add("attempts", _verb("jobs:cmd_attempts"), "history of a job's attempts")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")

    p = add("jobs", _verb("jobs:cmd_jobs"), "list known jobs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--names", action="store_true", help="only their names, one a line (nothing when no daemon answers)")
    p.add_argument("--specs", action="store_true", help="with --names: also the job specs `start` finds by name")

    p = add("completion", _verb("completion:cmd_completion"), "print a shell completion script: "
                                          "eval \"$(supervise completion bash)\" in ~/.bashrc (zsh likewise; "
                                          "fish: > ~/.config/fish/completions/supervise.fish)")
    p.add_argument("shell", choices=SHELLS)


def _reading_commands(add: Adder) -> None:
    p = add("status", _verb("views:cmd_status"), "show jobs: state, phase, progress, health (with JOB: exit 1 when it failed)")
    p.add_argument("job", nargs="?")
    p.add_argument("--json", action="store_true")
    p.add_argument("-w", "--watch", action="store_true",
                   help="a live view, redrawn twice a second (plain lines every few seconds when not a terminal)")
    p.add_argument("--every", type=every_seconds, default=5.0, metavar="S",
                   help="with --watch and no terminal: seconds between plain status lines (0.1 to 86400)")

    p = add("logs", _verb("logs:cmd_logs"), "print an attempt's log (tqdm redraws shown as one updating line)")
    p.add_argument("job")
    p.add_argument("--attempt", type=attempt_number, default=None)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("-n", "--lines", type=line_count, default=None, metavar="N", help="only the last N lines")
    add_since(p, "lines written since then (log lines are timed by the events the probes stored)")
    p.add_argument("--events", action="store_true", help="show probe events instead of raw lines")
    p.add_argument("--grep", type=grep_pattern, default=None, metavar="PATTERN",
                   help="only lines this RE2 pattern matches (with -n: the last N of them)")
    p.add_argument("--timestamps", action="store_true",
                   help="each line's arrival time first, to the second (as the daemon read it)")

    p = add("events", _verb("logs:cmd_events"), "events of a job (phases, progress, failures, verdicts, actions)")
    p.add_argument("job")
    p.add_argument("--attempt", type=attempt_number, default=None)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--kind", dest="kinds", action="append", default=[], choices=[k.value for k in EventKind],
                   metavar="K", help="only events of this kind (repeatable): " + ", ".join(k.value for k in EventKind))
    add_since(p, "events since then")
    p.add_argument("-n", "--lines", type=line_count, default=None, metavar="N", help="only the last N events")
    p.add_argument("--json", action="store_true")

    p = add("gpus", _verb("views:cmd_gpus"), "GPU memory and processes as the daemon sees them")
    p.add_argument("--json", action="store_true")

    p = add("quarantine", _verb("quarantine:cmd_quarantine"), "GPUs and hosts jobs are kept away from (after a "
                                          "GPU fault, or repeated killed/unreachable verdicts), with their expiry")
    p.add_argument("--clear", type=quarantine_place, default=None, metavar="HOST[:GPU]",
                   help="lift that quarantine now (HOST: the host's and its GPUs')")
    p.add_argument("--json", action="store_true")

    p = add("report", _verb("views:cmd_report"), "a picture of a job's history: attempts, phases, progress, GPU memory, watchdog actions")
    p.add_argument("job")
    p.add_argument("--out", type=report_out, default=None, metavar="FILE.png|FILE.html",
                   help="where to write it (default: JOB-report.png); .html embeds the picture and a table of attempts")


def _system_commands(add: Adder) -> None:
    p = add("daemon", _verb("system:cmd_daemon"), "start the daemon (in the foreground with --foreground), or stop / restart it")
    p.add_argument("action", nargs="?", choices=["start", "stop", "restart"], default="start",
                   help="stop / restart: the jobs keep running and the next daemon re-adopts them")
    p.add_argument("--foreground", action="store_true")

    p = add("probe", _verb("probe:cmd_probe"), "replay a finished log through the probes and say what it shows (exit 1: it crashed)")
    p.add_argument("logfile")
    p.add_argument("--pack", action="append", default=[], help="built-in pack name (default: all)")
    p.add_argument("--pack-file", action="append", default=[], help="a user probe pack (.toml)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--stats", action="store_true",
                   help="also say on stderr which engine read the log (Hyperscan prefilter or RE2) and how fast")

    p = add("config", _verb("system:cmd_config"), "the daemon's settings: config file + SUPERVISE_* environment")
    p.add_argument("action", choices=["show"], help="show: the effective settings and where each came from")
    p.add_argument("--json", action="store_true")

    p = add("doctor", _verb("system:cmd_doctor"), "check that a host can run supervised jobs (SSH, shell tools, nvidia-smi, disk)")
    p.add_argument("--host", default=None, metavar="ssh://[user@]host[:port]",
                   help="the remote host to check (default: this machine)")

    p = add("web", _verb("system:cmd_web"), "serve a live web page of the jobs on loopback TCP, behind a token")
    p.add_argument("--port", type=int, default=8787)
    p.add_argument("--bind", default="127.0.0.1", help="loopback unless --allow-remote")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --bind")
    p.add_argument("--read-only", action="store_true", help="no stop button")
    p.add_argument("--off", action="store_true", help="stop serving the page and forget its token")
