"""The pure record splitter (terminators, redraws, over-long lines, decoding, chunking) and the
sans-IO RecordBuffer both followers feed."""

from __future__ import annotations

import random

import pytest

from supervisor.core.events import Record
from supervisor.core.records import MAX_RECORD_BYTES, RecordBuffer, _split_general, split_records


def texts(records: list[Record]) -> list[str]:
    return [r.text for r in records]


def split_in_chunks(data: bytes, sizes: list[int], base: int = 0) -> list[Record]:
    """Feed ``data`` in chunks of the given sizes the way a follower does, then finish."""
    out: list[Record] = []
    pending = b""
    offset = base
    pos = 0
    for size in sizes:
        pending += data[pos : pos + size]
        pos += size
        records, used = split_records(pending, offset)
        out += records
        pending = pending[used:]
        offset += used
    pending += data[pos:]
    records, used = split_records(pending, offset, final=True)
    assert used == len(pending)
    return out + records


def assert_contiguous(records: list[Record], start: int, stop: int) -> None:
    position = start
    for record in records:
        assert record.offset == position
        assert record.end > record.offset
        position = record.end
    assert position == stop


def test_newlines_and_partial_line() -> None:
    records, used = split_records(b"one\ntwo\nthr", 100)
    assert texts(records) == ["one", "two"]
    assert used == 8
    assert [(r.offset, r.end) for r in records] == [(100, 104), (104, 108)]
    assert not any(r.redraw or r.cut for r in records)


def test_final_emits_partial_line() -> None:
    records, used = split_records(b"one\nthr", 0, final=True)
    assert texts(records) == ["one", "thr"]
    assert used == 7
    assert records[1] == Record("thr", 4, 7)


def test_crlf_is_one_newline() -> None:
    records, used = split_records(b"a\r\nb\r\n", 0)
    assert texts(records) == ["a", "b"]
    assert [r.redraw for r in records] == [False, False]
    assert used == 6


def test_lone_cr_is_a_redraw() -> None:
    data = b"\r 10%|#\r 50%|#####\r100%|##########\n"
    records, used = split_records(data, 0)
    assert texts(records) == ["", " 10%|#", " 50%|#####", "100%|##########"]
    assert [r.redraw for r in records] == [True, True, True, False]
    assert used == len(data)


def test_trailing_cr_waits_unless_final() -> None:
    records, used = split_records(b"50%\r", 0)
    assert records == [] and used == 0
    records, used = split_records(b"50%\r", 0, final=True)
    assert records == [Record("50%", 0, 4, redraw=True)]
    assert used == 4


def test_crlf_split_across_calls_is_not_a_redraw() -> None:
    assert split_in_chunks(b"a\r\nb\n", [2, 1]) == split_records(b"a\r\nb\n", 0)[0]
    records = split_in_chunks(b"a\r\nb\n", [2, 1])
    assert [r.redraw for r in records] == [False, False]


def test_invalid_utf8_and_nul() -> None:
    records, _ = split_records(b"bad \xff\xfe here\nnul\x00byte\n", 0)
    assert texts(records) == ["bad \ufffd\ufffd here", "nul", "byte"]  # a NUL run is a boundary
    assert records[-1].end == len(b"bad \xff\xfe here\nnul\x00byte\n")


def test_a_nul_hole_left_by_a_truncation_starts_the_next_line_as_a_record() -> None:
    # `cmd > log`, then the log truncated under it: the writer goes on at its old offset, and the
    # gap reads back as NULs right before the next traceback.
    data = b"ValueError: first\n" + b"\x00" * 5000 + b"Traceback (most recent call last):\nKeyError: 'b'\n"
    records, used = split_records(data, 0)
    assert texts(records) == ["ValueError: first", "Traceback (most recent call last):", "KeyError: 'b'"]
    assert records[1].offset == len(b"ValueError: first\n")  # the hole belongs to the line after it
    assert used == len(data)


def test_nul_runs_split_the_same_in_any_chunking_and_lose_no_byte() -> None:
    import random

    rng = random.Random(7)
    alphabet = [b"a", b"b", b"\n", b"\r", b"\x00", b"\x00\x00\x00", b"Trace", b"\r\n"]
    for _ in range(2000):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        whole, _ = split_records(data, 0, final=True)
        expected = [(r.text, r.offset, r.end, r.redraw) for r in whole]
        pos = 0
        for r in whole:  # every byte in exactly one record, no NUL in any text
            assert r.offset == pos and "\x00" not in r.text, (data, expected)
            pos = r.end
        assert pos == len(data)
        for most in (1, 3, 8):
            buf, got, i = RecordBuffer(), [], 0
            while i < len(data):
                k = rng.randint(1, most)
                got += buf.feed(data[i:i + k])
                i += k
            got += buf.flush()
            assert [(r.text, r.offset, r.end, r.redraw) for r in got] == expected, data


