"""A bounded fuzz of the spec and probe pack loaders: mutated files, in process, seeded.

Whatever the bytes, loading either succeeds or raises SpecError / ProbePackError whose message
is one line of at most 300 characters besides the file's path: never another exception (no
traceback reaches a user, no 500 from the daemon).  What loads is then used the way the
daemon uses it (templates expanded, packs built into an engine and fed lines), which must not
raise anything else either.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.core.errors import ProbePackError, SpecError
from supervisor.core.events import Record
from supervisor.probes import ProbeEngine, load_packs
from supervisor.spec.model import load_spec

REPO = Path(__file__).resolve().parents[1]
SEED = 15
ROUNDS = 400

FULL_SPEC = """\
name = "full"
command = ["{python}", "{spec_dir}/train.py", "--out={out}", "--lr", "{lr}"]
workdir = "."
probes = ["python", "tqdm"]
stop_grace_s = 5
[params]
out = "{spec_dir}/runs"
lr = "0.1"
[env]
HF_TOKEN = "secret"
[restart]
max_attempts = 4
backoff_initial_s = 1.5
on = ["crashed", "oom"]
[health]
stall_k = 3.0
silence_s = 600
[health.phase_deadline_s]
weight_loading = 900
[gpu]
devices = [0, 1]
foreign_memory = "refuse"
"""

# Values that broke a loader once, or that sit on an edge.
TOKENS = [
    "inf", "-inf", "nan", "1e308", "-1", "0", "9223372036854775807", "true", "[]", "{}", '""',
    '"\\u0000"', '"x\\n"', '"A=B"', '"{v:>99999999}"', '"{v:%}"', '"{v!r}"', '"{"', '"}}"', '"{{}}"',
    '"{python}"', '"../../etc"', '"' + "x" * 5000 + '"', "[" * 300 + "]" * 300, "{a = " * 200 + "1" + "}" * 200,
    "'(.*){1,1000}$'", "'" + "(" * 400 + "a" + ")" * 400 + "'", "'(?=x)'", "'(?P<done>\\d+)'", "'[z-a]'",
    "'\\\\'", '"\\ud800"', "'''\n'''", '"\\t\\r"', "'" + "(?P<g>a)" * 3 + "'", "'a{1001}'",
]
SNIPPETS = ["\n[env]\n", "\n[[probes]]\n", "\nid = 'x'\n", "\nkind = 'failure'\n", "\n[health]\n", "=", "[", "]",
            "{", "}", "'", '"', "\\", "\n", "\x00", "\udcff", "# comment\n", "\n[params]\nv = '{v}'\n"]

LOG_LINES = ["Loading checkpoint shards: 50%|###| 2/4 [00:01<00:01, 2.0it/s]", "Traceback (most recent call last):",
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "(Worker pid=7) INFO 01-01 00:00:00 [x.py:1] ok",
             "NCCL WARN timeout", "step 3/10 loss=0.5", "", "\x1b[31merror\x1b[0m"]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(_MUTATIONS)(text, rng)
    return text


def _replace_value(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    candidates = [i for i, line in enumerate(lines) if "=" in line]
    if not candidates:
        return text
    i = rng.choice(candidates)
    key = lines[i].split("=", 1)[0]
    lines[i] = f"{key}= {rng.choice(TOKENS)}"
    return "\n".join(lines)


def _insert(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice(SNIPPETS + TOKENS) + text[at:]


def _delete(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text) + 1)
    return text[:at] + text[at + rng.randint(1, 40):]


def _duplicate_line(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    return "\n".join([*lines[:i + 1], lines[i], *lines[i + 1:]])


def _flip(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text)) if text else 0
    return text[:at] + chr(rng.choice([0, 7, 10, 13, 34, 39, 92, 123, 125, 0x2028, 0xFEFF, rng.randrange(32, 127)])) + text[at + 1:]


_MUTATIONS: list[Callable[[str, random.Random], str]] = [_replace_value, _replace_value, _insert, _delete,
                                                         _duplicate_line, _flip]


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


def _check_error(exc: Exception, path: Path, text: str) -> None:
    message = str(exc)
    rest = message.replace(f"{path}: ", "")
    assert "\n" not in message and len(rest) <= 300, f"{len(rest)} chars for input {text[:300]!r}: {message[:600]!r}"


def test_mutated_specs_load_or_fail_with_one_line(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    bases = [FULL_SPEC] + [p.read_text() for p in sorted((REPO / "jobs").glob("*.toml"))]
    path = tmp_path / "fuzz.toml"
    refused = 0
    for _ in range(ROUNDS):
        text = mutate(rng.choice(bases), rng)
        _write(path, text)
        try:
            spec = load_spec(path)
            spec.argv(1), spec.environment(1), spec.resolved_workdir(), spec.with_overrides({})
        except SpecError as exc:
            refused += 1
            _check_error(exc, path, text)
    assert 0.2 * ROUNDS < refused < ROUNDS  # the mutations reach both outcomes


@pytest.mark.parametrize("seed", [SEED, SEED + 1])
def test_mutated_packs_load_or_fail_with_one_line(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    bases = [p.read_text() for p in sorted((REPO / "probes").glob("*.toml"))]
    path = tmp_path / "fuzz.toml"
    records = [Record(line, i * 100, i * 100 + len(line) + 1) for i, line in enumerate(LOG_LINES)]
    refused = 0
    for _ in range(ROUNDS // 2):
        text = mutate(rng.choice(bases), rng)
        _write(path, text)
        try:
            engine = ProbeEngine(load_packs([], [path]))
        except ProbePackError as exc:
            refused += 1
            _check_error(exc, path, text)
            continue
        engine.feed_many(records)
        engine.flush()
    assert 0.2 * ROUNDS // 2 < refused < ROUNDS // 2
