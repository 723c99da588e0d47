"""The CLI's pieces that need no daemon: spec errors in the project's words, `--since` times,
the live view's job column on a narrow terminal and its GPU sensors (through the fake NVML),
and the retention rule that never deletes a running attempt's log."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.fake_nvml import FakeNvml
from rich.console import Console

from supervisor.cli._args import since_time
from supervisor.cli.watch import plain_lines, render, short_name
from supervisor.core import protocol
from supervisor.core.errors import SpecError
from supervisor.core.events import AttemptState
from supervisor.gpu.nvml import NvmlSampler
from supervisor.jobs.views import gpu_devices
from supervisor.spec.model import load_spec
from supervisor.store.database import AttemptRow
from supervisor.store.retention import Retention, select_for_pruning

REPO = Path(__file__).resolve().parents[1]


def test_spec_typos_are_listed_at_once_with_did_you_mean(tmp_path: Path) -> None:
    spec = tmp_path / "typo.toml"
    spec.write_text('comand = ["true"]\nstop_grace = 1\n[restart]\nmax_attemps = 2\n')
    with pytest.raises(SpecError) as raised:
        load_spec(spec)
    message = str(raised.value)
    assert "\n" not in message
    for problem in ("field 'command' is required", "unknown field 'comand' (did you mean 'command'?)",
                    "unknown field 'stop_grace' (did you mean 'stop_grace_s'?)",
                    "unknown field 'restart.max_attemps' (did you mean 'max_attempts'?)"):
        assert problem in message, message
    assert "Extra inputs are not permitted" not in message and "Field required" not in message  # pydantic's words


def test_since_takes_durations_and_times() -> None:
    now = 1_750_000_000.0
    assert since_time("10m", now) == now - 600
    assert since_time("2h", now) == now - 7200
    assert since_time("1.5s", now) == now - 1.5
    assert since_time("2025-05-01 14:00:05", now) == time.mktime((2025, 5, 1, 14, 0, 5, 0, 0, -1))
    for bad in ("soon", "10x", "-5m", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            since_time(bad, now)


def _job(name: str) -> protocol.JobStatus:
    return protocol.JobStatus(name=name, state="running", reason="", host="local", max_attempts=3, attempt=None)


def _draw(status: protocol.StatusResponse, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render(status, now=0.0))
    return out.getvalue()


def test_the_job_column_keeps_names_apart_on_a_narrow_terminal() -> None:
    status = protocol.StatusResponse(jobs=[_job("crawl-shard-alpha"), _job("crawl-shard-beta")],
                                     daemon_pid=1, daemon_version="0")
    screen = _draw(status, width=50)
    assert "crawl-shard-alpha" in screen and "crawl-shard-beta" in screen, screen
    long_a, long_b = "extract-hidden-states-" + "x" * 30 + "-a", "extract-hidden-states-" + "x" * 30 + "-b"
    assert short_name(long_a) != short_name(long_b) and len(short_name(long_a)) == 32
    screen = _draw(protocol.StatusResponse(jobs=[_job(long_a), _job(long_b)], daemon_pid=1, daemon_version="0"), 60)
    assert short_name(long_a) in screen and short_name(long_b) in screen, screen


def test_gpu_sensors_reach_the_views_through_nvml() -> None:
    nvml = FakeNvml()
    nvml.add_device(util_pct=87, temperature_c=61, power_mw=412_345)
    nvml.add_device(sensors_supported=False, util_supported=False)  # a MIG slice: memory only
    nvml.start_process(4242, gpu=0, mib=30000)
    sample = NvmlSampler(nvml=nvml).sample()
    d0, d1 = sample.devices
    assert (d0.util_pct, d0.temperature_c, d0.power_w) == (87, 61, 412.345)
    assert (d1.util_pct, d1.temperature_c, d1.power_w) == (None, None, None)
    devices = gpu_devices(sample)
    assert (devices[0].temperature_c, devices[0].power_w) == (61, 412.345)
    status = protocol.StatusResponse(jobs=[], daemon_pid=1, daemon_version="0", gpu=devices)
    screen = _draw(status, width=160)
    assert "61°C" in screen and "412 W" in screen and "4242:30000MiB" in screen and "87%" in screen, screen
    assert "0:30615/143771 MiB 87% 61°C 412W" in plain_lines(status, now=0.0)[-1]


def test_status_watch_says_when_the_web_page_is_not_served() -> None:
    note = "the web page is not served: 127.0.0.1:8787 is taken by another process; ..."
    status = protocol.StatusResponse(jobs=[], daemon_pid=1, daemon_version="0", web_note=note)
    assert plain_lines(status, now=0.0)[-1].endswith(note)
    assert note in _draw(status, width=200)
    assert not any("web page" in line for line in plain_lines(status.model_copy(update={"web_note": ""}), now=0.0))


def test_fake_nvml_refuses_other_sensors_as_pynvml_does() -> None:
    import pynvml

    nvml = FakeNvml()
    nvml.nvmlInit()
    nvml.add_device()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_COUNT)


def _attempt(n: int, state: AttemptState) -> AttemptRow:
    return AttemptRow(job="j", n=n, tag=f"t{n}", host="local", argv=[], workdir="/", log_path=f"/l/{n}",
                      status_path=f"/s/{n}", pid=None, pgid=None, start_time=None, started=float(n), ended=None,
                      state=state, exit_code=None, exit_signal=None, log_offset=0, phase=None, progress=None,
                      verdict=None, reason=None, failure=None, fingerprint=None, action=None)


def test_retention_keeps_the_newest_and_never_a_running_attempt() -> None:
    ended = [_attempt(n, AttemptState.ENDED) for n in (1, 2, 3)]
    running = _attempt(4, AttemptState.RUNNING)
    sizes = {f"/l/{n}": 100 for n in (1, 2, 3)} | {"/l/4": 10_000}
    assert [a.n for a in select_for_pruning([*ended, running], sizes, Retention(2, 0))] == [2, 1]
    # The running attempt's log alone is over the byte limit: it stays, every other one goes.
    assert [a.n for a in select_for_pruning([*ended, running], sizes, Retention(20, 500))] == [3, 2, 1]
    assert select_for_pruning(ended, sizes, Retention(3, 300)) == []


@pytest.mark.parametrize("argv, code, message", [
    (["--version"], 0, None),
    (["status", "-w", "--every", "-1"], 2, "argument --every: must be from 0.1 to 86400 seconds, got -1"),
    (["status", "-w", "--every", "0"], 2, "argument --every: must be from 0.1 to 86400 seconds, got 0"),
    (["status", "-w", "--every", "inf"], 2, "argument --every: must be from 0.1 to 86400 seconds, got inf"),
    (["status", "-w", "--every", "nan"], 2, "argument --every: must be from 0.1 to 86400 seconds, got nan"),
    (["status", "-w", "--every", "1e-9"], 2, "argument --every: must be from 0.1 to 86400 seconds, got 1e-9"),
    (["status", "-w", "--every", "x" * 100], 2, f"argument --every: expected a number of seconds, got '{'x' * 40}'"),
    (["logs", "j", "-n", "0"], 2, "argument -n/--lines: must be from 1 to 1,000,000,000, got 0"),
    (["events", "j", "-n", "1" * 30], 2, f"argument -n/--lines: must be from 1 to 1,000,000,000, got {'1' * 30}"),
    (["events", "j", "-n", "2.5"], 2, "argument -n/--lines: expected a whole number, got '2.5'"),
    (["stop", "j", "--grace", "inf"], 2, "argument --grace: must be from 0 to 86400 seconds (a day), got inf"),
    (["events", "j", "--since", "soon"], 2, "argument --since: expected a duration"),
    (["events", "j", "--kind", "nope"], 2, "argument --kind: invalid choice: 'nope'"),
])
def test_usage_errors_exit_2_in_one_line(argv: list[str], code: int, message: str | None,
                                         tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", *argv], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SUPERVISE_HOME": str(tmp_path)},
                            timeout=60, check=False)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    if message is None:
        assert result.stdout.strip() == "supervise 0.1.0"
    else:
        assert message in result.stderr.strip().splitlines()[-1], result.stderr
    assert not (tmp_path / "daemon.sock").exists()  # refused before any daemon was started


def _step(name: str, state: str, attempt: protocol.AttemptInfo | None = None) -> protocol.PipelineStepStatus:
    return protocol.PipelineStepStatus(step=name, job=f"p.{name}", state=state, reason="", attempt=attempt)


def test_the_pipelines_overall_eta_adds_the_running_bar_and_the_usual_durations_to_come() -> None:
    from supervisor.jobs.pipeline_eta import overall_eta

    now = 1000.0
    running = protocol.AttemptInfo(job="p.b", n=2, state="running", host="local", pid=1, started=now - 5, ended=None,
                                   exit_code=None, exit_signal=None, log_path="x", phase=None, verdict=None, reason=None,
                                   progress=protocol.ProgressInfo(probe="tqdm", done=1, total=4, eta_s=30.0),
                                   failure=None, fingerprint=None, action=None, argv=[])
    history = {"p.a": [1.0], "p.b": [40.0], "p.c": [10.0, 20.0, 100.0]}
    steps = [_step("a", "done"), _step("b", "running", running), _step("c", "waiting")]
    assert overall_eta(steps, lambda job: history.get(job, []), now).eta_s == 30.0 + 20.0  # the bar, then c's median
    no_bar = running.model_copy(update={"progress": None})
    steps[1] = _step("b", "running", no_bar)
    assert overall_eta(steps, lambda job: history.get(job, []), now).eta_s == 35.0 + 20.0  # b's usual 40 s less 5 s run
    unknown = overall_eta(steps, lambda job: history.get(job, []) if job != "p.c" else [], now)
    assert unknown.eta_s is None and unknown.note == "ETA unknown: no history for step c"
    steps[1] = _step("b", "failed")
    assert overall_eta(steps, lambda job: history.get(job, []), now) == overall_eta([], lambda job: [], now)


def test_logs_n_counts_the_lines_a_person_sees_on_a_terminal() -> None:
    from collections import deque

    from supervisor.cli.logs import keep_last_visible
    from supervisor.core.protocol import LogChunk

    records = [LogChunk(attempt=1, offset=0, text="loading")]
    records += [LogChunk(attempt=1, offset=10 + i, text=f"bar {i}/100", redraw=True) for i in range(100)]
    records += [LogChunk(attempt=1, offset=200, text="bar 100/100"), LogChunk(attempt=1, offset=220, text="ready"),
                LogChunk(attempt=1, offset=230, text="serving 1/9", redraw=True)]
    on_screen: deque[LogChunk] = deque(maxlen=3)
    piped: deque[LogChunk] = deque(maxlen=3)
    for chunk in records:
        keep_last_visible(on_screen, chunk, overwrite=True)
        keep_last_visible(piped, chunk, overwrite=False)
    assert [c.text for c in on_screen] == ["bar 100/100", "ready", "serving 1/9"]  # what the screen shows
    assert [c.text for c in piped] == ["bar 100/100", "ready", "serving 1/9"]
    on_screen = deque(maxlen=2)
    for chunk in records[:60]:
        keep_last_visible(on_screen, chunk, overwrite=True)
    assert [c.text for c in on_screen] == ["loading", "bar 58/100"]  # not two redraws of one bar


def test_piped_event_printer_prints_a_redrawn_bar_per_percent_and_its_latest_state(capsys) -> None:
    # Every redraw of a 2,000-step bar handed to the piped printer (as a stream that carried each
    # one would): a line at each whole percent (plus at most one a second), none repeated, and the
    # latest state printed before the next other event even when it opened no new percent.
    from supervisor.cli.logs import _EventPrinter
    from supervisor.core.events import EventKind

    def event(n: int, kind: EventKind, data: dict[str, int]) -> protocol.EventInfo:
        return protocol.EventInfo(id=n, job="j", attempt=1, ts=1.0e9, kind=kind, probe="bar" if data else None,
                                  phase=None, offset=None, message="m", data=data)

    printer = _EventPrinter()
    for i in range(1, 2000):
        printer.show(event(i, EventKind.PROGRESS, {"done": i, "total": 2001}))
    printer.show(event(2000, EventKind.EXITED, {}))
    printer.close()
    lines = capsys.readouterr().out.splitlines()
    bar = [int(line.split(": ", 1)[1].split("/")[0]) for line in lines if " progress " in line]
    assert 100 <= len(bar) <= 101 + 10, len(bar)
    assert bar == sorted(set(bar)) and bar[-1] == 1999
    assert " exited " in lines[-1] and " progress " in lines[-2]


def test_a_run_builds_only_its_verb_s_parser_and_it_is_the_whole_parser_s() -> None:
    """`supervise VERB ...` builds VERB's parser alone (`cli._parser(only=...)`): the same help, defaults and
    parse as the whole parser gives, for every verb; a word that is no verb gets the whole parser."""
    from supervisor import cli

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(action.choices)

    whole = subparsers(cli._parser())
    assert len(whole) > 20
    for verb, full in whole.items():
        alone = subparsers(cli._parser(verb))
        assert list(alone) == [verb]
        assert alone[verb].format_help() == full.format_help(), verb
        assert alone[verb]._defaults.keys() == full._defaults.keys(), verb
    assert list(subparsers(cli._parser("no-such-verb"))) == list(whole)
    args = cli._parser("probe").parse_args(["probe", "--json", "x.log"])
    assert (args.logfile, args.json, args.pack, args.func.target) == ("x.log", True, [], "probe:cmd_probe")
