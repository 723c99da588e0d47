"""Running it for months: Prometheus metrics scraped from a real daemon while a real job runs,
`status --watch` and `logs -f` read off a real terminal (tmux), and `report` drawn from a
real multi-attempt history.  GPU numbers come from a daemon process whose NVML is a fake
fed by the job itself (tests/fakes/gpu_daemon.py)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import REPO, DaemonProcess, wait_until
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli.watch import plain_lines
from supervisor.core import protocol

MIB = 1024 * 1024
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)")

STALLING_JOB = """\
import sys, time
print("INFO 11-29 10:00:02 [gpu_model_runner.py:1595] Starting to load model tiny...", flush=True)
bar = "Loading safetensors checkpoint shards"
for i in range(1, 7):
    time.sleep(5.0 if i == 4 else 0.15)  # shard 4 takes long: the stall gauge climbs (with room on a busy box)
    sys.stdout.write(f"\\r{bar}: {100 * i // 6:3d}% Completed | {i}/6 [00:0{i}<00:01,  5.00it/s]")
    sys.stdout.flush()
sys.stdout.write("\\n")
raise RuntimeError("CUDA error: an illegal memory access was encountered")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def metrics_port() -> int:
    return _free_port()


@pytest.fixture
def daemon_env(daemon_env: dict[str, str], metrics_port: int) -> dict[str, str]:
    return {**daemon_env, "SUPERVISE_METRICS_ADDR": f"127.0.0.1:{metrics_port}", "SUPERVISE_LOOP_LAG_INTERVAL_S": "0.1"}


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _scrape_socket(home: Path) -> str:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(home / "daemon.sock")), base_url="http://supervise") as http:
        response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


def _cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], env=env, capture_output=True, text=True,
                          timeout=90, check=check, cwd=REPO)


def test_metrics_move_with_a_running_job(daemon: DaemonProcess, make_job, daemon_env: dict[str, str], home: Path,
                                         metrics_port: int) -> None:
    spec = make_job("stally", STALLING_JOB, probes='["python", "cuda", "vllm"]', extra="[restart]\nmax_attempts = 1\n")
    _cli(daemon_env, "start", str(spec))
    job = {"job": "stally"}
    first = _parse(_scrape_socket(home))
    assert _value(first, "supervise_job_state", state="running", **job) == 1.0
    assert _value(first, "supervise_job_state", state="failed", **job) == 0.0
    assert _value(first, "supervise_job_attempts", **job) == 1.0
    assert _value(first, "supervise_daemon_info", version="0.1.0") == 1.0

    # Shard 3 shown, shard 4 slow: the stall gauge climbs while progress stands still.
    def in_the_slow_shard() -> Samples | None:
        samples = _parse(_scrape_socket(home))
        done = _value(samples, "supervise_job_progress_done", probe="vllm.shards", **job)
        stall = _value(samples, "supervise_job_stall_seconds", **job)
        return samples if done in (2, 3) and stall is not None and stall > 0.8 else None

    # 3/6 is drawn; the runner reads a redraw once the next one starts, so it may still count 2/6.
    slow = wait_until(in_the_slow_shard, timeout=10, interval=0.1)
    assert _value(slow, "supervise_job_phase", phase="weight_loading", **job) == 1.0
    assert _value(slow, "supervise_job_phase", phase="running", **job) == 0.0
    assert _value(slow, "supervise_job_progress_expected", probe="vllm.shards", **job) == 6.0
    time.sleep(0.6)
    later = _parse(_scrape_socket(home))
    assert _value(later, "supervise_job_stall_seconds", **job) >= _value(slow, "supervise_job_stall_seconds", **job) + 0.5
    assert _value(later, "supervise_job_last_output_age_seconds", **job) >= 0.5
    assert _value(later, "supervise_event_loop_lag_seconds_count") > _value(first, "supervise_event_loop_lag_seconds_count")
    assert _value(later, "supervise_probe_records_total", **job) >= 3

    wait_until(lambda: daemon.client().status("stally").jobs[0].state == "failed", timeout=20)
    # The opt-in TCP endpoint, on loopback, serves the same registry.
    end = _parse(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text)
    assert _value(end, "supervise_job_failures_total", kind="runtime_error", **job) == 1.0
    assert _value(end, "supervise_job_verdicts_total", verdict="crashed", **job) == 1.0
    assert _value(end, "supervise_job_launches_total", **job) == 1.0
    assert _value(end, "supervise_job_state", state="failed", **job) == 1.0
    assert _value(end, "supervise_job_stall_seconds", **job) is None  # only while an attempt runs
    assert _value(end, "supervise_job_progress_done", probe="vllm.shards", **job) == 6.0
    assert _value(end, "supervise_probe_records_total", **job) >= 9  # 1 + 7 redraws/lines + traceback lines
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=_scrape_socket(home), capture_output=True,
                              text=True, timeout=30, check=False)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr


