"""The offline replay skips the lines no probe can read without splitting them (``_quiet``),
and that changes nothing it reports.

- On every corpus log, and on random logs mixing quiet lines with events, bars redrawn with
  ``\\r``, lines a prefix alone lends its fields to, tracebacks whose code lines no probe
  matches, ANSI colours, NUL runs, CRLF endings, bytes that are not UTF-8 and over-long lines,
  read in chunks of many sizes: the same report, JSON and text, as splitting every line.
- A quiet line is never made a record (on today's main every line was).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from probe_golden import corpus_logs, packs
from probe_helpers import count_replay_splits

from supervisor.probes import ProbeEngine, _replay
from supervisor.probes._quiet import MAX_TAIL
from supervisor.probes._replay import replay_file


def _report(path: Path, skip: bool) -> tuple[str, str]:
    report = replay_file(path, skip_quiet=skip)
    return report.to_json(), report.render_text()


@pytest.mark.parametrize("path", corpus_logs(), ids=lambda p: p.name)
def test_skipping_quiet_lines_changes_nothing_on_corpus_logs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (Read whole, with the default chunk, tests/test_probes_golden.py holds the report to the
    # snapshot made before lines were skipped.)
    whole = _report(path, False)
    monkeypatch.setattr(_replay, "_CHUNK", 1013)  # chunks end mid-line, mid-traceback, mid-bar
    assert _report(path, True) == whole


# ---- random logs ----------------------------------------------------------------------

_QUIET = ["2026-12-04 12:00:01 worker 3 wrote block 17 of 40", "    x = model(batch)", "", "   ",
          "some words with no event in them", "{'epoch': 1}", "INFO 12-04 12:00:00 [core.py:1] nothing of note"]
_EVENTS = ["Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
           "INFO 12-04 12:00:00 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000",
           " iteration       12/     500 | consumed samples:          384 | lm loss: 1.234E+00 |",
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "step 7 loss 0.25",
           'INFO:     127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK', "Killed"]
_PREFIXES = ["(VllmWorker rank=0 pid=79) ", "[rank1]: ", "[default0]:"]


def _random_log(rng: random.Random, quiet: float) -> bytes:
    """A log where a share ``quiet`` of the lines is quiet."""
    out: list[bytes] = []
    for _ in range(rng.randint(50, 400)):
        if rng.random() < quiet:
            out.append(rng.choice(_QUIET).encode() + b"\n")
            continue
        pick = 0.45 + 0.55 * rng.random()
        end = b"\r\n" if rng.random() < 0.1 else b"\n"
        if pick < 0.45:
            out.append(rng.choice(_QUIET).encode() + end)
        elif pick < 0.6:
            out.append(rng.choice(_EVENTS).encode() + end)
        elif pick < 0.65:  # a prefix alone, lending its fields to the next line
            out.append(rng.choice(_PREFIXES).encode().rstrip() + b"\n" + rng.choice(_EVENTS + _QUIET).encode() + end)
        elif pick < 0.72:  # a bar redrawn with \r, then the line goes on
            total = rng.choice([3, 40])
            draws = [f"Map: {100 * d // total:3d}%|{'#' * (d * 10 // total):<10}| {d}/{total} [00:01<00:01]"
                     for d in range(0, total + 1, rng.choice([1, 7]))]
            out.append("\r".join(draws).encode() + (b"\r" if rng.random() < 0.5 else b"") + end)
        elif pick < 0.8:  # a traceback: its code lines match nothing
            prefix = rng.choice(["", *_PREFIXES]).encode()
            out += [prefix + b"Traceback (most recent call last):\n", prefix + b'  File "train.py", line 3, in <module>\n',
                    prefix + b"    main()\n", *(prefix + rng.choice(_QUIET).encode() + b"\n" for _ in range(rng.randint(0, 3))),
                    prefix + b"RuntimeError: CUDA error: an illegal memory access was encountered\n"]
        elif pick < 0.84:  # colours, around a line or inside what a probe matches
            line = rng.choice(_EVENTS + _QUIET).encode()
            cut = rng.randint(0, len(line))
            out.append(b"\x1b[32mINFO\x1b[0m " + line + end if rng.random() < 0.5 else
                       line[:cut] + b"\x1b[1m" + line[cut:] + b"\x1b[0m" + end)
        elif pick < 0.88:  # a hole of NULs (a truncated log written on)
            out.append(b"\x00" * rng.randint(1, 40) + rng.choice(_EVENTS + _QUIET).encode() + end)
        elif pick < 0.91:  # not UTF-8
            out.append(b"bad \xff\xfe bytes " + rng.choice(_EVENTS + _QUIET).encode() + end)
        elif pick < 0.93:  # long
            out.append(b"x" * rng.randint(2000, 9000) + rng.choice(_EVENTS + _QUIET).encode() + end)
        else:
            out.append(rng.choice(_EVENTS).encode() + b" " + rng.choice(_QUIET).encode() + end)
    data = b"".join(out)
    return data if rng.random() < 0.8 else data.rstrip(b"\n")  # sometimes no newline at the end


@pytest.mark.parametrize("seed", range(36))
def test_skipping_quiet_lines_changes_nothing_on_random_logs(seed: int, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    path = tmp_path / "random.log"
    path.write_bytes(_random_log(rng, quiet=(0.0, 0.9, 0.97)[seed % 3]))
    monkeypatch.setattr(_replay, "_CHUNK", rng.choice([97, 1000, 4096, 1 << 20]))
    plans = _count_plans(monkeypatch)
    assert _report(path, True) == _report(path, False)
    if seed % 3:
        assert plans, "a mostly quiet log is read by stretches"


def _count_plans(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The chunk plans the replay makes from now on (not None: read by stretches)."""
    made: list[object] = []
    real = ProbeEngine.plan_chunk

    def counting(self: ProbeEngine, data: bytes, base: int, final: bool) -> object:
        plan = real(self, data, base, final)
        if plan is not None:
            made.append(plan)
        return plan

    monkeypatch.setattr(ProbeEngine, "plan_chunk", counting)
    return made


