"""Offline replay: the report, its JSON and text forms, and the `supervise probe` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.core.events import FailureKind, Outcome, Phase
from supervisor.probes import _loading, _replay, probe_command, replay_file

CORPUS = Path(__file__).parent / "data" / "corpus"
CRASH = CORPUS / "full-logs" / "03-unsloth-vllm-rocm-lora-profile-crash.log"
READY = CORPUS / "full-logs" / "01-vllm-0.13-ready-13shards.log"
OOM = CORPUS / "full-logs" / "02-deepspeed-zero3-gpt2-train-oom.log"
DONE = CORPUS / "full-logs" / "05-llamafactory-lora-train-done.log"


def test_json_has_exactly_the_documented_shape() -> None:
    data = json.loads(replay_file(CRASH).to_json())
    assert set(data) == {"outcome", "last_phase", "failure", "progress", "events"}
    # The last phase line is "Model loading took"; the traceback's frames (profile_run) tell the rest.
    assert (data["outcome"], data["last_phase"]) == ("crashed", "kv_cache_profile")
    assert data["failure"] == {
        "kind": "runtime_error",
        "line": "RuntimeError: Expected size for first two dimensions of batch2 tensor to be: [8192, 16] but got: "
                "[8192, 4608].",
        "fingerprint": data["failure"]["fingerprint"],
    }
    assert {"probe": "vllm.shards", "bar": "Loading safetensors checkpoint shards", "process": "",
            "done": 4, "total": 4} in data["progress"]
    event = data["events"][0]
    assert set(event) == {"kind", "probe", "offset", "line", "phase", "failure", "fields", "traceback", "fingerprint"}
    offsets = [e["offset"] for e in data["events"]]
    assert offsets == sorted(offsets)


def test_text_report_for_humans() -> None:
    text = replay_file(CRASH).render_text()
    assert text.startswith("outcome: crashed    last phase: kv_cache_profile")
    assert "phases:" in text and "weight_loading" in text
    assert "Loading safetensors checkpoint shards  4/4" in text
    assert "failure: runtime_error" in text
    assert "traceback (last 15 lines):" in text
    ready = replay_file(READY).render_text()
    assert "outcome: ready" in ready and "failure: none" in ready


def test_reading_in_small_chunks_gives_the_same_report(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = replay_file(READY)
    monkeypatch.setattr(_replay, "_CHUNK", 97)
    assert replay_file(READY) == whole


def test_pack_selection(tmp_path: Path) -> None:
    only_python = replay_file(READY, ["python"])
    assert only_python.outcome is Outcome.INCOMPLETE and only_python.events == []
    mine = tmp_path / "ready.toml"
    mine.write_text("name = 'ready'\n[[probes]]\nid = 'up'\nkind = 'phase'\nphase = 'engine_ready'\n"
                    "regex = 'Application startup complete'\n")
    report = replay_file(READY, ["python"], [mine])
    assert (report.outcome, report.last_phase) == (Outcome.READY, Phase.ENGINE_READY)


def test_probe_command_exits_one_for_a_crash_as_grep_does_for_a_match(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_command(str(CRASH), [], [], True) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["failure"]["kind"] == FailureKind.RUNTIME_ERROR.value
    assert probe_command(str(CRASH), ["vllm", "python"], [], False) == 1
    assert capsys.readouterr().out.startswith("outcome: crashed")
    assert probe_command(str(OOM), [], [], False) == 1
    assert capsys.readouterr().out.startswith("outcome: oom")
    assert probe_command(str(READY), [], [], False) == 0
    assert capsys.readouterr().out.startswith("outcome: ready")
    assert probe_command(str(DONE), [], [], False) == 0
    assert capsys.readouterr().out.startswith("outcome: done")


def test_probe_command_errors_are_one_line_with_the_readme_exit_codes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_command(str(tmp_path / "nope.log"), [], [], False) == 66
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err and "nope.log" in err
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'bad'\n[[probes]]\nid = 'x'\nkind = 'info'\nregex = '(?=x)'\n")
    assert probe_command(str(READY), [], [str(bad)], False) == 65
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.toml" in err and "probe 'x'" in err
    assert probe_command(str(READY), ["nope"], [], False) == 65
    assert "unknown probe pack 'nope'" in capsys.readouterr().err


def test_probe_with_no_pack_to_load_is_an_error_not_a_clean_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # What a wheel without its probes/ did: "failure: none ... events: 0", exit 0.
    monkeypatch.setattr(_loading, "BUILTIN_DIR", tmp_path / "no-packs-here")
    monkeypatch.delenv(_loading.PROBE_PATH_ENV, raising=False)
    assert probe_command(str(CRASH), [], [], False) == 65
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "no probe pack found" in captured.err
    assert str(tmp_path / "no-packs-here") in captured.err


def _as_pydantic(report: _replay.ReplayReport, complete: bool = False) -> str:
    """The report as the pydantic models it was made of until its JSON was written by hand (the same
    fields, types and ``model_dump_json(indent=2, exclude=...)`` call): the bytes it must still print."""
    from typing import Any

    from pydantic import BaseModel

    from supervisor.core.events import ProbeKind

    class FailureSummary(BaseModel):
        kind: FailureKind
        line: str
        fingerprint: str | None

    class ProgressSummary(BaseModel):
        probe: str
        bar: str
        process: str
        done: int | float | None
        total: int | float | None

    class EventModel(BaseModel):
        kind: ProbeKind
        probe: str
        offset: int
        line: str
        phase: Phase | None = None
        failure: FailureKind | None = None
        fields: dict[str, Any] = {}
        traceback: str | None = None
        fingerprint: str | None = None

    class ReplayReport(BaseModel):
        outcome: Outcome
        last_phase: Phase | None
        failure: FailureSummary | None
        progress: list[ProgressSummary]
        events: list[EventModel]
        events_omitted: int = 0
        recovered: FailureSummary | None = None

    def summary(failure: _replay.FailureSummary | None) -> FailureSummary | None:
        return None if failure is None else FailureSummary(kind=failure.kind, line=failure.line,
                                                           fingerprint=failure.fingerprint)

    model = ReplayReport(
        outcome=report.outcome, last_phase=report.last_phase, failure=summary(report.failure),
        progress=[ProgressSummary(probe=p.probe, bar=p.bar, process=p.process, done=p.done, total=p.total)
                  for p in report.progress],
        events=[EventModel.model_construct(kind=e.kind, probe=e.probe, offset=e.offset, line=e.line, phase=e.phase,
                                           failure=e.failure, fields=e.fields, traceback=e.traceback,
                                           fingerprint=e.fingerprint) for e in report.events],
        events_omitted=report.events_omitted, recovered=summary(report.recovered))
    if complete:
        return model.model_dump_json()
    left_out = {name for name, unsaid in (("events_omitted", not report.events_omitted),
                                          ("recovered", report.recovered is None)) if unsaid}
    return model.model_dump_json(indent=2, exclude=left_out or None)


def test_the_report_s_json_is_byte_for_byte_what_pydantic_wrote() -> None:
    """The JSON is written by hand (``_reportjson``: `supervise probe` imports no pydantic); every corpus log's
    report, and one made of values where a plain ``json.dumps`` differs, are pydantic's bytes."""
    from probe_golden import corpus_logs

    from supervisor.core.events import ProbeKind

    checked = 0
    for path in corpus_logs():
        report = replay_file(path)
        assert report.to_json() == _as_pydantic(report), path
        assert json.loads(report.model_dump_json()) == json.loads(_as_pydantic(report, complete=True)), path
        checked += len(report.events)
    assert checked > 1000
    odd: dict[str, object] = {
        "tiny": 1.234e-5, "tinier": 1e-7, "edge": 1e-4, "neg": -2.5e-6, "huge": 1.5e16, "int_float": 3.0,
        "neg_zero": -0.0, "inf": float("inf"), "nan": float("nan"), "minus_inf": float("-inf"), "big_int": 10**20,
        "flag": True, "off": False, "none": None, "control": "a\x00b\x1f\x7f\t\n\r\x08\x0c", "quote": 'say "hi" \\ /',
        "unicode": "é ✓ \u2028 \U0001f600", "nested": {"list": [1, 2.5e-9, "x"], "empty": {}, "none": []},
    }
    events = [_replay.EventModel(ProbeKind.METRIC, "p", 7, "line \x01 \"q\"", Phase.WEIGHT_LOADING, None, odd),
              _replay.EventModel(ProbeKind.FAILURE, "f", 9, "boom", None, FailureKind.CUDA_OOM, {}, "tb\n  x", "ab12")]
    report = _replay.ReplayReport(
        outcome=Outcome.OOM, last_phase=None, failure=_replay.FailureSummary(FailureKind.CUDA_OOM, "boom", None),
        progress=[_replay.ProgressSummary("bar", "b", "", 1.5e-5, 10), _replay.ProgressSummary("bar", "c", "r1", None, None)],
        events=events, events_omitted=3, recovered=_replay.FailureSummary(FailureKind.RUNTIME_ERROR, "x", "f"))
    assert report.to_json() == _as_pydantic(report)
    assert json.loads(report.model_dump_json()) == json.loads(_as_pydantic(report, complete=True))
    assert json.loads(report.to_json())["events"][0]["fields"]["tiny"] == 1.234e-5


