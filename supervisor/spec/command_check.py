"""Whether a local job's command can be found, asked at `start` rather than learned from a
crashed attempt: the same question the launch wrapper asks (`command -v`, in /bin/sh, with the
job's environment and working directory), so a name found here is found there.  A remote host
answers at launch: its wrapper writes hosts.base.NOT_FOUND_LINE and exits 127."""

from __future__ import annotations

import os
import subprocess

from supervisor.core.errors import SpecError, shown
from supervisor.core.host_url import is_local
from supervisor.spec.model import JobSpec

_TIMEOUT_S = 10.0  # a PATH entry on a hung file system must not hold a start forever


def check_local_command(spec: JobSpec) -> None:
    """SpecError when a job that runs on this machine names a working directory that is not one, or
    a command its shell cannot find.
    Not asked for a job that runs `after` others: one of them may be what installs it."""
    if spec.after or any(not is_local(host) for host in (spec.host, *spec.hosts)):
        return
    command = spec.argv(1)[0]
    workdir = spec.resolved_workdir()
    if not os.path.isdir(workdir):  # a spec's mistake, said before anything is stored or launched
        raise SpecError(f"{spec.spec_path or spec.name}: field 'workdir': {shown(workdir)} is not a directory "
                        "on this machine; fix `workdir` (templates such as {spec_dir} are expanded first)")
    try:
        found = subprocess.run(["/bin/sh", "-c", 'command -v "$1" >/dev/null 2>&1', "supervise", command],
                               env={**os.environ, **spec.environment(1)}, cwd=workdir, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=_TIMEOUT_S, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return  # no such workdir, or no answer: the launch says what is wrong
    if not found:
        where = "" if os.sep in command else " on the PATH"
        raise SpecError(f"{spec.spec_path or spec.name}: command {shown(command)} not found{where} (from {workdir}); "
                        "fix `command`, `python` or the PATH in `env`")
