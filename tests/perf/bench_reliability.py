"""Reliability: a daemon killed, frozen and fed hostile input while it supervises busy jobs.

    .venv/bin/python tests/perf/bench_reliability.py [--kills 30] [--stops 5] [--tree PATH] [--quick]

``--tree`` runs the daemon from another checkout of the project (``git worktree add /tmp/before
COMMIT``): the same benchmark, before and after a change.  The benchmark speaks to the daemon
only through its HTTP socket and reads what it stored from SQLite (the ``events`` table), so
it works with older trees too.  Four parts, each on its own daemon:

1. Crash consistency: two busy jobs (tests/perf/_writer.py, a transformers shard bar every
   10th line) while the daemon is SIGKILLed and restarted ``--kills`` times, then SIGSTOPped
   for 1.5 s and continued ``--stops`` times.  Each bar step written must be stored once:
   events lost (a step never stored) and doubled (a step stored twice).  A freeze is a ping
   unanswered for 5 s while the daemon is neither killed nor stopped.
2. Bad specs and packs: the bounded fuzz's mutations (tests/test_fuzz_inputs.py, seeded) sent
   to ``POST /v1/jobs``: refused with a one-line 4xx, answered 5xx (a traceback behind it),
   not answered (a freeze), or launched although invalid (the current loader refuses it).
3. Hostile logs: two jobs writing tests/test_fuzz_daemon_e2e.py's byte streams (invalid
   UTF-8, NULs, megabyte lines, CR storms, truncations) while pinged every 50 ms: the slowest
   ping, freezes, and whether the progress stored is a subset, in order, of what was written.
4. Escapes: a job whose grandchild clears its environment, calls setsid and is re-parented to
   init; after ``stop``, is it still alive?

Tracebacks: "Traceback" lines in the daemon's own log, over all four parts.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

PERF = Path(__file__).resolve().parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(PERF.parent))

import httpx
import psutil
from _harness import PY, ROOT, WRITER, Daemon, machine_note, table, wait_until
from test_fuzz_daemon_e2e import LOG_FUZZ_JOB
from test_fuzz_inputs import FULL_SPEC, SEED, mutate

from supervisor.core import protocol
from supervisor.core.errors import ProbePackError, SpecError
from supervisor.daemon.api._handlers import load_checked_spec

FREEZE_S = 5.0


class TreeDaemon(Daemon):
    """The harness's daemon, run from ``tree``: `python -m` puts its working directory first on
    sys.path, so the tree is where it must start."""

    tree = ROOT

    def start(self) -> None:
        self._log = open(self.home / "daemon.out", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([PY, "-m", "supervisor.daemon.process"], env=self.env, cwd=str(self.tree),
                                     stdout=self._log, stderr=self._log, start_new_session=True)
        api = Api(self)
        wait_until(lambda: self.paths.socket.exists() and api.ping(), 20, "the daemon to answer")


class Api:
    """Raw HTTP over the daemon's socket: no client classes, so any tree's daemon answers."""

    def __init__(self, daemon: Daemon, timeout: float = FREEZE_S) -> None:
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.paths.socket)),
                                 base_url="http://supervise", timeout=timeout)

    def ping(self) -> bool:
        try:
            return self.http.get("/v1/ping").status_code == 200
        except httpx.HTTPError:
            return False

    def post(self, path: str, body: dict[str, object], timeout: float = FREEZE_S) -> httpx.Response | None:
        try:
            return self.http.post(path, content=json.dumps(body), timeout=timeout)
        except httpx.HTTPError:
            return None

    def state(self, job: str) -> str:
        try:
            return self.http.get("/v1/status", params={"job": job}).json()["jobs"][0]["state"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return "?"


def _restart(daemon: TreeDaemon) -> None:
    daemon._log.close()
    daemon.start()


def _tracebacks(daemon: Daemon) -> int:
    return (daemon.home / "daemon.out").read_text(errors="replace").count("Traceback")


def _progress(daemon: Daemon, job: str) -> list[int]:
    db = sqlite3.connect(f"file:{daemon.paths.db}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT data_json FROM events WHERE job=? AND kind='progress' ORDER BY id", (job,)).fetchall()
    finally:
        db.close()
    return [int(json.loads(data)["done"]) for (data,) in rows]


# -- 1. SIGKILL and SIGSTOP rounds ---------------------------------------------------------

def crash_rounds(env: dict[str, str], kills: int, stops: int, rng: random.Random) -> dict[str, int]:
    lines, every = 16_000, 10
    with TreeDaemon(env=env) as daemon:
        api = Api(daemon)
        names = ["busy1", "busy2"]
        for name in names:
            spec = daemon.spec(name, [PY, str(WRITER), "--rate", "200", "--lines", str(lines), "--event-every",
                                      str(every), "--linger"], probes=["transformers"])
            response = api.post("/v1/jobs", {"spec_path": str(spec)}, timeout=60)
            assert response is not None and response.status_code == 200, response and response.text
        freezes = 0
        for _ in range(kills):
            time.sleep(rng.uniform(0.3, 1.2))
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait()
            _restart(daemon)
        for _ in range(stops):
            time.sleep(rng.uniform(0.3, 1.2))
            daemon.proc.send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            daemon.proc.send_signal(signal.SIGCONT)
            freezes += not api.ping()
        bars = lines // every
        try:  # the writers end after lines/rate seconds; the daemon then catches up
            wait_until(lambda: all(len(set(_progress(daemon, n))) >= bars for n in names), 120, "the bars")
        except SystemExit:
            pass
        lost = doubled = 0
        for name in names:
            done = _progress(daemon, name)
            lost += len(set(range(1, bars + 1)) - set(done))
            doubled += len(done) - len(set(done))
        freezes += not api.ping()
        return {"kills": kills, "stops": stops, "steps": 2 * bars, "lost": lost, "doubled": doubled,
                "freezes": freezes, "tracebacks": _tracebacks(daemon)}


# -- 2. mutated specs and packs ------------------------------------------------------------

def _invalid(path: Path) -> bool:
    try:
        load_checked_spec(protocol.StartRequest(spec_path=str(path)))
    except (SpecError, ProbePackError):
        return True
    return False


def bad_inputs(env: dict[str, str], n_specs: int, n_packs: int, rng: random.Random) -> dict[str, int]:
    counts = {"specs": 0, "packs": 0, "refused": 0, "5xx": 0, "unanswered": 0, "launched": 0, "multiline": 0}
    with TreeDaemon(env=env) as daemon:
        api = Api(daemon)
        fuzz = daemon.home / "fuzz"
        fuzz.mkdir()
        bases = [FULL_SPEC] + [p.read_text() for p in sorted((ROOT / "jobs").glob("*.toml"))]
        packs = [p.read_text() for p in sorted((ROOT / "probes").glob("*.toml"))]
        paths = []
        for i in range(n_specs):
            path = fuzz / f"s{i}.toml"
            path.write_bytes(mutate(rng.choice(bases), rng).encode("utf-8", "surrogatepass"))
            paths.append(("specs", path))
        for i in range(n_packs):
            pack = fuzz / f"p{i}.toml"
            pack.write_bytes(mutate(rng.choice(packs), rng).encode("utf-8", "surrogatepass"))
            path = fuzz / f"ps{i}.toml"
            path.write_text(f'name = "p{i}"\ncommand = ["true"]\nprobes = []\nprobe_files = ["{pack}"]\n')
            paths.append(("packs", path))
        for kind, path in paths:
            if not _invalid(path):
                continue
            counts[kind] += 1
            response = api.post("/v1/jobs", {"spec_path": str(path)}, timeout=30)
            if response is None:
                counts["unanswered"] += 1
                wait_until(api.ping, 120, "the daemon to answer again")
            elif response.status_code >= 500:
                counts["5xx"] += 1
            elif response.status_code == 200:
                counts["launched"] += 1
            else:
                counts["refused"] += 1
                counts["multiline"] += "\n" in response.json().get("error", "")
        counts["tracebacks"] = _tracebacks(daemon)
        counts["alive"] = int(api.ping())
    return counts


# -- 3. hostile logs -----------------------------------------------------------------------

def hostile_logs(env: dict[str, str], steps: int) -> dict[str, float]:
    with TreeDaemon(env=env) as daemon:
        api = Api(daemon)
        names = []
        for seed in (SEED, SEED + 1):
            script = daemon.home / "specs" / "logfuzz.py"
            script.parent.mkdir(exist_ok=True)
            script.write_text(LOG_FUZZ_JOB)
            name = f"bytes{seed}"
            spec = daemon.spec(name, [PY, str(script), str(seed), str(steps)], probes=["tqdm", "transformers"],
                               extra="[restart]\nmax_attempts = 1\n")
            response = api.post("/v1/jobs", {"spec_path": str(spec)}, timeout=60)
            assert response is not None and response.status_code == 200, response and response.text
            names.append(name)
        slowest, freezes, pings = 0.0, 0, 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(api.state(n) in ("done", "failed") for n in names):
            started = time.monotonic()
            freezes += not api.ping()
            slowest = max(slowest, time.monotonic() - started)
            pings += 1
            time.sleep(0.05)
        disordered = 0
        for name in names:
            done = _progress(daemon, name)
            ok = done == sorted(set(done)) and set(done) <= set(range(1, steps + 1)) and done and done[-1] == steps
            disordered += not ok
        return {"streams": len(names), "steps": steps * len(names), "pings": pings, "slowest_ping_s": round(slowest, 2),
                "freezes": freezes, "disordered": disordered, "tracebacks": _tracebacks(daemon)}


# -- 4. escapes ----------------------------------------------------------------------------

VANISHER = """\
import os, sys, time
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        os.execve("/bin/sh", ["sh", "-c", f"echo $$ > {sys.argv[1]}.tmp && mv {sys.argv[1]}.tmp {sys.argv[1]} && exec sleep 300"], {})
    os._exit(0)
