"""Random SIGKILLs of the shards of a vLLM-backend extraction, and their relaunches: is every sample there
once, byte for byte what one uninterrupted launch writes?

    PYTHONPATH=jobs python tests/perf/bench_shard_kills.py [--seeds 0-4] [--samples 96] [--shards 3]
                                                           [--baseline-jobs DIR]

Each shard is a process of its own (tests/fakes/extract_on_fake_vllm.py: the job on the fake of vLLM 0.23's
engine, engine-side request ids unique per process, each request ``--step-s`` seconds, its file staged until
the batch returns). All shards start at once; a launch is SIGKILLed (its process group), with probability
``--kill-p``, at a random moment 0.2..``--max-kill-s`` s after it started (start-up, staging, placing
files, writing manifests alike), and relaunched 0..0.5 s after it died, as a supervisor would; a launch
that dies by itself (not killed) is relaunched too and counted. When every shard has exited 0, ``gather``
runs, and the output is compared with one uninterrupted unsharded launch: every ``hs_{i}`` byte for byte,
the gathered manifest, token counts and prepared data too. Counted from the launches' logs: requests that
failed (a staged file gone), launches that died by themselves.

``--baseline-jobs DIR`` runs the same schedule with another jobs/ tree (e.g. ``git archive 486a804 jobs``).
Prints one markdown row per seed.

``--daemon``: the shards run under a real supervise daemon instead (one job, ``shards = N``, its ``gather``
step, relaunches by its ``[restart]`` policy), and the random actions are of two kinds: SIGKILL of a running
shard's process group (the pid from the daemon's status), and SIGKILL of the daemon itself, restarted 0..1 s
later, which re-adopts the shards that ran on meanwhile. Actions come every 0.3..``--max-kill-s`` s until
``--max-kills`` of them; the run ends when the job is done (its gather included), and the output is compared
with the lone run as above. Relaunches are the daemon's: counted from its attempts. ``--kill-while-down P``:
with chance P, a daemon's SIGKILL is followed by one of a running shard (the pid from the last status) before
the restart, so the restarted daemon finds an attempt that ended unwatched (0, the default, draws nothing and
keeps the schedule of runs made without it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "fakes" / "extract_on_fake_vllm.py"
BATCH = 4


def target(where: Path, n: int) -> tuple[Path, Path]:
    """A config-only target (the fake engine reads no weights) and n token-id prompts of 20..80 tokens."""
    d = where / "target"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
        "hidden_size": 128, "vocab_size": 1000, "max_position_embeddings": 512}))
    prompts = where / "tokens.jsonl"
    rng = random.Random(1234)
    prompts.write_text("".join(json.dumps({"token_ids": [rng.randrange(3, 990) for _ in range(rng.randrange(20, 80))]})
                               + "\n" for _ in range(n)))
    return d, prompts


def env(jobs: Path | None, step_s: float) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_FAULT_", "FAKE_VLLM_"))}
    e.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
              "FAKE_VLLM_STEP_S": str(step_s)})
    if jobs is not None:
        e["FAKE_VLLM_JOBS"] = str(jobs)
    return e


def args_of(model: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--prompts", str(prompts), "--out", str(out), "--batch-size", str(BATCH),
            "--file-timeout", "1", *extra]


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith(".")}


@dataclass
class Outcome:
    seed: int
    launches: int = 0
    kills: int = 0
    self_deaths: int = 0
    self_death_tails: list[str] = field(default_factory=list)  # the last lines of each launch that died on its own
    failed_requests: int = 0
    seconds: float = 0.0
    identical: bool = False
    problems: list[str] = field(default_factory=list)


def run(seed: int, model: Path, prompts: Path, n: int, shards: int, reference: dict[str, bytes], base: Path,
        jobs: Path | None, step_s: float, kill_p: float, max_kill_s: float, max_kills: int) -> Outcome:
    rng = random.Random(seed)
    out = base / f"out-{seed}"
    logs = base / f"logs-{seed}"
    logs.mkdir(parents=True)
    res = Outcome(seed)
    running: dict[int, tuple[subprocess.Popen[bytes], float | None]] = {}
    waiting: dict[int, float] = {k: 0.0 for k in range(shards)}  # shard -> when to (re)launch
    done: set[int] = set()
    launch_of: dict[int, int] = {}  # shard -> the number of its latest launch (its log's name)
    scheduled = 0  # kills drawn (a launch may end before its kill comes)
    t0 = time.monotonic()
    deadline = t0 + 900
    while len(done) < shards:
        now = time.monotonic()
        if now > deadline:
            res.problems.append("did not finish in 900 s")
            break
        for k, at in list(waiting.items()):
            if now >= at:
                del waiting[k]
                launch_of[k] = res.launches
                log = (logs / f"shard{k}-{res.launches}.log").open("wb")
                p = subprocess.Popen([sys.executable, str(RUNNER), *args_of(model, prompts, out, "--shard", str(k),
                                                                          "--num-shards", str(shards))],
                                     cwd=REPO, env=env(jobs, step_s), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
                log.close()
                res.launches += 1
                kill_at = None
                if scheduled < max_kills and rng.random() < kill_p:
                    kill_at, scheduled = now + rng.uniform(0.2, max_kill_s), scheduled + 1
                running[k] = (p, kill_at)
        for k, (p, kill_at) in list(running.items()):
            rc = p.poll()
            if rc is None and kill_at is not None and now >= kill_at:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                res.kills += 1
                del running[k]
                waiting[k] = now + rng.uniform(0.0, 0.5)
            elif rc is not None:
                del running[k]
                if rc == 0:
                    done.add(k)
                else:
                    res.self_deaths += 1
                    tail = (logs / f"shard{k}-{launch_of[k]}.log").read_text(errors="replace")[-600:]
                    res.self_death_tails.append(f"shard {k} exit {rc}: {tail}")
                    waiting[k] = now + rng.uniform(0.0, 0.5)
        time.sleep(0.02)
    for p, _ in running.values():
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    res.seconds = time.monotonic() - t0
    for log in logs.iterdir():
        res.failed_requests += sum(" failed: " in x for x in log.read_text(errors="replace").splitlines())
    g = subprocess.run([sys.executable, "-m", "eagle3.extract", "gather", "--out", str(out)], cwd=REPO,
                       env={**env(None, 0), "PYTHONPATH": str(jobs or REPO / "jobs")}, capture_output=True, text=True)
    if g.returncode != 0:
        res.problems.append(f"gather: {g.stdout.strip()[-200:]}")
    got = {k: v for k, v in files(out).items() if ".shard-" not in k}
    hs = {k for k in got if k.startswith("hs_")}
    if len(hs) != n:
        res.problems.append(f"{len(hs)} of {n} samples")
    res.identical = got == reference
    if not res.identical:
        res.problems.append(f"{sum(got.get(k) != v for k, v in reference.items())} files differ from the lone run")
    left = [p for p in (out / ".staging").rglob("*") if p.is_file()] if (out / ".staging").exists() else []
    if left:
        res.problems.append(f"{len(left)} staged files left")
    return res


SPEC = """\
name = "shardkills"
workdir = "{repo}"
command = ["{{python}}", "{runner}", "--model", "{model}", "--prompts", "{prompts}", "--out", "{out}",
           "--batch-size", "{batch}", "--file-timeout", "1", "--shard", "{{shard}}", "--num-shards", "{{num_shards}}"]