def test_non_loopback_metrics_address_is_refused(home: Path, daemon_env: dict[str, str]) -> None:
    env = {**daemon_env, "SUPERVISE_METRICS_ADDR": "0.0.0.0:9464"}
    result = subprocess.run([sys.executable, "-m", "supervisor.daemon.process"], env=env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 78
    assert result.stderr.strip().endswith("environment SUPERVISE_METRICS_ADDR: '0.0.0.0:9464' is not a loopback address: "
                                          "the metrics endpoint binds only to 127.0.0.0/8, ::1 or localhost "
                                          "(put an authenticating proxy in front to expose it) (got '0.0.0.0:9464')")
    assert not (home / "daemon.sock").exists()


# -- a daemon with (fake) GPUs: per-job GPU memory, status --watch, report ------------------

class FakeGpuDaemon(DaemonProcess):
    def start(self) -> None:
        log = open(self.home / "daemon-test.log", "ab")  # noqa: SIM115 - closed in stop()
        self._log = log
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakes" / "gpu_daemon.py")], env=self.env,
                                     stdout=log, stderr=log, start_new_session=True)
        client = self.client()
        wait_until(lambda: client.accepting() and client.ping(), timeout=20)


@pytest.fixture
def gpu_daemon(home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpuDaemon]:
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    env = {**daemon_env, "SUPERVISE_FAKE_GPU_HOLDERS": str(home / "holders"), "SUPERVISE_GPU_INTERVAL_S": "0.2",
           "SUPERVISE_GPU_STORE_EVERY_S": "0.2"}
    d = FakeGpuDaemon(home, env)
    d.start()
    yield d
    d.close()


def _gpu_spec(home: Path) -> Path:
    spec = home / "extract-tp2.toml"
    spec.write_text(f"""\
name = "extract-tp2"
command = ["{{python}}", "{REPO / 'tests' / 'jobs' / 'gpu_job.py'}", "{home / 'holders'}", "--shards", "4",
           "--shard-s", "0.25", "--prompts", "40", "--prompt-s", "0.08", "--crash", "1:8", "--crash", "2:14"]
probes = ["python", "cuda", "vllm"]
stop_grace_s = 2
[env]
SUPERVISE_HOME = "{home}"
[restart]
max_attempts = 3
backoff_initial_s = 0.5
backoff_jitter_s = 0
[gpu]
release_timeout_s = 20
release_tolerance_mib = 100
""")
    return spec


class Tmux:
    """A tmux server of its own, one window running a command; read back as the screen shows it."""

    def __init__(self, name: str, command: str, width: int, height: int) -> None:
        self.server = f"sv-{os.getpid()}-{name}"
        self._run("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), command)
        self.name = name

    def _run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-J", "-t", self.name)  # -J: a wrapped line as one

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.name, *keys)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The screen, once `predicate(screen)` holds; on timeout, fail showing the last screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"screen not as expected within {timeout}s:\n{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True, timeout=10, check=False)


def _pane_command(home: Path, *args: str) -> str:
    cli = " ".join([sys.executable, "-m", "supervisor.cli", *args])
    # COLUMNS/LINES inherited from the test run would override the pane's real size.
    return f"cd {REPO} && env -u COLUMNS -u LINES SUPERVISE_HOME={home} PYTHONPATH={REPO} {cli}; echo EXIT=$?; sleep 60"


