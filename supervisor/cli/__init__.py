"""`supervise`: the command line.  It talks only to the daemon's API (starting the daemon
when none runs), except `probe`, which reads a log offline, and `daemon --foreground`.

Exit codes: 0 success; 1 the job failed / gave up; 2 usage; 65 bad spec or probe pack;
66 unknown job; 69 daemon or host unavailable; 70 internal error in the daemon; 74 store I/O;
75 the job is already running; 78 configuration.  An error the daemon finds exits with the
same code as if the CLI had found it (errors.TABLE).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from . import _format as _fmt
from . import protocol
from .client import Client
from .config import default_paths
from .errors import SuperviseError
from .events import EventKind, JobState, Verdict
from .spec import find_spec, parse_overrides


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="supervise", description="Supervise long-running GPU jobs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = add("start", cmd_start, "start a job (a name from jobs/ or a path to a .toml spec)")
    p.add_argument("job")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter (one argv item; never seen by a shell)")
    p.add_argument("--follow", "-f", action="store_true", help="follow events until the job ends")

    p = add("stop", cmd_stop, "stop a job: SIGTERM to its whole tree, then SIGKILL after a grace period")
    p.add_argument("job")
    p.add_argument("--grace", type=float, default=None, help="seconds between TERM and KILL")

    p = add("status", cmd_status, "show jobs: state, phase, progress, health")
    p.add_argument("job", nargs="?")
    p.add_argument("--json", action="store_true")
    p.add_argument("-w", "--watch", action="store_true",
                   help="a live view, redrawn twice a second (plain lines every few seconds when not a terminal)")
    p.add_argument("--every", type=float, default=5.0, metavar="S",
                   help="with --watch and no terminal: seconds between plain status lines")

    p = add("logs", cmd_logs, "print an attempt's log (tqdm redraws shown as one updating line)")
    p.add_argument("job")
    p.add_argument("--attempt", type=int, default=None)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--events", action="store_true", help="show probe events instead of raw lines")

    p = add("attempts", cmd_attempts, "history of a job's attempts")
    p.add_argument("job")
    p.add_argument("--json", action="store_true")

    p = add("events", cmd_events, "events of a job (phases, progress, failures, verdicts, actions)")
    p.add_argument("job")
    p.add_argument("--attempt", type=int, default=None)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--json", action="store_true")

    p = add("jobs", cmd_jobs, "list known jobs")
    p.add_argument("--json", action="store_true")

    p = add("gpus", cmd_gpus, "GPU memory and processes as the daemon sees them")
    p.add_argument("--json", action="store_true")

    p = add("daemon", cmd_daemon, "run the daemon (in the foreground with --foreground)")
    p.add_argument("--foreground", action="store_true")

    p = add("probe", cmd_probe, "replay a finished log through the probes and say what it shows (exit 1: it crashed)")
    p.add_argument("logfile")
    p.add_argument("--pack", action="append", default=[], help="built-in pack name (default: all)")
    p.add_argument("--pack-file", action="append", default=[], help="a user probe pack (.toml)")
    p.add_argument("--json", action="store_true")

    p = add("report", cmd_report, "a picture of a job's history: attempts, phases, progress, GPU memory, watchdog actions")
    p.add_argument("job")
    p.add_argument("--out", default=None, metavar="FILE.png|FILE.html",
                   help="where to write it (default: JOB-report.png); .html embeds the picture and a table of attempts")

    p = add("config", cmd_config, "the daemon's settings: config file + SUPERVISE_* environment")
    p.add_argument("action", choices=["show"], help="show: the effective settings and where each came from")
    p.add_argument("--json", action="store_true")

    p = add("doctor", cmd_doctor, "check that a host can run supervised jobs (SSH, shell tools, nvidia-smi, disk)")
    p.add_argument("--host", default=None, metavar="ssh://[user@]host[:port]",
                   help="the remote host to check (default: this machine)")
    return parser


def _client() -> Client:
    client = Client(default_paths())
    client.ensure_daemon()
    return client


# -- commands ---------------------------------------------------------------------------

def cmd_start(args: argparse.Namespace) -> int:
    overrides = parse_overrides(args.overrides)
    spec = find_spec(args.job).with_overrides(overrides)
    spec.argv(1)  # a missing template parameter is an error here, before the daemon is involved
    client = _client()
    response = client.start(spec.spec_path, overrides)
    print(f"supervise: {response.message}; log {response.log_path}")
    if not args.follow:
        return 0
    return _follow_job(client, spec.name, response.attempt)


def cmd_stop(args: argparse.Namespace) -> int:
    response = _client().stop(args.job, args.grace)
    print(response.message)
    for proc in response.processes:
        orphan = "  (re-parented)" if proc.reparented else ""
        print(f"  {proc.signal:<8} {proc.pid:>8}  {proc.name}{orphan}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch:
        from .watch import watch_command

        client = _client()
        return watch_command(lambda: client.status(args.job), plain_every_s=args.every)
    status = _client().status(args.job)
    if args.json:
        print(status.model_dump_json(indent=2))
        return 0
    if not status.jobs:
        print("no jobs yet: `supervise start JOB`")
    for job in status.jobs:
        print(_status_block(job))
    print(_gpu_line(status.gpu, status.gpu_note))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client()
    if args.events:
        return _print_events(client, args.job, args.attempt, args.follow, as_json=False)
    redraw_pending = False
    tty = sys.stdout.isatty()
    for chunk in client.follow_log(args.job, attempt=args.attempt, follow=args.follow):
        if chunk.end:
            break
        if chunk.partial and not tty:
            continue  # an unterminated redraw: printed once it is complete
        if chunk.redraw:
            # A tqdm redraw replaces the previous state: on a terminal, overwrite the line,
            # cut to the terminal's width (a wrapped line cannot be overwritten by \r).
            if tty:
                sys.stdout.write("\r\x1b[2K" + _fit_line(chunk.text))
                sys.stdout.flush()
                redraw_pending = True
                continue
        if redraw_pending:
            sys.stdout.write("\r\x1b[2K")
            redraw_pending = False
        sys.stdout.write(chunk.text + "\n")
        sys.stdout.flush()
    if redraw_pending:
        sys.stdout.write("\n")
    return 0


def _fit_line(text: str) -> str:
    import shutil

    from rich.cells import cell_len, set_cell_size

    width = max(10, shutil.get_terminal_size().columns - 1)
    return text if cell_len(text) <= width else set_cell_size(text, width)


def cmd_report(args: argparse.Namespace) -> int:
    from .report import report_command

    return report_command(_client(), args.job, args.out)


def cmd_config(args: argparse.Namespace) -> int:
    from .config import describe_settings, load_settings

    client = Client(default_paths())
    running = client.accepting()
    response = client.config() if running else describe_settings(load_settings(default_paths()))
    client.close()
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    origin = "the running daemon's" if running else "no daemon running; as a daemon started from this shell would read them"
    print(f"config file: {response.config_file} ({'present' if response.config_file_exists else 'absent'}); settings: {origin}")
    width = max(len(s.name) for s in response.settings)
    for setting in response.settings:
        value = " ".join(setting.value) if isinstance(setting.value, list) else setting.value
        print(f"  {setting.name:<{width}} = {value if value not in (None, '') else '(unset)'!s:<24} from {setting.source}")
    return 0


def cmd_attempts(args: argparse.Namespace) -> int:
    response = _client().attempts(args.job)
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    print(f"{'#':>3}  {'started':<19} {'duration':>9}  {'phase':<18} {'progress':<12} {'verdict':<8} {'fingerprint':<12} action")
    for a in response.attempts:
        duration = _fmt.duration((a.ended or time.time()) - a.started)
        progress = f"{_fmt.num(a.progress.done)}/{_fmt.num(a.progress.total)}" if a.progress and a.progress.total else "-"
        print(f"{a.n:>3}  {_fmt.timestamp(a.started):<19} {duration:>9}  {a.phase or '-':<18} {progress:<12} "
              f"{a.verdict or a.state:<8} {(a.fingerprint or '-')[:12]:<12} {a.action or ''}")
        if a.reason and a.verdict not in (None, Verdict.DONE):
            print(f"     {a.reason}")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    return _print_events(_client(), args.job, args.attempt, args.follow, args.json)


def cmd_jobs(args: argparse.Namespace) -> int:
    response = _client().status()
    if args.json:
        print(protocol.JobsResponse(jobs=response.jobs).model_dump_json(indent=2))
        return 0
    for job in response.jobs:
        a = job.attempt
        attempt = _fmt.attempt(a.run_attempt, job.max_attempts, a.n) if a else f"0/{job.max_attempts}"
        print(f"{job.name:<20} {job.state:<10} attempt {attempt}  {job.reason}")
    return 0


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


def cmd_daemon(args: argparse.Namespace) -> int:
    from .daemon import run_daemon

    if args.foreground:
        return run_daemon()
    ping = Client(default_paths()).ensure_daemon()
    print(f"daemon running: pid {ping.pid}, version {ping.version}, state {ping.state_dir}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from .probes import probe_command

    return probe_command(args.logfile, args.pack, args.pack_file, args.json)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor_command

    return doctor_command(args.host)


# -- rendering --------------------------------------------------------------------------

def _follow_job(client: Client, job: str, attempt: int) -> int:
    printer = _EventPrinter()
    for event in client.follow_events(job, min_attempt=attempt, until_done=True):
        printer.show(event)
    printer.close()
    status = client.status(job).jobs[0]
    print(f"supervise: {job} {status.state}: {status.reason}")
    return 0 if status.state is JobState.DONE else 1


def _print_events(client: Client, job: str, attempt: int | None, follow: bool, as_json: bool) -> int:
    events = client.follow_events(job, attempt=attempt) if follow else iter(client.events(job, attempt).events)
    printer = _EventPrinter()
    for event in events:
        if as_json:
            print(event.model_dump_json())
        else:
            printer.show(event)
    printer.close()
    return 0


class _EventPrinter:
    """One line per event; progress on a terminal is a single updating line."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.progress_open = False
        self.last_progress: dict[str, Any] = {}

    def show(self, event: protocol.EventInfo) -> None:
        if event.kind is EventKind.PROGRESS:
            self._progress(event)
            return
        self._end_progress()
        detail = event.message
        if event.kind is EventKind.PHASE and event.phase:
            detail = f"{event.phase}: {event.message}"
        elif event.kind is EventKind.FAILURE:
            detail = f"{event.failure.kind if event.failure else 'failure'}: {event.message}"
        print(f"{_fmt.clock(event.ts)} #{event.attempt} {event.kind:<8} {detail}", flush=True)

    def _progress(self, event: protocol.EventInfo) -> None:
        done, total = event.data.get("done"), event.data.get("total")
        extra = ""
        for key in ("tok_s", "loss", "rate"):
            if key in event.data:
                extra += f" {key}={event.data[key]}"
        line = f"{_fmt.clock(event.ts)} #{event.attempt} progress {event.probe}: {_fmt.num(done)}/{_fmt.num(total)}{extra}"
        if self.tty:
            sys.stdout.write("\r\x1b[2K" + line)
            sys.stdout.flush()
            self.progress_open = True
        elif self.last_progress.get(event.probe or "") != done:
            print(line, flush=True)
        self.last_progress[event.probe or ""] = done

    def _end_progress(self) -> None:
        if self.progress_open:
            sys.stdout.write("\n")
            self.progress_open = False

    def close(self) -> None:
        self._end_progress()


