"""The install the README's commands and CI make: locked, hashed, and this environment exactly that lock; the
one warning asyncssh's import raises on a newer cryptography silenced precisely; no SSH client in a daemon that
has no SSH host; no test session that leaves a daemon behind."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO, daemons_of_this_session
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCKS = REPO / "requirements"
_PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", re.M)


def _pins(lock: Path) -> dict[str, Version]:
    return {canonicalize_name(m[1].split("[")[0]): Version(m[2]) for m in _PIN.finditer(lock.read_text())}


def _requirements(path: Path) -> list[Requirement]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def _project_requirements(extra: str | None) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"], *(project["optional-dependencies"][extra] if extra else [])]
    return [Requirement(n) for n in names] + _requirements(REPO / "jobs" / "requirements.txt")


@pytest.mark.parametrize(("lock", "extra"), [("test.lock", "test"), ("run.lock", None)])
def test_each_lock_pins_every_dependency_at_a_version_its_range_allows(lock: str, extra: str | None) -> None:
    """A dependency added to pyproject.toml or jobs/requirements.txt without `bash requirements/relock`, or a range
    moved past the locked version, fails here, not on a user's machine."""
    pins = _pins(LOCKS / lock)
    env = default_environment()
    for req in _project_requirements(extra):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements/{lock}: run `bash requirements/relock`"
        assert req.specifier.contains(pins[name], prereleases=True), (lock, str(req), str(pins[name]))
    assert all("--hash=sha256:" in block for block in re.split(r"\n(?=\S)", (LOCKS / lock).read_text())
               if _PIN.match(block)), f"requirements/{lock}: every pin carries its hashes"


def test_the_main_job_s_lock_is_the_test_lock_without_the_test_tools() -> None:
    run, test = _pins(LOCKS / "run.lock"), _pins(LOCKS / "test.lock")
    assert {name: run[name] for name in run} == {name: test[name] for name in run}
    assert {"pytest", "mypy", "selenium"}.isdisjoint(run) and {"pytest", "mypy", "selenium"} <= set(test)


def test_the_interop_lock_is_the_versions_the_interop_tests_were_written_for() -> None:
    wanted = {canonicalize_name(r.name): Version(str(r.specifier).removeprefix("=="))
              for r in _requirements(REPO / "tests" / "requirements-interop.txt")}
    assert _pins(LOCKS / "interop.lock") == wanted


def test_ci_and_the_readme_install_from_the_locks() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "--require-hashes -r requirements/test.lock" in ci
    assert "--require-hashes -r requirements/interop.lock" in ci
    assert "--require-hashes -r requirements/run.lock" in readme
    assert "bash requirements/relock" in readme and ".ci/run --latest" in readme


@pytest.mark.skipif(os.environ.get("SUPERVISE_CI_ENV") != "locked",
                    reason="checks the environment .ci/run installs from requirements/test.lock (it sets "
                           "SUPERVISE_CI_ENV=locked); `.ci/run --latest` and a hand-made venv differ on purpose")
def test_this_environment_is_exactly_the_lock() -> None:
    """What .ci/run installed is what the lock says, package for package: the suite's green is the lock's."""
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in metadata.distributions()}
    pins = {**_pins(LOCKS / "test.lock"), **_pins(LOCKS / "interop.lock")}
    differ = {name: (str(v), str(installed.get(name))) for name, v in pins.items() if installed.get(name) != v}
    assert not differ, differ


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_the_ssh_modules_import_without_a_warning_even_as_errors() -> None:
    """cryptography 51 deprecates DSA and asyncssh names the DSA classes at import: five warnings at the top of every
    daemon.log and `doctor --host`, and, as errors, ten test files that never collected."""
    out = _python("import supervisor.hosts.ssh.host, supervisor.hosts.slurm.ssh, supervisor.cli.doctor", "-W", "error")
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_the_dsa_filter_is_that_one_warning_from_asyncssh_only() -> None:
    """The same deprecation raised from anywhere but asyncssh's import, or another deprecation, still shows."""
    out = _python(textwrap.dedent("""
        import warnings
        import supervisor.hosts._asyncssh
        from cryptography.utils import CryptographyDeprecationWarning
        for message in ("DSA is deprecated and support will be removed", "something else is deprecated"):
            try:
                warnings.warn(message, CryptographyDeprecationWarning)
            except CryptographyDeprecationWarning:
                print("raised")
        """), "-W", "error")
    assert out.stdout.split() == ["raised", "raised"], out.stderr