# ---- what is skipped ------------------------------------------------------------------


def test_a_quiet_line_is_never_made_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20,000 lines no probe matches around two that do: only those two, the lines before them
    # and the log's last line are split into records.
    quiet = [f"2026-12-04 12:00:01 worker {n % 8} wrote block {n} of 20000" for n in range(20_000)]
    quiet[5_000] = "step 7 loss 0.25"
    quiet[15_000] = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    path = tmp_path / "quiet.log"
    path.write_text("\n".join(quiet) + "\n", encoding="utf-8")
    made = count_replay_splits(monkeypatch)
    report = replay_file(path)
    assert report.outcome.value == "oom"
    assert sum(made) <= 6, made


def test_a_line_between_quiet_ones_keeps_its_lent_prefix_and_its_colours(tmp_path: Path) -> None:
    # Among quiet lines (the chunk is read by stretches): a prefix alone on its line lends its
    # fields to the bar under it, and colour codes inside a line's match do not hide it.
    quiet = "".join(f"2026-12-04 12:00:01 worker {n % 8} wrote block {n}\n" for n in range(300))
    path = tmp_path / "lent.log"
    path.write_text(quiet + "(VllmWorker rank=3 pid=79) \n"
                    "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]\n" + quiet
                    + "step \x1b[1m7\x1b[0m loss 0.25\n" + quiet, encoding="utf-8")
    report = replay_file(path)
    assert _report(path, True) == _report(path, False)
    bar, step = [e for e in report.events if e.kind.value == "progress"]
    assert (bar.fields["rank"], bar.fields["pid"]) == (3, 79)
    assert step.fields["done"] == 7


def test_a_bar_redraw_held_over_a_chunks_end_is_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The coalescer holds a run's latest redraw until a record that is not one of the run comes;
    # when that record is in the next chunk, read by stretches, the held redraw comes out with the
    # next chunk's records, before the bytes that chunk's scan covered.  It was judged by that scan
    # and skipped: the bar's 12/13 was lost (found by tests/perf/fuzz_reading.py).  The chunk
    # before is read whole (most of its lines are events), so its redraws are split up to its end.
    busy = "".join(f"step {n} loss 0.5\n" for n in range(40))
    quiet = "".join(f"2026-12-04 12:00:01 worker {n % 8} wrote block {n}\n" for n in range(40))
    draws = [f"{100 * d // 13:3d}%|{'#' * (10 * d // 13):<10}| {d}/13 [00:01<00:02,  3.{d}it/s]" for d in range(14)]
    text = busy + "\r".join(draws) + "\r\n" + quiet
    path = tmp_path / "held.log"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(_replay, "_CHUNK", text.index(draws[-1]) + 3)  # the chunk ends inside 100%'s redraw
    plans = _count_plans(monkeypatch)
    assert _report(path, True) == _report(path, False)
    assert plans, "the chunk after the bar is read by stretches"