print("parent waiting", flush=True)
while True:
    time.sleep(1)
"""


def escapes(env: dict[str, str]) -> dict[str, int]:
    with TreeDaemon(env=env) as daemon:
        api = Api(daemon)
        script = daemon.home / "specs" / "vanisher.py"
        script.parent.mkdir(exist_ok=True)
        script.write_text(VANISHER)
        pid_file = daemon.home / "vanished.pid"
        spec = daemon.spec("vanisher", [PY, str(script), str(pid_file)], probes=["python"])
        response = api.post("/v1/jobs", {"spec_path": str(spec)}, timeout=60)
        assert response is not None and response.status_code == 200, response and response.text
        pid = int(str(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 20, "the vanisher")))
        stop = api.post("/v1/jobs/vanisher/stop", {"grace_s": 1.0}, timeout=60)
        time.sleep(0.5)
        try:
            proc = psutil.Process(pid)
            escaped = int(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
            proc.kill()
        except psutil.Error:
            escaped = 0
        stop_ok = int(stop is not None and stop.status_code == 200)
        return {"escaped": escaped, "stop_claimed_success": stop_ok, "tracebacks": _tracebacks(daemon)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--stops", type=int, default=5)
    parser.add_argument("--specs", type=int, default=150)
    parser.add_argument("--packs", type=int, default=60)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose daemon runs")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.kills, args.stops, args.specs, args.packs = 5, 2, 40, 20
    env = {"PYTHONPATH": str(args.tree.resolve())}
    TreeDaemon.tree = args.tree.resolve()
    rng = random.Random(SEED)
    results = {
        "crash": crash_rounds(env, args.kills, args.stops, rng),
        "inputs": bad_inputs(env, args.specs, args.packs, rng),
        "logs": hostile_logs(env, args.steps),
        "escapes": escapes(env),
    }
    print(machine_note())
    print(f"daemon tree: {args.tree}\n")
    for part, figures in results.items():
        print(f"### {part}\n")
        print(table(["figure", "value"], [(k, v) for k, v in figures.items()]))
        print()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