def test_only_one_module_imports_asyncssh() -> None:
    """The filter holds only if nothing imports asyncssh around it."""
    importers = []
    for path in (REPO / "supervisor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "asyncssh" or n.startswith("asyncssh.") for n in names):
                importers.append(str(path.relative_to(REPO)))
    assert importers == ["supervisor/hosts/_asyncssh.py"]


_REMOTE_KINDS = ("asyncssh", "supervisor.hosts.ssh", "supervisor.hosts.slurm")


def test_a_daemon_with_only_local_jobs_never_loads_the_ssh_client() -> None:
    """Nor Slurm's code, nor either through the reach check a start runs (for `local` and `slurm:` it looks at
    nothing, so no kind's hook is imported)."""
    out = _python(textwrap.dedent(f"""
        import asyncio, sys
        import supervisor.daemon.service, supervisor.daemon.process
        from supervisor.hosts.reach import refuse_if_nothing_listens
        def loaded(): return sorted(m for m in sys.modules if m.startswith({_REMOTE_KINDS!r}))
        print(loaded())
        asyncio.run(refuse_if_nothing_listens("local"))
        print(loaded())
        asyncio.run(refuse_if_nothing_listens("slurm:"))
        print([m for m in loaded() if not m.startswith("supervisor.hosts.slurm")])
        """))
    assert out.stdout.split("\n")[:3] == ["[]", "[]", "[]"], out.stdout + out.stderr


def test_the_reach_check_imports_no_host_kind() -> None:
    """Which address a start looks at is each kind's reach hook (`hosts/registry.py`); reach.py imports none of
    them, nor asyncssh, at module level or in a function: every daemon imports it."""
    kinds = sorted(p.parent.name for p in (REPO / "supervisor" / "hosts").glob("*/__init__.py"))
    assert kinds == ["local", "slurm", "ssh"]
    names = []
    for node in ast.walk(ast.parse((REPO / "supervisor" / "hosts" / "reach.py").read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [f"{node.module}.{a.name}" for a in node.names] if node.module == "supervisor.hosts" else \
                [node.module or ""]
    reached = [n for n in names if n.split(".")[0] == "asyncssh" or n.split(".")[:3] in
               (["supervisor", "hosts", kind] for kind in kinds)]
    assert not reached, f"hosts/reach.py imports {reached}: register a reach hook with the kind in registry.py"


def test_each_kind_s_reach_hook_gives_the_address_a_start_looks_at() -> None:
    """The hooks named in the registry resolve, and a closed port of each remote kind is refused in one line."""
    import asyncio
    import socket

    from supervisor.core.errors import ConnectionLost
    from supervisor.hosts.base import ListenAddress
    from supervisor.hosts.reach import refuse_if_nothing_listens
    from supervisor.hosts.registry import reach_hook

    with socket.socket() as s:  # a loopback port where nothing listens once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"ssh://nobody@127.0.0.1:{port}", f"slurm+ssh://nobody@127.0.0.1:{port}?log_root=/x"):
        hook = reach_hook(url)
        assert hook is not None and hook(url) == ListenAddress("127.0.0.1", port, f"nobody@127.0.0.1:{port}")
        with pytest.raises(ConnectionLost, match=rf"^connection refused \(nobody@127\.0\.0\.1:{port}\)$"):
            asyncio.run(refuse_if_nothing_listens(url))
    for url in ("local", "slurm:", "ssh://box", "slurm+ssh://login"):  # no port: ssh config may name another
        hook = reach_hook(url)
        assert hook is None or hook(url) is None, url
        asyncio.run(refuse_if_nothing_listens(url))


def test_a_session_that_leaves_a_daemon_running_fails_naming_the_test(tmp_path: Path) -> None:
    """The suite's own guard, run on a session of one test that starts a daemon and forgets it."""
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(f"""
        import os, subprocess, sys, tempfile, time
        def test_forgets_its_daemon():
            home = tempfile.mkdtemp(prefix="sv-leak-", dir="/tmp")
            env = {{**os.environ, "SUPERVISE_HOME": home, "PYTHONPATH": {str(REPO)!r}}}
            subprocess.Popen([sys.executable, "-m", "supervisor.daemon.process"], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(home, "daemon.sock")) and time.monotonic() < deadline:
                time.sleep(0.05)
        def test_clean():
            pass
        """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISE_TEST_")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                          "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                         env={**env, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0, out.stdout
    assert "daemons left running after the session" in out.stdout, out.stdout
    assert "test_leaky.py::test_forgets_its_daemon" in out.stdout, out.stdout
    assert "test_clean" not in out.stdout.split("daemons left running")[1].split("\n")[0]
    assert not [t for t in daemons_of_this_session().values() if "test_leaky" in t]