def _status_block(job: protocol.JobStatus) -> str:
    a = job.attempt
    lines = [f"{job.name}: {job.state}  ({job.reason})" if job.reason else f"{job.name}: {job.state}"]
    if a is not None:
        lines.append(f"  attempt {_fmt.attempt(a.run_attempt, job.max_attempts, a.n)}  pid {a.pid}  host {a.host}  started {_fmt.timestamp(a.started)}")
        lines.append(f"  phase {a.phase or '-'}  verdict {a.verdict or Verdict.HEALTHY}")
        if job.next_verdict is not None:
            nv = job.next_verdict
            lines.append(f"  {nv.verdict} in {_fmt.duration(nv.in_s)} if nothing changes: {nv.reason}")
        if a.progress is not None:
            p = a.progress
            eta = f"  eta {_fmt.duration(p.eta_s)}" if p.eta_s else ""
            rate = f"  {p.rate_s_per_it:.2f} s/it" if p.rate_s_per_it else ""
            lines.append(f"  progress {p.probe}: {_fmt.num(p.done)}/{_fmt.num(p.total)}{rate}{eta}")
        if a.failure is not None:
            lines.append(f"  failure {a.failure.kind}: {a.failure.line}")
        if job.last_output_age_s is not None:
            lines.append(f"  last output {_fmt.duration(job.last_output_age_s)} ago")
        lines.append(f"  log {a.log_path}")
    if job.next_relaunch_in_s is not None:
        lines.append(f"  relaunch in {_fmt.duration(job.next_relaunch_in_s)}")
    return "\n".join(lines)


def _gpu_line(devices: list[protocol.GpuDeviceInfo], note: str) -> str:
    if not devices:
        return f"GPUs: {note or 'none'}"
    return "GPUs: " + "  ".join(f"{d.index}:{d.used_mib}/{d.total_mib} MiB" for d in devices)






if __name__ == "__main__":
    sys.exit(main())
