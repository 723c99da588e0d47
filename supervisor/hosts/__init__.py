"""Machines that run jobs, behind one protocol (`base.Host`).

    base          the protocol (`Host`, `Follower`) and its value types (launch request, process
                  handle, exit status, kill report), the detached wrapper every host runs
    local         this machine: launch, pidfd exit, process-tree kill (psutil), GPUs (NVML)
    local_follow  following a local log file (inotify, polling fallback)
    _inotify      the inotify watches the local followers share
    ssh           a remote box over SSH: the Host protocol and GPU sampling (nvidia-smi)
    ssh_target    an SSH host's address (ssh:// URL) and the host-key policy
    ssh_connection  the one connection per SSH host: reconnects, short scripts, streams
    ssh_agent     the resident remote shell that runs the short scripts
    ssh_mux_agent the resident remote agent's framed protocol, its typed messages and how it starts
    ssh_agent_program  the agent itself (ssh/_agent_program.py): the program python3 runs there, sent as text
    ssh_mux       the one agent channel per SSH host that carries every follow and exit watch
    ssh_mux_follow  following a remote log through that channel
    slurm         a Slurm cluster: each attempt one sbatch job (the same wrapper), scancel, srun nvidia-smi
    slurm_jobs    Slurm's commands (sbatch, scontrol, sacct, scancel) and how their states map onto ours
    slurm_files   where the Slurm host reads its logs and exit files (here, on a shared file system)
    slurm_ssh     a Slurm cluster through its login node (slurm+ssh://): commands and files over SSH
    _remote       the POSIX scripts the SSH host runs there, and their parsers
    registry      `connect` (host URL scheme -> module), and one live host and GPU monitor per
                  host name, made on first use

Both followers are byte transports around one `records.RecordBuffer` (bytes in, records out).
A new kind of host is one new module implementing `Host`, and one line in registry's `_KINDS`.
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
