"""The bounded fuzz, against a real daemon: mutated specs and packs sent to `start`, and mutated
log byte streams written by real jobs while the daemon follows them.  Seeded; well under a
minute.

Whatever arrives, the daemon answers every invalid spec or pack with one line and the exit
code 65 (the CLI too, with no traceback), stays alive and answering, never logs a traceback,
and keeps the events it had stored.  A job's log may hold any bytes (invalid UTF-8, NULs, a
megabyte without a newline, a storm of carriage returns, a truncation): the daemon keeps
answering pings promptly, and the progress it stores is a subset, in order, of what the job
wrote, ending with its last step.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import supervise
from test_fuzz_inputs import FULL_SPEC, REPO, SEED, mutate

from supervisor.cli.client import Client
from supervisor.core import protocol
from supervisor.core.errors import ProbePackError, SpecError
from supervisor.daemon.api._specs import load_checked_spec

API_SPECS = 150  # mutated specs sent with a client (the in-process fuzz tries 400 more)
API_PACKS = 60  # mutated packs, each named by an otherwise valid spec
CLI_SPECS = 5  # through `supervise start` itself: exit code, one line, no traceback
PROGRESS_STEPS = 30  # per log-fuzz job

QUICK_JOB = """\
for i in range(1, 5):
    print(f"Loading checkpoint shards: {25 * i}%|###| {i}/4 [00:00<00:01, 5.0it/s]", flush=True)
print("all good", flush=True)
"""


def _refused_locally(path: Path) -> bool:
    """Would the daemon refuse it?  The checks `start` makes, in process."""
    try:
        load_checked_spec(protocol.StartRequest(spec_path=str(path)))
    except (SpecError, ProbePackError):
        return True
    return False


def _write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


def _check_refusal(client: Client, path: Path, text: str) -> None:
    try:
        response = client.start(str(path), {})
    except (SpecError, ProbePackError) as exc:
        message = str(exc)
        assert exc.exit_code == 65, message
        assert "\n" not in message and len(message.replace(str(path), "")) <= 320, message[:600]
        return
    raise AssertionError(f"the daemon launched what the loader refuses: {response} for {text[:300]!r}")


def _stored_events(client: Client, job: str) -> list[tuple[int, str, str]]:
    return [(e.id, e.kind, e.message) for e in client.events(job).events]


def test_mutated_specs_and_packs_through_the_daemon(daemon: DaemonProcess, make_job, home: Path,
                                                    daemon_env: dict[str, str]) -> None:
    client = daemon.client()
    client.start(str(make_job("keeper", QUICK_JOB)), {})
    wait_until(lambda: client.status("keeper").jobs[0].state == "done")
    kept = _stored_events(client, "keeper")
    assert any(kind == "progress" for _, kind, _ in kept)

    rng = random.Random(SEED)
    fuzz = home / "fuzz"
    fuzz.mkdir()
    # Job specs only: a pipeline file (jobs/eagle3*.toml) is refused by the job-spec check below but started
    # by `start` as a pipeline, so a mutant of one that still loads as a pipeline is not a refusal.
    specs = [FULL_SPEC] + [text for p in sorted((REPO / "jobs").glob("*.toml"))
                           if "[pipeline]" not in (text := p.read_text())]
    packs = [p.read_text() for p in sorted((REPO / "probes").glob("*.toml"))]
    tried = refused = 0
    cli_paths: list[Path] = []
    for i in range(API_SPECS):
        path = fuzz / f"spec{i}.toml"
        text = mutate(rng.choice(specs), rng)
        _write(path, text)
        tried += 1
        if _refused_locally(path):
            refused += 1
            _check_refusal(client, path, text)
            if len(cli_paths) < CLI_SPECS:
                cli_paths.append(path)
    for i in range(API_PACKS):
        pack = fuzz / f"pack{i}.toml"
        text = mutate(rng.choice(packs), rng)
        _write(pack, text)
        path = fuzz / f"packspec{i}.toml"
        path.write_text(f'name = "p{i}"\ncommand = ["true"]\nprobes = []\nprobe_files = ["{pack}"]\n')
        tried += 1
        if _refused_locally(path):
            refused += 1
            _check_refusal(client, path, text)
    assert refused > 0.3 * tried  # the mutations reach the refusals (and some load)

    for path in cli_paths:  # what a person sees: one line, exit 65, no traceback
        result = supervise(daemon_env, "start", str(path), check=False)
        assert result.returncode == 65, result
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr

    assert client.ping() is not None
    assert _stored_events(client, "keeper") == kept  # nothing stored was lost or changed
    assert [j.name for j in client.status().jobs] == ["keeper"]  # nothing refused was stored as a job
    assert "Traceback" not in daemon.log_text()


# A job writing hostile bytes between progress steps; argv: seed, steps.  Its stdout is the log.
LOG_FUZZ_JOB = """\
import os, random, sys, time
rng = random.Random(int(sys.argv[1]))
steps = int(sys.argv[2])
out = sys.stdout.buffer