def _spans(text: bytes, final: bool = True) -> tuple[list[tuple[int, int]], int] | None:
    plan = ProbeEngine(packs()).plan_chunk(text, 0, final)
    return None if plan is None else (plan.spans, plan.stop)


def test_a_chunks_plan_takes_the_lines_the_engine_must_see() -> None:
    lines = [b"quiet one\n", b"(VllmWorker rank=0 pid=79)\n", b"step 7 loss 0.25\n", b"quiet two\n",
             b"quiet three\n", b"\x1b[0mquiet in colour\n", b"quiet four\n", b"a 1%\ra 2%\n", b"quiet five\n",
             b"crlf quiet\r\n", b"quiet six\n", b"\x00\x00quiet after a hole\n", b"quiet seven\n",
             *(b"more quiet %d\n" % n for n in range(200)), b"last\n"]
    text = b"".join(lines)
    starts = [sum(len(x) for x in lines[:k]) for k in range(len(lines) + 1)]
    plan = _spans(text)
    assert plan is not None
    spans, stop = plan
    assert stop == len(text)
    taken = {lines[k] for k in range(len(lines)) for a, b in spans if a <= starts[k] and starts[k + 1] <= b}
    # the hit with the prefix line before it; colour, a lone \r and a NUL with theirs; the last
    # line with its; never the CRLF line alone nor the others.
    assert taken == {b"(VllmWorker rank=0 pid=79)\n", b"step 7 loss 0.25\n", b"quiet three\n",
                     b"\x1b[0mquiet in colour\n", b"quiet four\n", b"a 1%\ra 2%\n", b"quiet six\n",
                     b"\x00\x00quiet after a hole\n", b"more quiet 199\n", b"last\n"}
    assert all(text[b - 1:b] == b"\n" for _, b in spans) and all(a == 0 or text[a - 1:a] == b"\n" for a, _ in spans)


def test_a_chunk_is_read_whole_where_a_plan_cannot_say() -> None:
    quiet = b"".join(b"quiet %d\n" % n for n in range(100))
    assert _spans(quiet + b"step 1 loss 0.5\nbad \xff byte\n") is None  # not UTF-8: Hyperscan cannot read it
    assert _spans(quiet + b"a 1%\r" * (MAX_TAIL // 4), final=False) is None  # a bar with no newline for long
    assert _spans(b"".join(b"step %d loss 0.5\n" % n for n in range(100))) is None  # most lines read anyway
    assert _spans(b"".join(b"Map %d\r%d\n" % (n, n) for n in range(100))) is None  # ... being redraws
    plan = _spans(quiet + b"step 1 loss", final=False)  # a short tail waits for its newline
    assert plan is not None and plan[1] == len(quiet)


def test_a_users_pack_with_patterns_hyperscan_refuses_reads_the_same(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # (?U) is RE2 syntax Hyperscan refuses, and a case-insensitive non-ASCII pattern is not given to
    # it: both are found by RE2's literal scan of the raw chunk, beside Hyperscan's, among quiet lines.
    pack = tmp_path / "odd.toml"
    pack.write_text("name = 'odd'\n" + "".join(
        f"[[probes]]\nid = 'p{i}'\nkind = 'info'\nregex = '{rx}'\n"
        for i, rx in enumerate([r"(?U)widget (?P<n>\d+) broke", r"(?i)straße (?P<m>\d+)", r"^gadget (?P<k>\d+)$"])))
    quiet = "".join(f"2026-12-04 12:00:01 worker {n % 8} wrote block {n}\n" for n in range(300))
    log = tmp_path / "odd.log"
    log.write_text(quiet + "x widget 12 broke\n" + quiet + "STRASSE 1\nSTRAßE 4\n" + quiet + "gadget 8\n" + quiet,
                   encoding="utf-8")
    plans = _count_plans(monkeypatch)
    skipped = replay_file(log, [], [pack], skip_quiet=True)
    assert plans, "read by stretches"
    assert skipped.to_json() == replay_file(log, [], [pack], skip_quiet=False).to_json()
    assert [(e.probe, e.fields) for e in skipped.events] == [("odd.p0", {"n": "12"}), ("odd.p1", {"m": "4"}),
                                                              ("odd.p2", {"k": "8"})]
