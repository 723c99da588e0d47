"""One fold: every corpus log, written by a real job under a real daemon, reaches the phase and the
failure that `supervise probe` reads from the same bytes.

Each log is a job of its own (``cat`` of the file, exit 0), all at once on one daemon, with every
pack found (as `supervise probe` reads with no ``--pack``).  The attempt's phase must be the
replay's last phase; when the replay says the log crashed, the attempt's failure kind must be the
replay's; and the attempt is judged crashed exactly when the replay says crashed (or oom)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from probe_golden import corpus_logs

from supervisor.cli.client import Client
from supervisor.probes import replay_file

CRASHED = ("crashed", "oom")


def _offline(log: Path) -> dict:
    # What `supervise probe --json LOG` prints (its report, every pack found), read in this process.
    return json.loads(replay_file(str(log)).model_dump_json())


@pytest.mark.timeout(600)  # 92 jobs on one daemon: about 90 s on 2 cores, more on a loaded one
def test_the_live_fold_reaches_what_probe_reads_on_every_corpus_log(daemon: DaemonProcess, home: Path,
                                                                     daemon_env: dict[str, str]) -> None:
    logs = corpus_logs()
    assert len(logs) >= 90
    client: Client = daemon.client()
    specs = home / "specs"
    specs.mkdir()
    names = {}
    for i, log in enumerate(logs):
        name = f"log{i:03d}"
        names[name] = log
        spec = specs / f"{name}.toml"
        # No probes named: every pack found reads it, as `supervise probe` does.  Nothing judged while it
        # runs: the whole log is written at once and the exit decides.
        spec.write_text(f'name = "{name}"\ncommand = ["cat", {json.dumps(str(log))}]\nstop_grace_s = 1\n'
                        "[restart]\nmax_attempts = 1\n")
        client.start(str(spec), {})
    wait_until(lambda: all(j.state in ("done", "failed") for j in client.status().jobs)
               and len(client.status().jobs) == len(logs), timeout=400, interval=0.5)
    mismatches = []
    for name, log in names.items():
        offline = _offline(log)
        [attempt] = client.attempts(name).attempts
        where = log.relative_to(log.parents[1])
        live_phase = attempt.phase.value if attempt.phase is not None else None
        if live_phase != offline["last_phase"]:
            mismatches.append(f"{where}: phase live {live_phase} offline {offline['last_phase']}")
        crashed_offline = offline["outcome"] in CRASHED
        crashed_live = attempt.verdict in CRASHED
        if crashed_live != crashed_offline:
            mismatches.append(f"{where}: live {attempt.verdict}, offline {offline['outcome']}")
        elif crashed_offline:
            live_kind = attempt.failure.kind if attempt.failure is not None else None
            if live_kind != offline["failure"]["kind"]:
                mismatches.append(f"{where}: failure live {live_kind} offline {offline['failure']['kind']}")
    assert not mismatches, "\n".join(mismatches)
