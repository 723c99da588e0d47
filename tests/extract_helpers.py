"""Shared helpers of the tests of the EAGLE-3 extraction job (jobs/eagle3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"
PROMPTS = JOBS / "data" / "prompts.jsonl"
if str(JOBS) not in sys.path:
    sys.path.insert(0, str(JOBS))

from eagle3.tiny_model import TinySpec, build


def ended_pid() -> int:
    """The pid of a process that has ended, as a killed writer's temporaries carry (a start-up removes only
    those whose writer is gone)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=60)
    return p.pid

# A really tiny model for tests: 4 layers, hidden 64, about 0.4 MB in 5 shards.
TEST_SPEC = TinySpec(num_layers=4, hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1,
                     vocab_size=512, max_position_embeddings=512, max_shard_size="100KB")


def build_test_model(base: Path) -> Path:
    """Build (once: the build is idempotent) the tiny test model under ``base``."""
    return build(base / "tiny-test-model", TEST_SPEC, PROMPTS, quiet=True)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_FAULT_")}
    env["PYTHONPATH"] = str(JOBS)
    env["PYTHONUNBUFFERED"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


def run_cli(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """Run ``python -m eagle3.extract ARGS`` in a subprocess (the job's real entry point)."""
    return subprocess.run([sys.executable, "-m", "eagle3.extract", *args], cwd=REPO, env=cli_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def run_main(capsys, args: list[str], **kw) -> tuple[int, str]:
    """Run the job's ``main`` in this process; (exit code, stdout)."""
    from eagle3 import extract

    rc = extract.main([str(a) for a in args], **kw)
    return rc, capsys.readouterr().out


def output_files(out: Path) -> dict[str, bytes]:
    """Every output file of an extraction (hidden states, token_freq, prepared data, manifest)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())
            if p.is_file() and not p.name.startswith(".")}


def reference_run(base: Path, model: Path, n: int, batch_size: int) -> dict[str, bytes]:
    """The output of an uninterrupted run (made once per session and kept under ``base``)."""
    import json

    out = base / f"extract-reference-{n}-{batch_size}"
    try:
        done = json.loads((out / "manifest.json").read_text())["status"] == "complete"
    except (OSError, ValueError, KeyError):
        done = False
    if not done:
        # Made once for many tests: a generous bound (it took over 60 s on 2 cores at load average 11).
        r = run_cli(["--model", str(model), "--out", str(out), "--max-samples", str(n),
                     "--batch-size", str(batch_size)], timeout=300)
        assert r.returncode == 0, r.stdout
    return output_files(out)
