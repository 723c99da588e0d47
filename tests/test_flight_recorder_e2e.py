"""A collective hang's flight recorder before the kill: torchrun with two gloo ranks on the CPU,
rank 1 stops entering the all_reduce that rank 0 waits in; judged stalled through a real daemon,
the ranks' real flight recorder dumps (torch's own ``_dump_fr_trace``) are asked for through the
per-attempt pipe, read, and the rank behind is named in the `stacks` event and the alert.

gloo records into the flight recorder but, unlike NCCL's process group, opens no dump pipe: the
job here opens it itself, as ProcessGroupNCCL's monitor thread does (mkfifo ``<stem><rank>.pipe``,
dump to ``<stem><rank>`` when written to).  The NCCL pipe itself was run on a GPU (RESULTS §38)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import AlertSink, job_state, supervise

from supervisor.hosts import flight_recorder

pytest.importorskip("torch")

HANG = """
import os, sys, threading, time
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace

dist.init_process_group("gloo")
rank = dist.get_rank()

def dump_when_asked():  # what ProcessGroupNCCL's monitor thread does with the pipe; gloo has none
    pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + f"{rank}.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        try:
            asked = os.read(fd, 128)
        except BlockingIOError:
            asked = b""
        if asked:
            to = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank)
            with open(to + ".tmp", "wb") as f:
                f.write(_dump_fr_trace())
            os.replace(to + ".tmp", to)
        time.sleep(0.05)

threading.Thread(target=dump_when_asked, daemon=True).start()

def rank_1_stops_here():
    time.sleep(3600)

t = torch.ones(4)
for step in range(1, 1001):
    if rank == 1 and step == 4:
        rank_1_stops_here()
    dist.all_reduce(t)
    if step == 1:
        _dump_fr_trace()  # a first dump with entries takes seconds on a loaded CPU (their frames read): done here
    print(f"train step {step}/1000 loss=1.0 acc0=0.5 tok/s=100.0", flush=True)
    time.sleep(0.1)
