"""Failure fingerprints: stable across reruns of one bug, different across bugs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.probes import fingerprint, replay_file
from supervisor.probes._fingerprint import frame_id, normalize_message

CORPUS = Path(__file__).parent / "data" / "corpus"

OOM_RUN_1 = ("CUDA out of memory. Tried to allocate 1.44 GiB. GPU 1 has a total capacity of 10.75 GiB of which "
             "748.75 MiB is free. Process 1284971 has 10.01 GiB memory in use.")
OOM_RUN_2 = ("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of 79.10 GiB of which "
             "12.00 MiB is free. Process 99 has 79.01 GiB memory in use.")
FRAME_1 = 'File "/home/alice/venv/lib/python3.10/site-packages/torch/optim/adam.py", line 611, in _multi_tensor_adam'
FRAME_2 = 'File "/opt/envs/b/lib/python3.12/site-packages/torch/optim/adam.py", line 640, in _multi_tensor_adam'


def test_short_stable_hex() -> None:
    value = fingerprint("KeyError", "'lm_head.weight'", FRAME_1)
    assert re.fullmatch(r"[0-9a-f]{16}", value)
    assert value == fingerprint("KeyError", "'lm_head.weight'", FRAME_1)


@pytest.mark.parametrize(("first", "second"), [
    (("torch.OutOfMemoryError", OOM_RUN_1, FRAME_1), ("torch.cuda.OutOfMemoryError", OOM_RUN_2, FRAME_2)),
    (("RuntimeError", "The expanded size of the tensor (4) must match the existing size (3)", None),
     ("RuntimeError", "The expanded size of the tensor (8) must match the existing size (5)", None)),
    (("c10::DistBackendError", "[PG ID 1 PG GUID 1 Rank 0] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=1, OpType=BROADCAST, Timeout(ms)=600000) ran for 600081 milliseconds", None),
     ("c10::DistBackendError", "[PG ID 1 PG GUID 1 Rank 1] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=7, OpType=BROADCAST, Timeout(ms)=600000) ran for 600093 milliseconds", None)),
    (("OSError", "[Errno 28] No space left on device: '/data/run-2026-06-16T23:41:40/hs_00017.safetensors'", None),
     ("OSError", "[Errno 28] No space left on device: '/data/run-2026-06-17T08:02:11/hs_00123.safetensors'", None)),
    (("RuntimeError", "worker pid=4242 died at 0x7b99599e31b6 after 2026-06-16 23:42:12,076", None),
     ("RuntimeError", "worker pid=7 died at 0x7ca805fe31b6 after 2026-06-17 01:02:03,999", None)),
    (("ValueError", "request 1fda2fa2-10fd-4a48-8269-c20340e4a61f failed at 15:07:24", None),
     ("ValueError", "request 8c5a71ad-0000-4a48-8269-aaaaaaaaaaaa failed at 16:00:01", None)),
])
def test_reruns_of_one_bug_agree(first: tuple[str, str, str | None], second: tuple[str, str, str | None]) -> None:
    assert fingerprint(*first) == fingerprint(*second)


@pytest.mark.parametrize(("first", "second"), [
    (("KeyError", "'lm_head.weight'", None), ("KeyError", "'model.embed_tokens.weight'", None)),
    (("KeyError", "'lm_head.weight'", None), ("ValueError", "'lm_head.weight'", None)),
    (("RuntimeError", "shape mismatch", 'File "a.py", line 1, in load'),
     ("RuntimeError", "shape mismatch", 'File "a.py", line 1, in save')),
    (("RuntimeError", "shape mismatch", 'File "/x/a.py", line 1, in load'),
     ("RuntimeError", "shape mismatch", 'File "/x/b.py", line 1, in load')),
    (("torch.OutOfMemoryError", OOM_RUN_1, FRAME_1), ("RuntimeError", "CUDA error: out of memory", FRAME_1)),
])
def test_different_bugs_differ(first: tuple[str, str, str | None], second: tuple[str, str, str | None]) -> None:
    assert fingerprint(*first) != fingerprint(*second)


def test_normalization_and_frames() -> None:
    assert normalize_message("allocated 16 GiB on pid 12 at 0xdeadbeef") == "allocated <size> on pid=<n> at <hex>"
    assert frame_id(FRAME_1) == frame_id(FRAME_2) == "adam.py:_multi_tensor_adam"
    assert frame_id(None) == ""


def test_both_ranks_of_one_oom_share_a_fingerprint() -> None:
    report = replay_file(CORPUS / "full-logs" / "02-deepspeed-zero3-gpt2-train-oom.log")
    ooms = [e for e in report.events if e.probe == "python.traceback"]
    assert [e.fields["rank"] for e in ooms] == [1, 0]
    assert ooms[0].fingerprint == ooms[1].fingerprint == report.failure.fingerprint  # type: ignore[union-attr]
