"""Shell completion made from the CLI's own parser: verbs, a verb's flags, a flag's choices, and job
names asked of the running daemon; in real bash, zsh (through bashcompinit) and fish."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DaemonProcess, daemons_of_this_session, wait_until
from e2e_jobs import job_state, supervise

from supervisor.cli import _parser
from supervisor.cli.completion import script

BIN = str(Path(sys.executable).parent)  # where the `supervise` entry point is installed


def _env(daemon_env: dict[str, str]) -> dict[str, str]:
    return {**daemon_env, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}


def _bash(env: dict[str, str], *words: str) -> list[str]:
    # COMP_WORDS as bash gives it: the command, then each word, the one being completed last.
    code = (f'eval "$(supervise completion bash)"; COMP_WORDS=({" ".join(repr(w) for w in words)}); '
            f'COMP_CWORD={len(words) - 1}; _supervise; printf "%s\\n" "${{COMPREPLY[@]}}"')
    out = subprocess.run(["bash", "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    return [line for line in out.stdout.splitlines() if line]


@pytest.fixture
def known_job(daemon: DaemonProcess, daemon_env: dict[str, str], make_job: Callable[..., Path]) -> dict[str, str]:
    client = daemon.client()
    client.start(str(make_job("extract-shard", "print('hi')\n")), {})
    wait_until(lambda: job_state(client, "extract-shard") == "done", timeout=30)
    return _env(daemon_env)


def test_bash_completes_verbs_flags_choices_and_the_daemon_s_job_names(known_job: dict[str, str]) -> None:
    assert _bash(known_job, "supervise", "lo") == ["logs"]
    assert set(_bash(known_job, "supervise", "ac")) == {"accounting"}
    assert _bash(known_job, "supervise", "logs", "--gr") == ["--grep"]
    assert set(_bash(known_job, "supervise", "events", "--kind", "gpu_")) == {"gpu_wait", "gpu_fault"}
    assert _bash(known_job, "supervise", "completion", "z") == ["zsh"]
    assert _bash(known_job, "supervise", "logs", "extr") == ["extract-shard"]
    assert "extract" in _bash(known_job, "supervise", "start", "ext")  # a built-in spec, by name


def test_without_a_daemon_job_names_are_nothing_and_nothing_breaks(daemon_env: dict[str, str], home: Path) -> None:
    env = _env({**daemon_env, "SUPERVISE_HOME": str(home / "no-daemon-here")})
    assert _bash(env, "supervise", "logs", "") == []
    out = supervise(env, "jobs", "--names")
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    bad = supervise(env, "completion", "powershell", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "supervise completion: error: argument shell: invalid choice: 'powershell'")


def test_a_tab_with_no_daemon_starts_none(daemon_env: dict[str, str], home: Path) -> None:
    """Completion runs `supervise jobs --names` on every Tab: with no daemon, through the console script and
    through the full CLI alike, it must answer nothing and start nothing (it used to spawn a daemon in whatever
    state directory the environment named, which then ran on after the folder was deleted)."""
    state = home / "tab-state"
    env = _env({**daemon_env, "SUPERVISE_HOME": str(state)})
    for argv in (["supervise", "jobs", "--names"], ["supervise", "jobs", "--specs", "--names"],
                 [sys.executable, "-m", "supervisor.cli", "jobs", "--names"]):
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)
        assert "extract" not in out.stdout.split() or "--specs" in argv
    assert not state.exists(), sorted(p.name for p in state.iterdir())
    assert not [pid for pid, test in daemons_of_this_session().items() if "tab_with_no_daemon" in test]


def test_spec_file_names_a_shell_would_expand_never_reach_the_completion(
        known_job: dict[str, str], home: Path) -> None:
    """A spec file named `$(touch${IFS}PWNED).toml` in a job directory: `compgen -W` expands the words it is given,
    so printing the stem as it is ran the command on Tab.  Only valid job names are printed."""
    specs = home / "hostile-specs"
    specs.mkdir()
    (specs / "$(touch${IFS}PWNED).toml").write_text('name = "x"\ncommand = ["true"]\n')
    (specs / "`touch${IFS}PWNED2`.toml").write_text('name = "y"\ncommand = ["true"]\n')
    (specs / "fine-job.toml").write_text('name = "fine-job"\ncommand = ["true"]\n')
    env = {**known_job, "SUPERVISE_JOBS_PATH": str(specs)}
    for cwd in (home, specs):
        out = subprocess.run(
            ["bash", "-c", 'eval "$(supervise completion bash)"; COMP_WORDS=(supervise start ""); COMP_CWORD=2; '
             '_supervise; printf "%s\\n" "${COMPREPLY[@]}"'],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
        assert "fine-job" in out.stdout.split()
        assert not list(cwd.glob("PWNED*")), out.stdout
    names = supervise(env, "jobs", "--names", "--specs").stdout.split()
    assert "fine-job" in names and not [n for n in names if "$" in n or "`" in n]


def test_every_verb_and_flag_of_the_parser_is_in_each_script() -> None:
    parser = _parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for shell in ("bash", "zsh", "fish"):
        text = script(shell, parser)
        for verb, verb_parser in sub.choices.items():
            assert verb in text, (shell, verb)
            for action in verb_parser._actions:
                for option in action.option_strings:
                    assert (option if shell != "fish" else option.lstrip("-")) in text, (shell, verb, option)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_runs_the_same_completion_through_bashcompinit(known_job: dict[str, str]) -> None:
    code = ('autoload -U compinit && compinit -u; eval "$(supervise completion zsh)"; setopt ksharrays; '
            'COMP_WORDS=(supervise logs extr); COMP_CWORD=2; _supervise; print -l "${COMPREPLY[@]}"')
    out = subprocess.run(["zsh", "-f", "-c", code], env=known_job, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["extract-shard"], (out.stdout, out.stderr)


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_verbs_flags_and_job_names(known_job: dict[str, str]) -> None:
    def complete(line: str) -> list[str]:
        code = f"supervise completion fish | source; complete -C {line!r}"
        out = subprocess.run(["fish", "--no-config", "-c", code], env=known_job, capture_output=True, text=True,
                             timeout=60, check=True)
        return [row.split("\t")[0] for row in out.stdout.splitlines()]

    assert "logs" in complete("supervise lo")
    assert complete("supervise logs --gr") == ["--grep"]
    assert "extract-shard" in complete("supervise logs ")
    assert "zsh" in complete("supervise completion ")


def test_the_names_route_answers_names_only_and_refuses_other_methods(known_job: dict[str, str],
                                                                     daemon: DaemonProcess) -> None:
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.paths.socket)), base_url="http://supervise",
                      timeout=10) as http:
        assert http.get("/v1/job-names?junk=%00").json() == {"names": ["extract-shard"]}
        assert http.post("/v1/job-names", content=b"{}").status_code == 405
        assert http.delete("/v1/job-names").status_code == 405
        assert http.get("/v1/ping").status_code == 200


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
                                    b'HTTP/1.1 200 OK\r\nContent-Length: 38\r\n\r\n{"names": ["ok", "$(touch PWNED)", 7]}',
                                    b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", b"garbage\r\n\r\n"])
def test_a_socket_that_hangs_or_answers_nonsense_gives_no_names_within_the_tab_s_bound(
        home: Path, answer: bytes | None) -> None:
    """Whatever listens on the daemon's socket path (a wedged daemon, another program): a Tab waits at most its
    bound and prints only valid job names."""
    import socket
    import threading
    import time

    from supervisor.core.paths import Paths
    from supervisor.shell_names import daemon_job_names

    paths = Paths(home)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(paths.socket))
    server.listen()
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = server.accept()
        held.append(conn)
        conn.recv(65536)
        if answer is not None:
            conn.sendall(answer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started = time.monotonic()
    names = daemon_job_names(paths, timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert names == (["ok"] if answer and b"names" in answer else [])
    for conn in held:
        conn.close()
    server.close()
