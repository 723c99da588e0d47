"""Machines that run jobs, behind one protocol (`base.Host`).

    base          the protocol (`Host`, `Follower`) and its value types (launch request, process
                  handle, exit status, kill report), the detached wrapper every host runs
    registry      `connect` (host URL scheme -> its `HostKind` in `_KINDS`: the module, the class, the
                  reach hook), and one live host and GPU monitor per host name, made on first use
    reach         before a start on a remote host: nothing listens at the address its kind's reach
                  hook gives (said at once); it imports no kind
    refollow      a log shown to a person, followed through its host's outages
    stacks        an attempt's Python stacks, dumped with py-spy before a kill (and on demand)
    kernel_log    the kernel log's word on OOM kills: which of a set of pids its OOM killer ended
    local/        this machine: host (launch, pidfd exit, process-tree kill, GPUs by NVML),
                  follow (a local log: inotify, polling fallback), cgroup (a cgroup v2 per attempt),
                  notify (an attempt's NOTIFY_SOCKET), rss (peak memory without a cgroup's count)
    ssh/          a box over SSH: host (the Host protocol, GPU sampling by nvidia-smi), target (an
                  ssh:// address, the host-key policy), connection (the one connection per host),
                  agent (the resident shell for short scripts), mux_agent (the resident agent's
                  framed protocol), _agent_program (the agent itself, sent as text), mux (the one
                  agent channel carrying every follow and exit watch), mux_follow (a remote log)
    slurm/        a Slurm cluster: host (each attempt one sbatch job, the same wrapper), jobs (sbatch,
                  scontrol, sacct, scancel and how their states map onto ours), files (where logs
                  and exit files are read), ssh (a cluster through its login node, slurm+ssh://)
    _remote       the POSIX scripts the SSH host runs there; _remote_parse, what they print, parsed
    _asyncssh     asyncssh, imported once for every module that speaks SSH
    _errors       how SSH failures read: one classifier from asyncssh's and the OS's exceptions
    _busy         adaptive batching for log readers (the cost of following is per read)
    _inotify      the inotify watches the local followers share
    _iterated     what every log follower shares: its records iterated once, and closed

Both followers are byte transports around one `records.RecordBuffer` (bytes in, records out).
A new kind of host is one new subpackage implementing `Host`, and one `HostKind` in registry's `_KINDS`
(docs/guides/where-it-goes.md says which tests come with it).
"""

from supervisor.hosts._remote import DOCTOR as DOCTOR_SCRIPT
from supervisor.hosts._remote import after_mark, script
from supervisor.hosts._remote_parse import parse_keys
from supervisor.hosts.base import (
    TAG_VAR,
    ExitStatus,
    Follower,
    Host,
    KillReport,
    LaunchRequest,
    ProcessHandle,
)

__all__ = ["DOCTOR_SCRIPT", "TAG_VAR", "ExitStatus", "Follower", "Host", "KillReport", "LaunchRequest", "ProcessHandle",
           "after_mark", "parse_keys", "script"]
