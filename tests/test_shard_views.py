"""A sharded job's status shows each watched shard's next verdict and bar exactly as a plain job's
status shows its own: one wire shape, taken from the runner's snapshot as it is (a shard's stall
bound once lost where it came from on the way)."""

from __future__ import annotations

import time

from supervisor.core import protocol
from supervisor.core.events import AttemptState, JobState, Verdict
from supervisor.core.progress import BarProgress
from supervisor.jobs.shard_views import shards_status
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.jobs.views import attempt_info
from supervisor.store.database import AttemptRow


def _row(shard: int, n: int) -> AttemptRow:
    return AttemptRow(job="ext", n=n, tag="t", host="local", argv=["python"], workdir="/", log_path="/l",
                      status_path="/s", pid=100 + n, pgid=100 + n, start_time=None, started=time.time(), ended=None,
                      state=AttemptState.RUNNING, exit_code=None, exit_signal=None, log_offset=0, phase=None,
                      progress=None, verdict=None, reason=None, failure=None, fingerprint=None, action=None,
                      shard=shard)


def test_a_shards_next_verdict_keeps_where_its_bound_came_from() -> None:
    upcoming = protocol.NextVerdict(verdict=Verdict.STALLED, in_s=42.0, reason="no progress for 10m",
                                    bound_s=600.0, bound_source="history (12 intervals from 2 runs)")
    bar = BarProgress("tqdm", 3, 64, 20.0, 1220.0, "Loading safetensors shards")
    shard0 = RunnerSnapshot(job="ext", attempt=1, shard=0, next_verdict=upcoming, progress=bar, progress_still_s=20.0)
    job = RunnerSnapshot(job="ext", attempt=None, shards=(shard0,))

    status = shards_status(2, JobState.RUNNING, [_row(0, 1), _row(1, 2)], job, attempt_info)

    first = status.shards[0]
    assert first.next_verdict == upcoming
    assert first.next_verdict is not None and first.next_verdict.bound_source == "history (12 intervals from 2 runs)"
    assert first.attempt is not None and first.attempt.progress == protocol.ProgressInfo(
        probe="tqdm", bar="Loading safetensors shards", done=3, total=64, rate_s_per_it=20.0, eta_s=1200.0,
        still_s=20.0)  # its ETA counted down from its last step, 20 s ago
    # The other shard's runner says nothing: no verdict is invented for it.
    assert status.shards[1].next_verdict is None
