"""SSH at fleet size: one daemon, H hosts (H real sshd on loopback ports), N attempts per host.

    .venv/bin/python tests/perf/bench_fleet.py [--hosts 8] [--per-host 32] [--rate 2] [--seconds 15]
                                               [--event-every 1] [--max-sessions 10]

One real daemon (tests/perf/_harness.Daemon) and H OpenSSH servers (tests/sshd.py, each with
its own host key and port, all trusting one client key, ``MaxSessions`` 10 as sshd's default).
Two phases, in one run and one daemon:

1. a single local job, alone: the baseline;
2. H x N jobs on the local host: what the daemon's own share of the fleet's cost is;
3. the fleet: H x N jobs on the SSH hosts (and nothing local);
4. H x ``--small`` jobs on the SSH hosts (the size at which the channel-per-log path, removed
   since, was compared: RESULTS.md section 10).

Each job is tests/perf/_writer.py: stamped lines (``time.time()`` first) at ``--rate`` lines/s
for ``--seconds``, every ``--event-every``-th a transformers shard bar (a progress event); the
writers of a phase wait until all are up, start together (phase-shifted) and linger after
their last line.  Per phase:

- detection latency: stored event ``ts`` - the line's stamp (p50, p99, max);
- the daemon's CPU (psutil user+system of its pid over the window, % of one core);
- ``status`` as a user at the terminal waits for it: every job, and one job, alternating every
  ``--status-every`` seconds while the phase writes (p50, p99);
- per host, from the sshd side: TCP connections from the daemon to that sshd's port, and
  sessions (channels that run a command: the session processes sshd started), the most seen
  in samples every 0.5 s over the window; and the CPU of everything those sessions run (the
  agents, the resident shells), user+system over the window, all hosts together,
  % of one core.

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import PY, WRITER, Daemon, machine_note, ms, percentile, stamp_of, table, wait_until, write_go
from sshd import SshServer


@dataclass
class Phase:
    label: str
    jobs: int
    latencies: list[float] = field(default_factory=list)
    expected: int = 0
    stored: int = 0
    cpu_pct: float = 0.0
    window_s: float = 0.0
    connections: list[int] = field(default_factory=list)  # per host, the most seen
    sessions: list[int] = field(default_factory=list)
    agent_cpu_pct: float = 0.0
    status_all: list[float] = field(default_factory=list)  # `status` of every job, seconds a call
    status_one: list[float] = field(default_factory=list)  # `status JOB` of one job


def start_servers(count: int, root: Path, max_sessions: int) -> list[SshServer]:
    """``count`` sshd on loopback that all trust the first one's client key."""
    servers: list[SshServer] = []
    for i in range(count):
        server = SshServer(root / f"sshd{i}", max_sessions=max_sessions)
        if servers:
            server.root.mkdir(parents=True)
            for suffix in ("", ".pub"):
                shutil.copy(str(servers[0].client_key) + suffix, str(server.client_key) + suffix)
        servers.append(server.start())
    return servers


def sessions_of(server: SshServer) -> list[psutil.Process]:
    """The processes sshd started for sessions: children of an sshd that are not sshd."""
    found = []
    for proc in server.connection_processes():
        try:
            found += [c for c in proc.children() if c.name() != "sshd"]
        except psutil.Error:
            continue
    return found


