"""``python tests/fakes/extract_on_fake_vllm.py ARGS``: ``eagle3.extract --backend vllm ARGS`` in a process of
its own, with the fake engine of fake_vllm.py in place of vLLM (which cannot run here).

Shards and relaunches are separate processes in production; tests that run them at once, or kill one, need
each in its own process too. ``FAKE_VLLM_GATE=PATH`` makes each ``generate`` hold its staged batch until PATH
exists (see ``FakeLLM.gate``); ``FAKE_VLLM_STEP_S=S`` gives each request S seconds of compute.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# FAKE_VLLM_JOBS: another jobs/ tree to run (a benchmark's baseline), this checkout's by default.
sys.path[:0] = [str(HERE.parent), os.environ.get("FAKE_VLLM_JOBS") or str(HERE.parents[1] / "jobs")]

from eagle3 import extract

from fakes.fake_vllm import make_api

if __name__ == "__main__":
    gate = os.environ.get("FAKE_VLLM_GATE")
    api = make_api(gate=Path(gate) if gate else None, step_s=float(os.environ.get("FAKE_VLLM_STEP_S") or 0))
    sys.exit(extract.main(["--backend", "vllm", *sys.argv[1:]], vllm_api=api))