def test_a_hole_of_hundreds_of_megabytes_is_never_held_in_memory() -> None:
    buf = RecordBuffer()
    chunk = b"\x00" * (1 << 20)
    got = buf.feed(b"x\n")
    for _ in range(64):
        got += buf.feed(chunk)
    got += buf.feed(b"Traceback (most recent call last):\n")
    assert buf.peak <= 3 * (1 << 20)
    assert [r.text for r in got if r.text] == ["x", "Traceback (most recent call last):"]
    assert got[-1].end == 2 + 64 * (1 << 20) + len(b"Traceback (most recent call last):\n")


def test_line_of_exactly_max_is_not_cut() -> None:
    data = b"x" * MAX_RECORD_BYTES + b"\n"
    records, used = split_records(data, 0)
    assert len(records) == 1 and not records[0].cut
    assert used == len(data)


def test_long_line_is_cut_and_reassembles() -> None:
    data = b"y" * (2 * MAX_RECORD_BYTES + 10) + b"\nnext\n"
    records, used = split_records(data, 0)
    assert [len(r.text) for r in records] == [MAX_RECORD_BYTES, MAX_RECORD_BYTES, 10, 4]
    assert [r.cut for r in records] == [True, True, False, False]
    assert "".join(texts(records[:3])) == "y" * (2 * MAX_RECORD_BYTES + 10)
    assert_contiguous(records, 0, used)


def test_long_partial_line_is_cut_without_final() -> None:
    records, used = split_records(b"z" * (MAX_RECORD_BYTES + 5), 0)
    assert len(records) == 1 and records[0].cut
    assert used == MAX_RECORD_BYTES


def test_cut_does_not_split_a_utf8_character() -> None:
    # "€" is three bytes; put one across the cut position.
    prefix = b"a" * (MAX_RECORD_BYTES - 1)
    data = prefix + "€tail\n".encode()
    records, _ = split_records(data, 0)
    assert records[0].cut and records[0].text == "a" * (MAX_RECORD_BYTES - 1)
    assert records[1].text == "€tail"
    assert "\ufffd" not in "".join(texts(records))


def test_result_does_not_depend_on_chunking() -> None:
    rng = random.Random(7)
    alphabet = [b"a", b"b", b"\n", b"\r", b"\r\n", b"\xff", b"\x00", "é".encode(), "€".encode()]
    data = b"".join(rng.choice(alphabet) for _ in range(5000))
    whole = split_records(data, 1000, final=True)[0]
    assert_contiguous(whole, 1000, 1000 + len(data))
    for _ in range(50):
        sizes = [rng.randint(0, 40) for _ in range(300)]
        assert split_in_chunks(data, sizes, base=1000) == whole


