"""A job sharded over two SSH hosts through a real daemon and a real sshd on loopback (the
example in docs/guides/sharding.md): each shard runs on its own host entry, then the gather step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

if TYPE_CHECKING:
    from sshd import SshServer

pytest_plugins = ["sshd"]

PART = "import sys\nopen(f'{sys.argv[3]}/part-{sys.argv[1]}-of-{sys.argv[2]}', 'w').write(sys.argv[1])\n"
GATHER = "import sys\nopen(f'{sys.argv[1]}/all', 'w').write(''.join(open(f'{sys.argv[1]}/part-{i}-of-2').read() for i in range(2)))\n"


@pytest.fixture
def daemon_env(daemon_env: dict[str, str], sshd_server: SshServer, home: Path) -> dict[str, str]:
    env = dict(daemon_env)
    env.update(sshd_server.env())
    env["SUPERVISE_SSH_LOG_ROOT"] = str(home / "remote-logs")
    env["HOME"] = str(home)
    env.pop("SSH_AUTH_SOCK", None)
    return env


def test_two_shards_over_two_ssh_hosts_then_gather(daemon: DaemonProcess, sshd_server: SshServer, home: Path,
                                                   daemon_env) -> None:
    # Two host entries (two connections) that reach the one test sshd.
    hosts = [sshd_server.url, sshd_server.url + "?accept_new_host_key=1"]
    (home / "part.py").write_text(PART)
    (home / "gather.py").write_text(GATHER)
    spec = home / "sharded.toml"
    spec.write_text(f'''name = "sharded"
hosts = {hosts!r}
shards = 2
python = "{sys.executable}"
workdir = "{home}"
command = ["{{python}}", "part.py", "{{shard}}", "{{num_shards}}", "{home}"]
gather = ["{{python}}", "gather.py", "{home}"]
'''.replace("'", '"'))
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "sharded") == "done", timeout=60)
    assert (home / "all").read_text() == "01"
    attempts = client.attempts("sharded").attempts
    # The gather runs on the job's `host` (here the default, local), where the shards' output is read.
    assert {a.shard: a.host for a in attempts} == {0: hosts[0], 1: hosts[1], -1: "local"}
    lines = supervise(daemon_env, "status", "sharded").stdout.splitlines()
    assert lines[0].startswith("sharded: done  shards 2/2 done, 0 running, 0 failed")
    assert f"host {hosts[1]}" in lines[2]