@needs_tmux
def test_gpu_job_watch_metrics_and_report(gpu_daemon: FakeGpuDaemon, home: Path, daemon_env: dict[str, str],
                                          tmp_path: Path) -> None:
    client = gpu_daemon.client()
    client.start(str(_gpu_spec(home)), {})
    tmux = Tmux("watch", _pane_command(home, "status", "--watch"), 150, 20)
    try:
        # The live view, as a person sees it, while an attempt generates.
        # The first redraw after a bar appears may come before its rate and the first verdict are
        # known: wait for a screen that shows them.
        screen = tmux.wait_for(lambda s: re.search(r"running +[123]/3  running .*/40", s) is not None
                               and "healthy" in s and "it/s" in s and "ago" in s, timeout=25)
        assert "supervise · daemon pid" in screen
        assert "JOB          STATE    ATTEMPT  PHASE    PROGRESS" in screen
        assert "━" in screen  # the progress bar
        assert "  0  " in screen and "  1  " in screen and "/81,559 MiB" in screen  # GPU memory per device

        # Per-job GPU memory, attributed through the attempt's processes.
        def job_gpu() -> Samples | None:
            samples = _parse(_scrape_socket(home))
            held = _value(samples, "supervise_job_gpu_memory_used_bytes", job="extract-tp2", host="local", gpu="0")
            return samples if held == (900 + 2600 * 4 + 52000 + 600) * MIB else None

        samples = wait_until(job_gpu, timeout=10, interval=0.2)
        assert _value(samples, "supervise_job_gpu_memory_used_bytes", job="extract-tp2", host="local", gpu="1") == \
            (900 + 2600 * 4 + 52000) * MIB
        assert _value(samples, "supervise_gpu_memory_total_bytes", host="local", gpu="0") == 81559 * MIB
        assert _value(samples, "supervise_gpu_memory_used_bytes", host="local", gpu="0") >= (52000 + 615) * MIB

        wait_until(lambda: client.status("extract-tp2").jobs[0].state == "done", timeout=40, interval=0.2)
        final = tmux.wait_for(lambda s: "done       3/3" in s, timeout=5)
        assert "40/40" in final
        tmux.keys("C-c")
        assert "Traceback" not in tmux.wait_for(lambda s: "EXIT=0" in s, timeout=5)
    finally:
        tmux.close()

    ended = _parse(_scrape_socket(home))
    assert _value(ended, "supervise_job_failures_total", job="extract-tp2", kind="cuda_oom") == 1.0
    assert _value(ended, "supervise_job_launches_total", job="extract-tp2") == 3.0
    assert _value(ended, "supervise_job_attempts", job="extract-tp2") == 3.0

    gpu = client.job_gpu("extract-tp2")
    assert {s.gpu for s in gpu.samples} == {0, 1} and len(gpu.samples) > 20
    assert max(s.used_mib for s in gpu.samples) >= 52000

    png, page = tmp_path / "report.png", tmp_path / "report.html"
    out = _cli(daemon_env, "report", "extract-tp2", "--out", str(png)).stdout
    assert "3 attempts" in out
    _cli(daemon_env, "report", "extract-tp2", "--out", str(page))
    assert png.stat().st_size > 40_000
    image = Image.open(io.BytesIO(png.read_bytes())).convert("RGB")
    assert image.size[0] >= 1200 and image.size[1] >= 800
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None
    common = {rgb for count, rgb in colours if count > 200}
    assert len(common) >= 12
    for phase_colour in ((0xFF, 0x7F, 0x0E), (0x1F, 0x77, 0xB4), (0xDB, 0xDB, 0x8D)):  # weight loading, running, model init
        assert phase_colour in common, phase_colour
    html = page.read_text()
    assert html.count("<tr><td>#") == 3 and "data:image/png;base64," in html
    assert "oom" in html and "crashed" in html and "CUDA out of memory" in html


def test_status_watch_without_a_terminal_prints_plain_lines(daemon: DaemonProcess, make_job,
                                                             daemon_env: dict[str, str]) -> None:
    spec = make_job("slowbar", "import time\nfor i in range(1, 41):\n    print(f'extract: {5 * i // 2}%|#| {i}/40 "
                    "[00:01<00:02, 4.00it/s]', flush=True)\n    time.sleep(0.25)\n", probes='["python", "tqdm"]')
    _cli(daemon_env, "start", str(spec))
    # Tests started in the background (`&`, no job control) pass SIGINT on ignored, and a Python
    # started so never raises KeyboardInterrupt: the CLI gets SIGINT as a terminal would give it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "status", "--watch", "--every", "0.5"],
                                env=daemon_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    finally:
        signal.signal(signal.SIGINT, previous)
    # Ctrl-C once three views are out (not after a fixed time: a busy machine starts the CLI slowly).
    seen: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while len([line for line in seen if "slowbar" in line]) < 3 and time.monotonic() < deadline:
        seen.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=10)
    out = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert "\x1b[" not in out  # no terminal codes in a pipe
    lines = [line for line in out.splitlines() if "slowbar" in line]
    assert len(lines) >= 3
    assert re.search(r"^\d\d:\d\d:\d\d  slowbar  running  attempt 1/3  phase -  progress \d+/40 \(\d+%\)  4\.0 it/s  "
                     r"eta \d+s  health healthy  output \ds ago$", lines[-1]), lines[-1]
    assert "GPUs: NVML unavailable" in out
    assert err == ""