def connections_to(pid: int, port: int) -> int:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(1 for c in conns if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def tree_cpu(procs: list[psutil.Process]) -> dict[int, float]:
    cpu: dict[int, float] = {}
    for proc in procs:
        try:
            for p in [proc, *proc.children(recursive=True)]:
                times = p.cpu_times()
                cpu[p.pid] = times.user + times.system
        except psutil.Error:
            continue
    return cpu


def run_phase(daemon: Daemon, phase: Phase, hosts: list[str], servers: list[SshServer], args: argparse.Namespace) -> None:
    home = daemon.home
    tag = phase.label.split()[0].rstrip(":")
    go, ready = home / f"go-{tag}", home / f"ready-{tag}"
    ready.mkdir()
    lines = int(args.rate * args.seconds)
    specs = []
    for i in range(phase.jobs):
        host = hosts[i % len(hosts)]
        # SUPERVISE_HOME marks the writers as this daemon's, so that Daemon.stop ends the remote ones too.
        extra = ((f'host = "{host}"\npython = "{PY}"\nworkdir = "{home}"\n' if host != "local" else "")
                 + f'[restart]\nmax_attempts = 1\n[env]\nSUPERVISE_HOME = "{home}"\n')
        specs.append(daemon.spec(f"{tag}{i:03d}", [PY, str(WRITER), "--rate", f"{args.rate:g}", "--lines", str(lines),
                                                  "--event-every", str(args.event_every), "--phase",
                                                  f"{i / phase.jobs:.4f}", "--go", str(go), "--ready", str(ready),
                                                  "--linger"], probes=["transformers"], extra=extra))
    daemon.start_jobs(specs)
    wait_until(lambda: len(list(ready.iterdir())) >= phase.jobs, 300, f"{phase.jobs} writers to be ready", 0.2)
    time.sleep(1.0)  # let launch-time work settle
    proc = daemon.process()
    db = daemon.db()
    before = db.execute("SELECT COUNT(*) FROM events WHERE kind='progress'").fetchone()[0]
    phase.expected = phase.jobs * (lines // args.event_every)
    peaks = {"conn": [0] * len(servers), "sess": [0] * len(servers)}
    agents_start = tree_cpu([p for s in servers for p in sessions_of(s)])
    stop = threading.Event()

    def sample() -> None:
        while True:
            for k, server in enumerate(servers):
                peaks["conn"][k] = max(peaks["conn"][k], connections_to(daemon.pid, server.port))
                peaks["sess"][k] = max(peaks["sess"][k], len(sessions_of(server)))
            if stop.wait(0.5):
                return

    def ask_status() -> None:
        # What a user at the terminal waits for while the fleet writes: `status` (every job) and
        # `status JOB`, alternating, one call every ``--status-every`` seconds.
        client = daemon.client()
        one = f"{tag}000"
        try:
            k = 0
            while not stop.wait(args.status_every):
                began = time.perf_counter()
                client.status(None if k % 2 == 0 else one)
                (phase.status_all if k % 2 == 0 else phase.status_one).append(time.perf_counter() - began)
                k += 1
        finally:
            client.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    asker = threading.Thread(target=ask_status, daemon=True)
    if args.status_every > 0:
        asker.start()
    start_at = write_go(go, delay_s=0.5)
    time.sleep(max(0.0, start_at - time.time()))
    cpu_start = sum(proc.cpu_times()[:2])

    def stored() -> bool:
        count = db.execute("SELECT COUNT(*) FROM events WHERE kind='progress'").fetchone()[0] - before
        return count >= phase.expected

    wait_until(stored, args.seconds * 4 + 120, f"{phase.expected} events to be stored", interval=0.05)
    phase.cpu_pct = (sum(proc.cpu_times()[:2]) - cpu_start) / (time.time() - start_at) * 100
    phase.window_s = time.time() - start_at
    agents_end = tree_cpu([p for s in servers for p in sessions_of(s)])
    phase.agent_cpu_pct = sum(agents_end[p] - agents_start.get(p, 0.0) for p in agents_end) / phase.window_s * 100
    stop.set()
    sampler.join()
    if asker.is_alive():
        asker.join()
    rows = db.execute("SELECT ts, message FROM events WHERE kind='progress' AND job LIKE ?", (f"{tag}%",)).fetchall()
    db.close()
    phase.stored = len(rows)
    phase.latencies = [ts - s for ts, m in rows if (s := stamp_of(m)) is not None]
    phase.connections, phase.sessions = peaks["conn"], peaks["sess"]
    end_writers(go)  # they linger: end them before the next phase


def end_writers(go: Path) -> None:
    """SIGKILL the lingering writers of one phase (those waiting on its go file)."""
    for proc in psutil.process_iter(["cmdline"]):
        if str(go) in (proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--per-host", type=int, default=32)
    parser.add_argument("--rate", type=float, default=2.0, help="lines per second per job (default 2)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--event-every", type=int, default=1)
    parser.add_argument("--max-sessions", type=int, default=10, help="each sshd's MaxSessions (default 10, sshd's own)")
    parser.add_argument("--no-local-fleet", action="store_true",
                        help="skip phase 2 (the fleet's jobs on the local host): at 1,024 jobs its launches alone take minutes")
    parser.add_argument("--status-every", type=float, default=0.25,
                        help="time `status` (all jobs, then one job, alternating) every this many seconds while "
                             "a phase writes (default 0.25; 0: not asked)")
    parser.add_argument("--small", type=int, default=6,
                        help="jobs per host for the small phase (default 6; 0 skips it)")
    args = parser.parse_args()

    note = machine_note()
    root = Path(tempfile.mkdtemp(prefix="svf-", dir="/tmp"))
    servers = start_servers(args.hosts, root, args.max_sessions)
    home = root / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "SUPERVISE_SSH_CONFIG": str(servers[0].ssh_config),
        "SUPERVISE_SSH_KNOWN_HOSTS": ":".join(str(s.known_hosts) for s in servers),
        "SUPERVISE_SSH_KEY": str(servers[0].client_key),
        "SUPERVISE_SSH_LOG_ROOT": str(root / "remote-logs"),
    }
    local = Phase("local (1 job)", 1)
    local_fleet = Phase(f"local-fleet ({args.hosts * args.per_host} jobs)", args.hosts * args.per_host)
    fleet = Phase(f"fleet: ssh, agent ({args.hosts} hosts x {args.per_host} jobs)", args.hosts * args.per_host)
    small = Phase(f"ssh-agent ({args.hosts} hosts x {args.small} jobs)", args.hosts * args.small)
    urls = [s.url for s in servers]
    try:
        with Daemon(env=env) as daemon:
            run_phase(daemon, local, ["local"], servers, args)
            if not args.no_local_fleet:
                run_phase(daemon, local_fleet, ["local"], servers, args)
            run_phase(daemon, fleet, urls, servers, args)
            if args.small:
                run_phase(daemon, small, urls, servers, args)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(f"Fleet over SSH vs one local job: {args.rate:g} lines/s per job for {args.seconds:g} s, every "
          f"{args.event_every} line(s) a progress event; sshd MaxSessions {args.max_sessions}\n")
    rows = []
    phases = (local, *(() if args.no_local_fleet else (local_fleet,)), fleet, *((small,) if args.small else ()))
    for p in phases:
        remote = p.label.startswith(("fleet", "ssh"))
        per_host = (f"{min(p.connections)}-{max(p.connections)}" if remote else "-",
                    f"{min(p.sessions)}-{max(p.sessions)}" if remote else "-")
        rows.append((p.label, f"{p.stored}/{p.expected}", ms(percentile(p.latencies, 50)), ms(percentile(p.latencies, 99)),
                     ms(max(p.latencies) if p.latencies else float("nan")), f"{p.cpu_pct:.1f}", per_host[0], per_host[1],
                     f"{p.agent_cpu_pct:.1f}" if remote else "-"))
    print(table(["phase", "events", "p50 ms", "p99 ms", "max ms", "daemon CPU %", "connections/host",
                 "sessions/host (max)", "remote sessions CPU %"], rows))
    if args.status_every > 0:
        print(f"\n`status` while each phase writes (one call every {args.status_every:g} s, alternating every job "
              f"and one job; target p99 < 100 ms):\n")
        print(table(["phase", "calls", "all jobs p50 ms", "all jobs p99 ms", "one job p50 ms", "one job p99 ms"],
                    [(p.label, len(p.status_all) + len(p.status_one), ms(percentile(p.status_all, 50)),
                      ms(percentile(p.status_all, 99)), ms(percentile(p.status_one, 50)), ms(percentile(p.status_one, 99)))
                     for p in phases]))
    print(f"\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