def test_floats_are_written_as_pydantic_writes_them() -> None:
    """Every exponent, and random bit patterns: the shortest digits, in pydantic's exponent form."""
    import math
    import random
    import struct

    import pydantic_core

    from supervisor.probes._reportjson import number

    rng = random.Random(56)
    values = [m * 10.0 ** e for m in (1, 1.5, 1.2345, 9.99, -3.25) for e in range(-320, 308)]
    values += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(20_000)]
    values += [rng.random() * 10 ** rng.randint(-12, 25) for _ in range(20_000)]
    for value in values:
        expected = "null" if not math.isfinite(value) else pydantic_core.to_json(value).decode()
        assert number(value) == expected, repr(value)


def test_supervise_probe_imports_no_pydantic(tmp_path: Path) -> None:
    """Nor the package metadata scan pydantic's plugin loader makes (a third of its start-up), once its packs
    are kept."""
    import os
    import subprocess
    import sys

    log = tmp_path / "one.log"
    log.write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory.\n")
    code = ("import runpy, sys\n"
            f"sys.argv = ['supervise', 'probe', '--json', {str(log)!r}]\n"
            "try:\n    runpy.run_module('supervisor.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core', 'email')"
            " or m == 'importlib.metadata'), file=sys.stderr)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    first, again = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
                    for _ in range(2))
    # The first start validates the packs (pydantic, `_packdef`) and keeps them (`_packcache`); a start after reads them.
    assert '"outcome": "oom"' in first.stdout and first.stdout == again.stdout, first.stderr
    assert again.stderr.strip().splitlines()[-1] == "[]", again.stderr


def test_probe_output_cut_short_by_its_reader_is_not_a_log_it_cannot_read(tmp_path: Path) -> None:
    # `supervise probe --json LOG | head`: the pipe closes while the report is printed.  Today's
    # main said "cannot read LOG: Broken pipe" and exited 66, as if the log were missing.
    import subprocess
    import sys

    log = tmp_path / "server.log"
    log.write_text("".join(f'INFO:     127.0.0.1:{5000 + i % 999} - "POST /v1/completions HTTP/1.1" 200 OK\n'
                           for i in range(30_000)), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "probe", "--json", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(64).startswith(b"{")
    proc.stdout.close()  # the reader goes away with most of the report unread
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "cannot read" not in err and "Traceback" not in err, err
