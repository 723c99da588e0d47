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


def test_listed_events_are_what_model_construct_makes() -> None:
    """``EventModel.of`` builds the model directly: the same model, fields set and JSON as
    pydantic's ``model_construct``, on every event of the corpus logs (failures, levels, fields)."""
    from probe_golden import corpus_logs

    from supervisor.core.records import split_records
    from supervisor.probes import ProbeEngine, load_packs

    engine = ProbeEngine(load_packs())
    checked = 0
    for path in corpus_logs():
        records, _ = split_records(path.read_bytes(), 0, final=True)
        for event in engine.feed_many(records) + engine.flush():
            made = _replay.EventModel.of(event)
            failure = event.failure
            fields = event.fields if failure is None or failure.level is None else {**event.fields,
                                                                                     "level": failure.level}
            expected = _replay.EventModel.model_construct(
                kind=event.kind, probe=event.probe, offset=event.offset, line=event.line, phase=event.phase,
                failure=None if failure is None else failure.kind, fields=fields,
                traceback=None if failure is None else failure.traceback,
                fingerprint=None if failure is None else failure.fingerprint)
            assert made == expected and made.model_fields_set == expected.model_fields_set
            assert made.model_dump_json() == expected.model_dump_json()
            checked += 1
        engine = ProbeEngine(load_packs())
    assert checked > 1000


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