@needs_tmux
def test_logs_follow_shows_the_current_tqdm_state_on_one_line(daemon: DaemonProcess, make_job, home: Path,
                                                              daemon_env: dict[str, str]) -> None:
    script = """\
    import sys, time
    from tqdm import tqdm
    print("loading model", flush=True)
    for _ in tqdm(range(8), desc="Loading checkpoint shards", mininterval=0, file=sys.stdout):
        time.sleep(0.7)
    print("weights loaded", flush=True)
    """
    spec = make_job("tq", script, probes='["python", "tqdm", "transformers"]')
    _cli(daemon_env, "start", str(spec))
    log_path = Path(daemon.client().attempts("tq").attempts[0].log_path)
    width = 60
    tmux = Tmux("logs", _pane_command(home, "logs", "tq", "-f"), width, 12)
    try:
        def latest_state() -> str:
            return log_path.read_bytes().decode().split("\r")[-1].split("\n")[0][: width - 1]

        def shows_latest() -> bool:
            before = latest_state()
            screen = tmux.screen()
            bars = [line for line in screen.splitlines() if "Loading checkpoint shards" in line]
            assert len(bars) <= 1, screen  # redraws overwrite one line, however narrow the terminal
            return bool(bars) and bars[0].rstrip() == before.rstrip() == latest_state().rstrip() and "/8" in before

        # Mid-bar, the screen shows the bar exactly as the log last drew it (cut to the terminal's width).
        wait_until(lambda: shows_latest() and "3/8" in latest_state(), timeout=15, interval=0.05)
        assert all(len(line) < width for line in tmux.screen().splitlines())
        screen = tmux.wait_for(lambda s: "EXIT=0" in s, timeout=20)
        lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
        assert lines[0] == "loading model"
        assert lines[1].startswith("Loading checkpoint shards: 100%") and "8/8" in lines[1]
        assert lines[2:4] == ["weights loaded", "EXIT=0"]
    finally:
        tmux.close()


def _status_with(next_verdict: protocol.NextVerdict | None, failure: str | None) -> protocol.StatusResponse:
    attempt = protocol.AttemptInfo(
        job="ranks", n=1, state="running", host="local", pid=42, started=0.0, ended=None, exit_code=None,
        exit_signal=None, log_path="/x.log", phase="running", progress=None, verdict=None, reason=None,
        failure=protocol.FailureInfo(kind="runtime_error", line=failure) if failure else None, fingerprint=None,
        action=None, argv=[])
    job = protocol.JobStatus(name="ranks", state="running", reason="", host="local", max_attempts=3, attempt=attempt,
                             next_verdict=next_verdict)
    return protocol.StatusResponse(jobs=[job], daemon_pid=1, daemon_version="0", gpu_note="none")


def test_the_live_view_counts_down_to_a_hang_verdict_and_to_a_close_stall() -> None:
    hang = protocol.NextVerdict(verdict="crashed", in_s=80.0,
                                reason="hung after a failure, no output for 2m00s: RuntimeError: rank 1 died")
    line = plain_lines(_status_with(hang, "RuntimeError: rank 1 died"), now=0)[0]
    assert line.endswith("(crashed in 1m20s if nothing changes: hung after a failure, no output for 2m00s: "
                         "RuntimeError: rank 1 died)")
    far = protocol.NextVerdict(verdict="stalled", in_s=200.0, reason="shard 4/64, no progress for 5m00s")
    assert plain_lines(_status_with(far, None), now=0)[0].endswith("health healthy")
    close = protocol.NextVerdict(verdict="stalled", in_s=12.0, reason="shard 4/64, no progress for 5m00s")
    assert plain_lines(_status_with(close, None), now=0)[0].endswith(
        "(stalled in 12s if nothing changes: shard 4/64, no progress for 5m00s)")