def test_long_lines_do_not_depend_on_chunking() -> None:
    data = ("€" * MAX_RECORD_BYTES).encode() + b"\r\n"  # 3 MiB: no cut falls on a boundary
    whole = split_records(data, 0, final=True)[0]
    chunked = split_in_chunks(data, [MAX_RECORD_BYTES // 3] * 12)
    assert chunked == whole
    assert [r.cut for r in whole] == [True, True, True, False]
    assert "".join(texts(whole)) == "€" * MAX_RECORD_BYTES


def test_a_bar_redrawn_for_hours_is_split_as_the_careful_splitter_splits_it() -> None:
    # tqdm writing to a file: a \r before every redraw, a newline only at the end: one "line" of
    # megabytes made of short records.  The bulk path must give what the record-by-record one does
    # (which today's main used for it), whatever the chunking; a piece over the limit is still cut.
    rng = random.Random(11)
    draws = [f"Training: {i * 100 // 60_000:3d}%|###  | {i}/60000 [01:02<03:04, 5.00it/s]".encode()
             for i in range(60_000)]
    data = b"".join(b"\r" + d for d in draws) + b"\n" + b"done\n"
    assert len(data) > MAX_RECORD_BYTES
    whole, used = split_records(data, 7, final=True)
    assert whole == _split_general(data, 7, True)[0] and used == len(data)
    assert sum(r.redraw for r in whole) == 60_000 and not any(r.cut for r in whole)
    assert split_in_chunks(data, [rng.randint(1 << 16, 1 << 21) for _ in range(8)], base=7) == whole
    over = b"\r" + b"w" * (MAX_RECORD_BYTES + 3) + b"\rshort\n"
    assert split_records(over, 0)[0] == _split_general(over, 0, False)[0]
    assert [r.cut for r in split_records(over, 0)[0]] == [False, True, False, False]


def test_a_bar_redrawn_for_hours_is_not_read_record_by_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # Today's main took the slow, record-by-record splitter for any newline-free stretch over
    # MAX_RECORD_BYTES, though every record in it was short.
    from supervisor.core import records as records_module

    def refuse(*_args: object) -> None:
        raise AssertionError("a line of short redraws went to the record-by-record splitter")

    monkeypatch.setattr(records_module, "_split_general", refuse)
    data = b"".join(b"\rStep %d/90000" % i for i in range(90_000))
    records, used = split_records(data, 0)
    # an empty record before the first \r, then every redraw but the last, which waits for its end
    assert len(records) == 90_000 and records[0].text == "" and records[-1].text == "Step 89998/90000"
    assert used == len(data) - len(b"Step 89999/90000")


def test_empty_input() -> None:
    assert split_records(b"", 5) == ([], 0)
    assert split_records(b"", 5, final=True) == ([], 0)


# -- RecordBuffer ------------------------------------------------------------------------------


def feed_in_pieces(data: bytes, cuts: list[int], base: int = 0) -> list[Record]:
    """Feed ``data`` to one RecordBuffer split at the positions ``cuts``, then flush; checks the
    buffer's positions after every feed."""
    buffer = RecordBuffer(base)
    out: list[Record] = []
    fed = 0
    for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
        out += buffer.feed(data[start:stop])
        fed = stop
        assert buffer.end == base + fed
        assert buffer.offset == (out[-1].end if out else base)
        assert buffer.buffered == buffer.end - buffer.offset
    out += buffer.flush()
    assert buffer.offset == buffer.end == base + len(data) and buffer.buffered == 0
    return out


def test_buffer_holds_the_partial_tail() -> None:
    buffer = RecordBuffer(100)
    assert buffer.feed(b"one\ntw") == [Record("one", 100, 104)]
    assert (buffer.offset, buffer.end, buffer.buffered) == (104, 106, 2)
    assert buffer.partial_text() == "tw"
    assert buffer.feed(b"o") == []
    assert buffer.feed(b"\nthree") == [Record("two", 104, 108)]
    assert buffer.partial_text() == "three"
    assert buffer.partial_text(limit=2) == "th"


def test_buffer_carriage_returns_are_redraws_and_crlf_is_one_newline() -> None:
    buffer = RecordBuffer()
    assert buffer.feed(b"10%\r50%\r") == [Record("10%", 0, 4, redraw=True)]
    assert buffer.partial_text() == "50%"  # the latest redraw, its \r held: it may be half of \r\n
    assert buffer.buffered == 4
    assert buffer.feed(b"\n") == [Record("50%", 4, 9)]  # \r\n: a plain line, not a redraw
    buffer.feed(b"90%\r")
    # The next byte is not \n: the held \r was a redraw, returned now, not at the next line.
    assert buffer.feed(b"d") == [Record("90%", 9, 13, redraw=True)]
    assert buffer.partial_text() == "d"
    assert buffer.feed(b"one\n") == [Record("done", 13, 18)]


def test_buffer_cuts_an_over_long_line_and_keeps_the_rest() -> None:
    buffer = RecordBuffer()
    records = buffer.feed(b"z" * (MAX_RECORD_BYTES + 5))
    assert len(records) == 1 and records[0].cut and len(records[0].text) == MAX_RECORD_BYTES
    assert buffer.buffered == 5 and buffer.partial_text() == "zzzzz"
    assert buffer.peak == MAX_RECORD_BYTES + 5
    assert buffer.flush() == [Record("zzzzz", MAX_RECORD_BYTES, MAX_RECORD_BYTES + 5)]


def test_buffer_flush_emits_the_tail_once() -> None:
    buffer = RecordBuffer(10)
    assert buffer.flush() == []
    buffer.feed(b"a\nlast")
    assert buffer.flush() == [Record("last", 12, 16)]
    assert buffer.flush() == []
    assert (buffer.offset, buffer.partial_text()) == (16, "")
    buffer.feed(b"50%\r")
    assert buffer.flush() == [Record("50%", 16, 20, redraw=True)]  # at the end a lone \r is a redraw


def test_buffer_reset_reads_the_held_bytes_again() -> None:
    # What the SSH follower does after a dropped channel: drop the held bytes, re-read them.
    buffer = RecordBuffer()
    buffer.feed(b"one\npart")
    buffer.reset(buffer.offset)
    assert (buffer.offset, buffer.buffered) == (4, 0)
    assert buffer.feed(b"partial\n") == [Record("partial", 4, 12)]
    buffer.reset(0)  # a truncated file: everything from the start again
    assert buffer.feed(b"new\n") == [Record("new", 0, 4)]


def test_buffer_result_does_not_depend_on_where_the_bytes_are_split() -> None:
    rng = random.Random(20240614)
    alphabet = [b"a", b"b", b"\n", b"\r", b"\r\n", b"\xff", b"\x00", "é".encode(), "€".encode()]
    data = b"".join(rng.choice(alphabet) for _ in range(4000))
    # One over-long line (cut, with a three-byte character across the cut) in the middle.
    data = data[:2000] + b"x" * (MAX_RECORD_BYTES - 1) + "€".encode() * 4 + data[2000:]
    whole = feed_in_pieces(data, [], base=7)
    assert whole == split_records(data, 7, final=True)[0]
    assert any(r.cut for r in whole) and any(r.redraw for r in whole)
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 60)))
        assert feed_in_pieces(data, cuts, base=7) == whole
    # Byte by byte through the first part: every \r\n split in two.
    head = data[:1500]
    assert feed_in_pieces(head, list(range(1, len(head)))) == split_records(head, 0, final=True)[0]
