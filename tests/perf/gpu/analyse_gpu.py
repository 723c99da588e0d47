"""Read a supervise store after the GPU run and show, from NVML samples, what happened around each relaunch.

    analyse_gpu.py SUPERVISE_DB

For every relaunched attempt: when the previous attempt ended, when GPU memory came back to
its pre-launch baseline (NVML samples stored every 0.25 s), when the supervisor declared it
released, and when the next attempt launched.  A relaunch that started while memory was
still held would show a launch before the release.
"""

from __future__ import annotations

import json
import sqlite3
import sys


def main(db_path: str) -> int:
    db = sqlite3.connect(db_path)
    db.row_factory = sqlite3.Row
    samples = db.execute("SELECT ts, gpu, used_mib FROM gpu_samples WHERE host='local' ORDER BY ts").fetchall()
    print("| job | attempt | ended (s) | killed | GPU MiB at end | released (s after end) | next launch (s after end) | MiB just before next launch |")
    print("|---|---|---|---|---|---|---|---|")
    for job in [r[0] for r in db.execute("SELECT name FROM jobs ORDER BY name")]:
        attempts = db.execute("SELECT * FROM attempts WHERE job=? ORDER BY n", (job,)).fetchall()
        events = db.execute("SELECT * FROM events WHERE job=? AND kind IN ('action','launched','exited') ORDER BY id",
                            (job,)).fetchall()
        for prev, nxt in zip(attempts, [*attempts[1:], None], strict=True):
            exited = _first(events, prev["n"], "exited")
            end = exited["ts"] if exited else (prev["ended"] or 0)
            released = next((e for e in events if e["attempt"] == prev["n"] and e["kind"] == "action"
                             and e["message"].startswith("GPU memory")), None)
            killed = next((e for e in events if e["attempt"] == prev["n"] and e["kind"] == "action"
                           and e["message"].startswith("killed")), None)
            at_end = _used_at(samples, end)
            before_next = _used_at(samples, nxt["started"] - 0.01) if nxt else None
            print(f"| {job} | {prev['n']} | {end:.2f} | {_killed(killed)} | {at_end} | "
                  f"{_rel(released, end)} | {_rel_ts(nxt['started'] if nxt else None, end)} | {before_next} |")
    peak = max((s["used_mib"] for s in samples), default=0)
    print(f"\n{len(samples)} NVML samples stored (all GPUs); peak used {peak} MiB on one GPU; "
          f"first sample {_used_at(samples, samples[0]['ts']) if samples else '?'} MiB (GPU MiB columns: GPU0/GPU1/...)")
    return 0


def _first(events: list[sqlite3.Row], n: int, kind: str) -> sqlite3.Row | None:
    return next((e for e in events if e["attempt"] == n and e["kind"] == kind), None)


def _used_at(samples: list[sqlite3.Row], ts: float) -> str | None:
    """Used MiB per GPU in the last sample at or before `ts` (e.g. '615/615' for GPUs 0 and 1)."""
    latest: dict[int, int] = {}
    for s in samples:
        if s["ts"] > ts:
            break
        latest[s["gpu"]] = s["used_mib"]
    return "/".join(str(latest[g]) for g in sorted(latest)) if latest else None


def _killed(event: sqlite3.Row | None) -> str:
    if event is None:
        return "-"
    data = json.loads(event["data_json"])
    return f"{len(data.get('terminated', []))} TERM, {len(data.get('killed', []))} KILL"


def _rel(event: sqlite3.Row | None, end: float) -> str:
    return "-" if event is None else f"{event['ts'] - end:.2f} ({event['message']})"


def _rel_ts(ts: float | None, end: float) -> str:
    return "-" if ts is None else f"{ts - end:.2f}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