def huge():  # a megabyte without a newline, then one
    return b"y" * 1_000_000 + b"\\n"

CHUNKS = [
    lambda: bytes(rng.randrange(256) for _ in range(rng.randint(1, 4000))),  # random bytes
    lambda: b"\\xff\\xfe\\xc3\\x28\\xa0\\xa1\\xe2\\x28\\xa1\\xf0\\x28\\x8c\\xbc" * rng.randint(1, 200),  # invalid UTF-8
    lambda: b"\\x00" * rng.randint(1, 50_000),  # NULs
    huge,
    lambda: b"\\r" * rng.randint(1_000, 100_000),  # a CR storm
    lambda: b"\\rLoading checkpoint shards:  50%|#" * rng.randint(1, 2000),  # redraws that never end
    lambda: b"Traceback (most recent call last):\\n  File \\"x\\", line 1\\n" + bytes([rng.randrange(256)]) * 100,
    lambda: b"\\x1b[31m" * 1000 + "\\u2028\\ufeff".encode() * 100,
    None,  # a truncation: the log starts again from 0
]
for i in range(1, steps + 1):
    for _ in range(rng.randint(1, 2)):
        make = rng.choice(CHUNKS)
        out.flush()
        if make is None:
            os.ftruncate(1, 0)
        else:
            out.write(make())
    out.write(f"\\nLoading checkpoint shards: {100 * i // steps}%|###| {i}/{steps} [00:00<00:01, 5.0it/s]\\n".encode())
    out.flush()
    time.sleep(0.02)
time.sleep(0.3)  # the last step is read before the exit is
"""


class _Pinger(threading.Thread):
    """Pings the daemon in a loop while the jobs write; keeps the slowest answer."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.slowest = 0.0
        self.pings = 0
        self.failed: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            try:
                self.client.ping()
            except Exception as exc:  # noqa: BLE001 - recorded, asserted on by the test
                self.failed.append(repr(exc))
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.pings += 1
            time.sleep(0.05)


def test_mutated_log_streams_never_freeze_the_daemon_or_disorder_events(daemon: DaemonProcess, make_job) -> None:
    client = daemon.client()
    pinger = _Pinger(daemon.client())
    pinger.start()
    names = [f"bytes{seed}" for seed in (SEED, SEED + 1)]
    try:
        for seed, name in zip((SEED, SEED + 1), names, strict=True):
            spec = make_job(name, LOG_FUZZ_JOB, params=f', "{seed}", "{PROGRESS_STEPS}"',
                            extra="[restart]\nmax_attempts = 1\n")
            client.start(str(spec), {})
        wait_until(lambda: all(client.status(n).jobs[0].state in ("done", "failed") for n in names), timeout=45)
    finally:
        pinger.done.set()
        pinger.join(timeout=10)
    assert not pinger.failed and pinger.pings >= 3, pinger.failed[:3]
    # A frozen loop answers nothing for as long as matching takes (a costly pack froze it ~60 s per MB):
    # 10 s bounds that on a busy 2-core machine without timing the healthy case.
    assert pinger.slowest < 10.0, f"a ping took {pinger.slowest:.1f}s"
    for name in names:
        done = [int(e.data["done"]) for e in client.events(name).events if e.kind == "progress"]
        # A subset, in order, of the steps written (a truncation may take some before they are
        # read), each once, and the last one always.
        assert done == sorted(set(done)) and set(done) <= set(range(1, PROGRESS_STEPS + 1)), done
        assert done and done[-1] == PROGRESS_STEPS, done
    assert client.ping() is not None
    assert "Traceback" not in daemon.log_text()
