"""The engine's shortcuts change nothing it reports.

- The literal prefilter (one RE2 scan of a batch, only lines with a hit looked at) gives the
  same events as reading every line, on random lines and on every corpus log's lines.
- The offline fold of a bar's run of lines (``_barfold``) gives the same report, JSON and
  text (every event counted), as the engine reading every line of the run: on every corpus
  log, and on random logs of bars that restart, share a description, switch process, and
  meet tracebacks, prefixes and failures.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from probe_golden import corpus_logs, event_json, packs
from probe_helpers import count_replay_splits

from supervisor.core.events import Record
from supervisor.core.records import RecordBuffer, split_records
from supervisor.probes import ProbeEngine
from supervisor.probes._barfold import RedrawCoalescer, middle_redraws
from supervisor.probes._replay import build_report, replay_file


def _events(data: bytes, *, prefilter: bool, chunk: int = 997) -> str:
    """Every event, as JSON (a NaN loss compares equal so)."""
    engine = ProbeEngine(packs(), prefilter=prefilter)
    buffer = RecordBuffer()
    events = []
    for pos in range(0, len(data), chunk):
        events += engine.feed_many(buffer.feed(data[pos:pos + chunk]))
    events += engine.feed_many(buffer.flush()) + engine.flush()
    return json.dumps([event_json(e) for e in events], sort_keys=True)


def _unfolded_report(path: Path) -> tuple[str, str]:
    """The report the way it was read before the fold: every line of a run through the engine."""
    records, _ = split_records(path.read_bytes(), 0, final=True)
    bars = RedrawCoalescer()
    engine = ProbeEngine(packs())
    events = engine.feed_many(bars.feed(records) + bars.flush()) + engine.flush()
    report = build_report(events)
    return report.to_json(), report.render_text()


def _folded_report(path: Path) -> tuple[str, str]:
    report = replay_file(path)
    return report.to_json(), report.render_text()


# ---- random logs ----------------------------------------------------------------------

_PREFIXES = ["", "", "", "[rank1]: ", "(VllmWorker rank=0 pid=79) ", "[default0]:"]
_FAILURES = ["RuntimeError: CUDA error: an illegal memory access was encountered",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
             "ERROR 05-01 12:00:00 engine.py:12] Engine core failed", "Killed"]


def _bar(rng: random.Random, desc: str, total: int) -> list[str]:
    out, done = [], 0
    while done <= total:
        pct = 100 * done // max(total, 1)
        out.append(f"{desc}: {pct:3d}%|{'#' * (pct // 10):<10}| {done}/{total} [00:01<00:02, {rng.random() * 99:.2f}it/s]")
        done += rng.choice([1, 1, 2, 5, 0])
        if rng.random() < 0.05:
            done = max(0, done - rng.randint(1, 5))  # a bar drawn again from further back: a new bar
    return out


def _random_log(rng: random.Random) -> str:
    lines: list[str] = []
    for _ in range(rng.randint(5, 25)):
        pick = rng.random()
        prefix = rng.choice(_PREFIXES)
        if pick < 0.3:
            bar = _bar(rng, rng.choice(["Map", "Loading checkpoint shards", "Processed prompts", "Training"]),
                       rng.choice([3, 10, 48, 100]))
            lines += [(prefix if rng.random() < 0.2 else "") + line for line in bar]
        elif pick < 0.5:
            start = rng.randint(0, 30)
            for step in range(start, start + rng.randint(1, 40), rng.choice([1, 5])):
                lines.append(f"step {step} loss {rng.random():.4f}" if rng.random() < 0.9 else f"step {step} loss nan")
        elif pick < 0.65:
            for it in range(rng.randint(1, 30), rng.randint(31, 60)):
                lines.append(f" iteration {it:8d}/     500 | consumed samples: {it * 32:9d} | lm loss: {rng.random():.6E}"
                             " | number of skipped iterations:   0 | number of nan iterations:   0 |")
        elif pick < 0.75:
            lines += [prefix + "Traceback (most recent call last):", prefix + '  File "train.py", line 3, in <module>',
                      prefix + "    main()", prefix + rng.choice(_FAILURES)]
        elif pick < 0.85:
            lines.append(prefix + rng.choice(_FAILURES))
        else:
            lines += [prefix + rng.choice(["INFO starting", "", "  ", "Saving model checkpoint to /ckpt",
                                           "[INFO|trainer.py:4309] Saving", "{'loss': 0.5, 'epoch': 1.0}"])]
    return "\n".join(lines) + ("\n" if rng.random() < 0.8 else "")


@pytest.mark.parametrize("seed", range(12))
def test_fold_and_prefilter_change_nothing_on_random_logs(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    path = tmp_path / "random.log"
    path.write_text(_random_log(rng), encoding="utf-8")
    assert _folded_report(path) == _unfolded_report(path)
    data = path.read_bytes()
    assert _events(data, prefilter=True) == _events(data, prefilter=False)


def test_fold_keeps_every_count_where_bars_of_one_name_interleave(tmp_path: Path) -> None:
    # Which of two bars of the same probe a count continues depends on every count before it:
    # folding 10 and 15 away would make 20 continue the first bar, not the second.
    lines = [f"step {n} loss 0.5" for n in (5, 10, 15, 20, 25, 30, 5, 10, 15, 20, 40, 45, 3, 4)]
    path = tmp_path / "steps.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folded, unfolded = _folded_report(path), _unfolded_report(path)
    assert folded == unfolded
    assert "events: 14 (14 progress)" in folded[1]  # every line counted, folded or not


@pytest.mark.parametrize("path", corpus_logs(), ids=lambda p: p.name)
def test_fold_and_prefilter_change_nothing_on_corpus_logs(path: Path) -> None:
    assert _folded_report(path) == _unfolded_report(path)
    data = path.read_bytes()
    assert _events(data, prefilter=True, chunk=4096) == _events(data, prefilter=False, chunk=4096)


def _coalesced_reference(records: list[Record]) -> list[Record]:
    """The coalescer's rule spelled out: of a run of redraws alike up to their first digit, the
    first and the last."""
    out: list[Record] = []
    key: str | None = None
    held: Record | None = None
    for record in records:
        this = re.match(r"[^\d]*", record.text).group() if record.redraw else None  # type: ignore[union-attr]
        if this is not None and this == key:
            held = record
            continue
        if held is not None:
            out.append(held)
            held = None
        key = this
        out.append(record)
    return out + ([held] if held is not None else [])


@pytest.mark.parametrize("seed", range(8))
def test_redraw_coalescer_keeps_a_runs_first_and_last(seed: int) -> None:
    # Texts from a small alphabet, Unicode digits among them ('٣' is one to \d, '²' is not):
    # runs that share a key, keys that are prefixes of each other, empty texts, digits first.
    rng = random.Random(seed)
    alphabet = ["a", "b", " ", "%", "1", "7", "٣", "²", "|"]
    records, pos = [], 0
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        records.append(Record(text, pos, pos + len(text) + 1, rng.random() < 0.8))
        pos += len(text) + 1
    coalescer = RedrawCoalescer()
    cut = rng.randint(0, len(records))
    got = coalescer.feed(records[:cut]) + coalescer.feed(records[cut:]) + coalescer.flush()
    assert got == _coalesced_reference(records)


def _coalesced_by_replay(data: bytes) -> list[Record]:
    """What the offline replay hands the engine: the middle redraws skipped unsplit
    (``middle_redraws``), the rest split and coalesced."""
    coalescer = RedrawCoalescer()
    out: list[Record] = []
    start = 0
    for skip_from, skip_to in middle_redraws(data):
        out += coalescer.feed(split_records(data[start:skip_from], start, True)[0])
        start = skip_to
    return out + coalescer.feed(split_records(data[start:], start, True)[0]) + coalescer.flush()


@pytest.mark.parametrize("seed", range(16))
def test_middle_redraws_skipped_unsplit_are_those_the_coalescer_drops(seed: int) -> None:
    # Redraw-heavy bytes in runs of one key, long and short: keys that share prefixes, digits first,
    # no digit at all, blank redraws, CRLF and LF endings, NUL holes, bytes over 0x7f and colour
    # codes inside the pieces; long enough that the sample at a chunk's start decides too.
    rng = random.Random(seed)
    keys = [b"Map: ", b"Map:  ", b"Training: ", b"", b"\x1b[1mMap: ", b"M\xc3\xa9p: "]
    pieces = []
    while sum(map(len, pieces)) < 300_000:
        key = rng.choice(keys)
        for _ in range(rng.choice([1, 2, 5, 40, 400])):
            pick = rng.random()
            body = (b"" if pick < 0.01 else key + b"/999" if pick < 0.015 else key + b"x" if pick < 0.02
                    else key + b"%d/999 [00:01]" % rng.randint(0, 999))
            end = rng.choices([b"\r", b"\n", b"\r\n", b"\x00\x00\r"], weights=[300, 2, 2, 1])[0]
            pieces.append(body + end)
    data = b"".join(pieces)
    assert middle_redraws(data), "the bytes hold runs worth skipping"
    plain = RedrawCoalescer()
    assert _coalesced_by_replay(data) == plain.feed(split_records(data, 0, True)[0]) + plain.flush()


def test_a_run_of_redraws_is_not_split_into_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tqdm written to a file: 50,000 redraws of one bar, then a crash.  The replay splits only the
    # run's first and last redraws (today's main made a record of each, for the coalescer to drop).
    path = tmp_path / "bar.log"
    path.write_bytes(b"".join(b"\rTraining:  %d%%|#####     | %d/50000 [01:02<03:04, 5.00it/s]" % (i // 500, i)
                              for i in range(1, 50_001))
                     + b"\nTraceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                       b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    made = count_replay_splits(monkeypatch)
    report = replay_file(path)
    assert report.outcome.value == "oom" and report.progress[0].done == 50_000
    assert sum(made) < 100, made