gather = ["{{python}}", "-m", "eagle3.extract", "gather", "--out", "{out}"]
shards = {shards}
stop_grace_s = 2
[env]
PYTHONPATH = "{repo}/jobs"
PYTHONUNBUFFERED = "1"
HF_HUB_OFFLINE = "1"
OMP_NUM_THREADS = "1"
FAKE_VLLM_STEP_S = "{step_s}"
[restart]
max_attempts = 40
backoff_initial_s = 0.1
backoff_max_s = 0.5
backoff_jitter_s = 0
"""


@dataclass
class DaemonOutcome:
    seed: int
    shard_kills: int = 0
    shard_kills_down: int = 0  # of shard_kills: while no daemon ran
    daemon_restarts: int = 0
    launches: int = 0
    failed_requests: int = 0
    samples_checked: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def run_daemon(seed: int, model: Path, prompts: Path, n: int, shards: int, reference: dict[str, bytes],
               step_s: float, max_kill_s: float, max_kills: int, kill_while_down: float = 0.0) -> DaemonOutcome:
    """One run under a real daemon, with random shard SIGKILLs and daemon SIGKILL + restarts (see the module)."""
    import shutil

    sys.path.insert(0, str(REPO))
    from supervisor.cli.client import Client
    from supervisor.core.config import Paths
    from supervisor.core.events import JobState

    rng = random.Random(seed)
    home = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))  # short: a Unix socket path lies under it
    out = home / "out"
    spec = home / "shardkills.toml"
    spec.write_text(SPEC.format(repo=REPO, runner=RUNNER, model=model, prompts=prompts, out=out, batch=BATCH,
                                shards=shards, step_s=step_s))
    denv = {**os.environ, "SUPERVISE_HOME": str(home), "PYTHONPATH": str(REPO)}
    res = DaemonOutcome(seed)
    paths = Paths(home)
    logs: list[Path] = []

    def start_daemon() -> subprocess.Popen[bytes]:
        log = (home / "daemon.log").open("ab")
        d = subprocess.Popen([sys.executable, "-m", "supervisor.daemon.process"], env=denv, stdout=log,
                             stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            c = Client(paths, timeout_s=30)
            try:
                if c.accepting() and c.ping() is not None:
                    return d
            except Exception:  # noqa: BLE001 - not up yet
                pass
            finally:
                c.close()
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not come up in 30 s")
            time.sleep(0.1)

    daemon = start_daemon()
    client = Client(paths, timeout_s=30)
    t0 = time.monotonic()
    client.start(str(spec), {})
    actions, next_at, state = 0, t0 + rng.uniform(0.3, max_kill_s), None
    try:
        while time.monotonic() - t0 < 900:
            st = client.status("shardkills").jobs[0]
            state = st.state
            if state in (JobState.DONE, JobState.FAILED, JobState.STOPPED, JobState.CANCELLED):
                break
            now = time.monotonic()
            if actions < max_kills and now >= next_at:
                actions += 1
                next_at = now + rng.uniform(0.3, max_kill_s)
                live = [sh.attempt.pid for sh in (st.shards.shards if st.shards else [])
                        if sh.shard >= 0 and sh.attempt is not None and sh.attempt.pid and sh.attempt.ended is None]
                if rng.random() < 0.35:  # the daemon: SIGKILL, then a restart that re-adopts the shards
                    client.close()
                    daemon.send_signal(signal.SIGKILL)
                    daemon.wait()
                    if kill_while_down > 0 and rng.random() < kill_while_down and live:
                        try:  # a shard that ends unwatched: the restarted daemon must judge and relaunch it
                            os.killpg(rng.choice(live), signal.SIGKILL)
                            res.shard_kills += 1
                            res.shard_kills_down += 1
                        except ProcessLookupError:
                            pass
                    time.sleep(rng.uniform(0.0, 1.0))
                    daemon = start_daemon()
                    client = Client(paths, timeout_s=30)
                    res.daemon_restarts += 1
                else:
                    if live:
                        try:
                            os.killpg(rng.choice(live), signal.SIGKILL)
                            res.shard_kills += 1
                        except ProcessLookupError:  # it ended just now
                            pass
            time.sleep(0.05)
        res.seconds = time.monotonic() - t0
        if state is not JobState.DONE:
            res.problems.append(f"job {state} after {res.seconds:.0f} s")
        attempts = [a for a in client.attempts("shardkills").attempts if a.shard is not None and a.shard >= 0]
        res.launches = len(attempts)
        logs = [Path(a.log_path) for a in attempts if Path(a.log_path).is_file()]
    finally:
        client.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    res.failed_requests = sum(" failed: " in x for p in logs for x in p.read_text(errors="replace").splitlines())
    got = {k: v for k, v in files(out).items() if ".shard-" not in k} if out.is_dir() else {}
    hs = {k for k in got if k.startswith("hs_")}
    res.samples_checked = sum(got.get(k) == v for k, v in reference.items() if k.startswith("hs_"))
    if len(hs) != n:
        res.problems.append(f"{len(hs)} of {n} samples")
    if got != reference:
        res.problems.append(f"{sum(got.get(k) != v for k, v in reference.items())} files differ from the lone run")
    if not res.problems:
        shutil.rmtree(home, ignore_errors=True)
    else:
        res.problems.append(f"kept in {home}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-4", help="A-B or a comma list")
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--step-s", type=float, default=0.05, help="each request's compute time in the fake engine")
    ap.add_argument("--kill-p", type=float, default=0.7, help="chance that a launch is killed")
    ap.add_argument("--max-kill-s", type=float, default=6.0)
    ap.add_argument("--max-kills", type=int, default=8, help="kills per run at most (then it runs to its end)")
    ap.add_argument("--baseline-jobs", type=Path, help="a jobs/ tree to run instead of this checkout's")
    ap.add_argument("--daemon", action="store_true",
                    help="run the shards under a real supervise daemon; SIGKILL shards and the daemon at random")
    ap.add_argument("--kill-while-down", type=float, default=0.0,
                    help="--daemon: chance that a daemon's SIGKILL is followed by a shard's before the restart")
    a = ap.parse_args()
    seeds = (list(range(int(a.seeds.split("-")[0]), int(a.seeds.split("-")[1]) + 1)) if "-" in a.seeds
             else [int(x) for x in a.seeds.split(",")])
    base = Path(tempfile.mkdtemp(prefix="bench-shard-kills-"))
    model, prompts = target(base, a.samples)
    lone = base / "lone"
    r = subprocess.run([sys.executable, str(RUNNER), *args_of(model, prompts, lone)], cwd=REPO, env=env(None, 0),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    reference = files(lone)
    if a.daemon:
        print(f"under a daemon; {a.samples} samples, {a.shards} shards, batch {BATCH}, step {a.step_s} s a request, "
              f"an action every 0.3..{a.max_kill_s} s, {a.max_kills} a run (SIGKILL of a shard 0.65, of the daemon "
              f"then a restart 0.35; a shard's SIGKILL while the daemon is down {a.kill_while_down})")
        print("| seed | shard SIGKILLs | of them while no daemon ran | daemon SIGKILLs + restarts | shard launches | "
              "failed requests | seconds | samples byte-identical | every sample once, identical |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        bad = 0
        for seed in seeds:
            d = run_daemon(seed, model, prompts, a.samples, a.shards, reference, a.step_s, a.max_kill_s, a.max_kills,
                           a.kill_while_down)
            bad += bool(d.problems)
            print(f"| {seed} | {d.shard_kills} | {d.shard_kills_down} | {d.daemon_restarts} | {d.launches} | {d.failed_requests} | "
                  f"{d.seconds:.1f} | {d.samples_checked}/{a.samples} | "
                  f"{'yes' if not d.problems else '; '.join(d.problems)} |", flush=True)
        return 1 if bad else 0
    print(f"jobs: {a.baseline_jobs or 'this checkout'}; {a.samples} samples, {a.shards} shards, batch {BATCH}, "
          f"step {a.step_s} s a request, kill chance {a.kill_p} at 0.2..{a.max_kill_s} s, at most {a.max_kills}")
    print("| seed | launches | SIGKILLs | died by themselves | failed requests | seconds | every sample, identical |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    bad = 0
    for seed in seeds:
        o = run(seed, model, prompts, a.samples, a.shards, reference, base, a.baseline_jobs, a.step_s, a.kill_p,
                a.max_kill_s, a.max_kills)
        bad += bool(o.problems)
        print(f"| {seed} | {o.launches} | {o.kills} | {o.self_deaths} | {o.failed_requests} | {o.seconds:.1f} | "
              f"{'yes' if not o.problems else '; '.join(o.problems)} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