"""


@pytest.fixture
def alerting(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    AlertSink.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    daemon_env["SUPERVISE_ALERT_URLS"] = f"json://127.0.0.1:{server.server_port}/alert"
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()
        server.shutdown()
        server.server_close()


def _spec(home: Path, name: str, command: list[str], extra: str = "") -> Path:
    spec = home / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = {json.dumps(command)}\nprobes = ["python", "torch", "train"]\n'
                    f'stop_grace_s = 2\n{extra}[env]\nSUPERVISE_HOME = "{home}"\nOMP_NUM_THREADS = "1"\n'
                    "[health]\nstall_floor_s = 8\n[restart]\nmax_attempts = 1\n")
    return spec


@pytest.mark.slow  # torchrun starting two ranks, then the stall floor before the verdict
def test_a_collective_hang_s_flight_recorder_names_the_rank_behind_before_the_kill(alerting: DaemonProcess,
                                                                                   home: Path) -> None:
    script = home / "hang.py"
    script.write_text(textwrap.dedent(HANG))
    spec = _spec(home, "hang", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node", "2", str(script)])
    client = alerting.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "hang") == "failed", timeout=120)
    events = client.events("hang").events
    stacks = [e for e in events if e.kind == "stacks"]
    assert stacks, [e.message for e in events]
    before_kill = stacks[-1]
    kill = next(i for i, e in enumerate(events) if e.kind == "action" and "killed the process tree" in e.message)
    assert events.index(before_kill) < kill
    said = before_kill.data["flight_recorder"]
    # rank 1 scheduled all_reduce #1..#3 and never #4, which rank 0 waits in
    assert "behind: rank 1 (last #3 gloo:all_reduce)" in said and "never entered #4 gloo:all_reduce" in said, said
    assert "rank 0 in #4 gloo:all_reduce" in said, said
    assert said in before_kill.message
    dumps = before_kill.data["dumps"]
    log = client.attempts("hang").attempts[0].log_path
    assert dumps == [f"{log}.fr/rank_0", f"{log}.fr/rank_1"]
    with open(dumps[0], "rb") as f:
        assert pickle.load(f)["entries"][-1]["profiling_name"] == "gloo:all_reduce"  # torch's own dump, kept
    assert "gpu_report" not in before_kill.data  # no GPU here: nvidia-smi -q not taken
    alerts = wait_until(lambda: [a for a in AlertSink.received if "behind: rank 1" in json.dumps(a)], timeout=20)
    assert "never entered #4" in json.dumps(alerts[-1])


def test_a_job_that_is_not_torch_distributed_gets_no_flight_recorder(daemon: DaemonProcess, home: Path) -> None:
    script = home / "plain.py"
    script.write_text("import os\nprint('fr=' + str(sorted(k for k in os.environ if k.startswith('TORCH_'))))\n")
    spec = _spec(home, "plain", [sys.executable, str(script)])
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "plain") == "done", timeout=30)
    log = client.attempts("plain").attempts[0].log_path
    assert "fr=[]" in Path(log).read_text()
    assert not Path(log + ".fr").exists()


def test_on_sets_it_for_any_launcher_and_the_spec_s_own_env_wins(daemon: DaemonProcess, home: Path) -> None:
    script = home / "wrapped.py"
    script.write_text("import os\nfor k in sorted(os.environ):\n    k.startswith('TORCH_') and print(k + '=' + os.environ[k])\n")
    spec = _spec(home, "wrapped", [sys.executable, str(script)], 'flight_recorder = "on"\n')
    spec.write_text(spec.read_text().replace("[env]\n", '[env]\nTORCH_FR_BUFFER_SIZE = "50"\n'))
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "wrapped") == "done", timeout=30)
    log = client.attempts("wrapped").attempts[0].log_path
    text = Path(log).read_text()
    assert "TORCH_FR_BUFFER_SIZE=50\n" in text
    for name in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        assert f"{name}={log}.fr/rank_\n" in text, text
    assert Path(log + ".fr").is_dir()


@pytest.mark.parametrize("text, field", [
    ('flight_recorder = "maybe"', "flight_recorder"),
    ("flight_recorder = true", "flight_recorder"),
    ('flight_recorder = "on"\nhost = "ssh://gpu-box"\npython = "/usr/bin/python3"\nworkdir = "/srv"', "needs a local job"),
])
def test_bad_flight_recorder_values_are_one_line_exit_65(daemon: DaemonProcess, home: Path,
                                                         daemon_env: dict[str, str], text: str, field: str) -> None:
    spec = home / "bad.toml"
    spec.write_text(f'name = "bad"\ncommand = ["true"]\n{text}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert field in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and daemon.proc is not None and client.ping().pid == daemon.proc.pid


def test_a_dump_that_holds_an_object_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)

    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps({"entries": [Payload()]}))
    trace = flight_recorder.read_rank(path, 0)
    assert trace.error.startswith("unreadable: refused") and not marker.exists()
    said = flight_recorder.summarise([trace], 1)
    assert said.startswith("flight recorder: rank 0: unreadable: refused"), said
    (tmp_path / "rank_1").write_bytes(b"\x80\x05not a pickle at all")
    assert flight_recorder.read_rank(tmp_path / "rank_1", 1).error.startswith("unreadable:")


def test_ranks_at_one_collective_are_said_to_be_level(tmp_path: Path) -> None:
    traces = []
    for rank in (0, 1):
        entry = {"collective_seq_id": 7, "profiling_name": "nccl:all_reduce", "state": "started", "is_p2p": False}
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps({"entries": [entry]}))
        traces.append(flight_recorder.read_rank(tmp_path / f"rank_{rank}", rank))
    assert flight_recorder.summarise(traces, 2) == "flight recorder: all 2 ranks at #7 nccl:all_reduce (started)"


# A rank that reads its pipe but never writes its dump (its monitor thread wedged, or a torch that
# polls the pipe without dumping): the collection gives up at its bound, says so, and the kill is
# not held past it.  A pipe nobody reads any more (its rank ended) is skipped, not waited on.
READS_NEVER_DUMPS = """
import os, sys, time
pipe, heard = sys.argv[1], sys.argv[2]
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # polled, as ProcessGroupNCCL's monitor thread does
open(heard + ".open", "w").close()
while True:
    try:
        asked = os.read(fd, 128)
    except BlockingIOError:
        asked = b""
    if asked:
        open(heard, "wb").write(asked)
    time.sleep(0.05)
"""


def test_a_dump_that_never_comes_is_given_up_on_at_its_bound(tmp_path: Path) -> None:
    folder = tmp_path / "attempt.log.fr"
    folder.mkdir()
    os.mkfifo(folder / "rank_0.pipe")
    os.mkfifo(folder / "rank_1.pipe")  # rank 1 has ended: nobody reads its pipe
    heard = tmp_path / "heard"
    rank = subprocess.Popen([sys.executable, "-c", READS_NEVER_DUMPS, str(folder / "rank_0.pipe"), str(heard)])
    try:
        wait_until(lambda: Path(f"{heard}.open").exists(), timeout=20)
        began = time.monotonic()
        record = asyncio.run(flight_recorder.collect(folder, wait_s=1.5))
        took = time.monotonic() - began
    finally:
        rank.kill()
        rank.wait()
    assert record is not None and record.dumps == ()
    assert record.summary == "flight recorder: asked 1 rank through the pipe, no dump within 2 s", record.summary
    assert wait_until(lambda: heard.exists() and heard.read_bytes()) == b"1\n"  # the rank was asked
    assert took < 1.5 + 1.0, took  # the bound, and the last look's pause


def test_no_rank_listening_is_said_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "attempt.log.fr"
    folder.mkdir()
    os.mkfifo(folder / "rank_0.pipe")
    began = time.monotonic()
    record = asyncio.run(flight_recorder.collect(folder, wait_s=5))
    assert record is not None and time.monotonic() - began < 2
    assert record.summary == "flight recorder: no rank opened the dump pipe (the NCCL process group opens it; gloo does not)"
    assert asyncio.run(flight_recorder.collect(tmp_path / "none.fr")) is None  # not a torch distributed attempt
