"""Settings in one place: defaults < config.toml < SUPERVISE_* environment, typed, each value's
origin known; a malformed file or value is one line naming the file (or variable) and the key."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from supervisor.core.config import DaemonSettings, Paths, load_settings
from supervisor.core.errors import ConfigError


def _load(home: Path, env: dict[str, str] | None = None):
    return load_settings(Paths(home), environ=env or {})


def test_defaults_file_and_environment_in_that_order(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        'gpu_interval_s = 1.5\npoll_interval_s = 0.25\nalert_urls = ["tgram://123:secret-token/456"]\n'
        'metrics_addr = "127.0.0.1:9464"\n')
    loaded = _load(tmp_path, {"SUPERVISE_POLL_INTERVAL_S": "0.1", "SUPERVISE_ALERT_MIN_INTERVAL_S": "5"})
    s = loaded.settings
    assert (s.gpu_interval_s, s.poll_interval_s, s.alert_min_interval_s, s.gpu_store_every_s) == (1.5, 0.1, 5.0, 10.0)
    assert s.alert_urls == ("tgram://123:secret-token/456",) and s.metrics_bind == ("127.0.0.1", 9464)
    file = str(tmp_path / "config.toml")
    assert loaded.sources == {
        "gpu_interval_s": file, "gpu_store_every_s": "default", "poll_interval_s": "env SUPERVISE_POLL_INTERVAL_S",
        "alert_urls": file, "alert_min_interval_s": "env SUPERVISE_ALERT_MIN_INTERVAL_S", "metrics_addr": file,
        "loop_lag_interval_s": "default", "request_timeout_s": "default", "log_keep_attempts": "default",
        "log_max_bytes": "default", "kernel_log": "default", "events_per_attempt": "default",
        "quarantine_gpu_s": "default", "quarantine_host_s": "default", "quarantine_strikes": "default",
        "cgroup_root": "default",
    }


def test_existing_environment_names_still_work(tmp_path: Path) -> None:
    env = {"SUPERVISE_GPU_INTERVAL_S": "3", "SUPERVISE_GPU_STORE_EVERY_S": "30", "SUPERVISE_POLL_INTERVAL_S": "1",
           "SUPERVISE_ALERT_URLS": "json://localhost/a  mailto://u:pw@example.com", "SUPERVISE_ALERT_MIN_INTERVAL_S": "9"}
    s = _load(tmp_path, env).settings
    assert s == DaemonSettings(gpu_interval_s=3, gpu_store_every_s=30, poll_interval_s=1, alert_min_interval_s=9,
                               alert_urls=("json://localhost/a", "mailto://u:pw@example.com"))
    assert not _load(tmp_path).config_file_exists


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu_interval_s = [", "not valid TOML"),
    ("gpu_intervall_s = 2", "key 'gpu_intervall_s': unknown setting (known: gpu_interval_s,"),
    ('gpu_interval_s = "fast"', "key 'gpu_interval_s': Input should be a valid number"),
    ("poll_interval_s = 0", "key 'poll_interval_s': Input should be greater than 0"),
    ('metrics_addr = "0.0.0.0:9464"', "key 'metrics_addr': '0.0.0.0:9464' is not a loopback address"),
    ('metrics_addr = "192.168.1.5:9464"', "is not a loopback address"),
    ('metrics_addr = "localhost"', "is not host:port"),
    ("events_per_attempt = 5", "key 'events_per_attempt': Input should be greater than or equal to 100"),
    ("quarantine_gpu_s = -1", "key 'quarantine_gpu_s': Input should be greater than or equal to 0"),
    ('quarantine_host_s = "1h"', "key 'quarantine_host_s': Input should be a valid number"),
    ("quarantine_strikes = 0", "key 'quarantine_strikes': Input should be greater than or equal to 1"),
])
def test_malformed_file_is_one_line_naming_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "config.toml").write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        _load(tmp_path)
    message = str(info.value)
    assert message.startswith(f"config {tmp_path / 'config.toml'}: ") and expected in message
    assert "\n" not in message


def test_bad_environment_value_names_the_variable_and_hides_urls(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^environment SUPERVISE_GPU_INTERVAL_S: Input should be a valid number"):
        _load(tmp_path, {"SUPERVISE_GPU_INTERVAL_S": "2s"})
    (tmp_path / "config.toml").write_text('alert_urls = 5\n')
    with pytest.raises(ConfigError) as info:
        _load(tmp_path)
    assert "key 'alert_urls'" in str(info.value)
    with pytest.raises(ConfigError, match="no such file"):
        _load(tmp_path, {"SUPERVISE_CONFIG": str(tmp_path / "missing.toml")})
    (tmp_path / "config.toml").write_text('kernel_log = 5\n')
    with pytest.raises(ConfigError, match=r"key 'kernel_log'.*valid string") as info:
        _load(tmp_path)
    assert "\n" not in str(info.value)
    (tmp_path / "config.toml").write_text(f'kernel_log = "{"x" * 5000}"\n')
    with pytest.raises(ConfigError, match="key 'kernel_log'"):
        _load(tmp_path)
    (tmp_path / "config.toml").write_text('kernel_log = ""\n')  # "": not read
    assert _load(tmp_path).settings.kernel_log == ""


def test_loopback_addresses_accepted() -> None:
    for addr, bind in (("127.0.0.1:9464", ("127.0.0.1", 9464)), ("localhost:9000", ("localhost", 9000)),
                       ("[::1]:9464", ("::1", 9464)), ("127.0.0.2:1", ("127.0.0.2", 1))):
        assert DaemonSettings(metrics_addr=addr).metrics_bind == bind
    assert DaemonSettings(metrics_addr="").metrics_bind is None


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=REPO, check=False)


def test_config_show_says_where_each_value_came_from(home: Path, daemon_env: dict[str, str]) -> None:
    config = home / "other.toml"
    config.write_text('gpu_interval_s = 4\nalert_urls = ["tgram://123:secret-token/456", '
                      '"failure,gpu_fault=ntfy://ntfy.sh/routed-secret-topic"]\n')
    env = {**daemon_env, "SUPERVISE_CONFIG": str(config), "SUPERVISE_METRICS_ADDR": "127.0.0.1:9464"}
    result = _cli(env, "config", "show")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"config file: {config} (present)" in out and "no daemon running" in out
    assert "gpu_interval_s       = 4.0" in out and f"from {config}" in out
    assert "127.0.0.1:9464" in out and "from env SUPERVISE_METRICS_ADDR" in out
    assert "secret-token" not in out and "tgram://***" in out
    # A routed URL (its tags before it) is redacted as well, its tags shown.
    assert "routed-secret-topic" not in out and "failure,gpu_fault=ntfy://***" in out
    shown = json.loads(_cli(env, "config", "show", "--json").stdout)
    assert {s["name"]: s["source"] for s in shown["settings"]}["poll_interval_s"] == "default"


def test_malformed_config_stops_the_cli_before_the_daemon_starts(home: Path, daemon_env: dict[str, str]) -> None:
    (home / "config.toml").write_text("gpu_interval_s = -2\n")
    result = _cli(daemon_env, "status")
    assert result.returncode == 78
    assert result.stderr.strip() == (f"supervise: config {home / 'config.toml'}: key 'gpu_interval_s': "
                                      "Input should be greater than 0 (got -2)")
    assert not (home / "daemon.sock").exists()


# Secrets planted in alert URLs of many apprise services, each where that service keeps it: a
# key as the "host", a token in the path, a password, a query value, a topic, a route's URL.
PLANTED = {
    "prowl://plantedsecret01": "prowl://***",
    "gotify://127.0.0.1:9/plantedsecret02": "gotify://127.0.0.1/***",
    "json://127.0.0.1:9/path/plantedsecret03": "json://127.0.0.1/***",
    "mailto://ops:plantedsecret04@127.0.0.1:9?to=a@example.com": "mailto://127.0.0.1/***",
    "tgram://123456:plantedsecret05/789": "tgram://***",
    "pover://plantedsecret06@plantedsecret07": "pover://***",
    "ntfy://127.0.0.1:9/plantedsecret08": "ntfy://***",
    "xml://user:plantedsecret09@127.0.0.1:9/x": "xml://127.0.0.1/***",
    "form://127.0.0.1:9/hook?token=plantedsecret10": "form://127.0.0.1/***",
    "discord://1234/plantedsecret11": "discord://***",
    "slack://plantedsecret12/Bxxxx/Cxxxx": "slack://***",
    "pbul://o.plantedsecret13": "pbul://***",
    "json://localhost:9/hook#plantedsecret14": "json://localhost/***",
    "failure=gotify://127.0.0.1:9/plantedsecret15": "failure=gotify://127.0.0.1/***",
    "matrix://user:plantedsecret16@127.0.0.1:9/#room": "matrix://127.0.0.1/***",
    "mqtt://user:plantedsecret17@127.0.0.1:9/topic": "mqtt://127.0.0.1/***",
    "rocket://user:plantedsecret18@127.0.0.1:9/#channel": "rocket://127.0.0.1/***",
}


def test_alert_url_secrets_show_nowhere_only_scheme_tags_and_host(home: Path, daemon_env: dict[str, str],
                                                                   make_job) -> None:
    from conftest import DaemonProcess, wait_until

    (home / "config.toml").write_text(f"alert_urls = {json.dumps(list(PLANTED))}\n")
    secrets = [f"plantedsecret{n:02d}" for n in range(1, 19)]
    offline = _cli(daemon_env, "config", "show").stdout  # no daemon: the CLI reads the file itself
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        shown = {s.name: s.value for s in client.config().settings}["alert_urls"]
        online = _cli(daemon_env, "config", "show").stdout + _cli(daemon_env, "config", "show", "--json").stdout
        raw = client._http.get("/v1/config").text
        client.start(str(make_job("crash", "raise SystemExit(3)\n", extra="[restart]\nmax_attempts = 1\n")), {})
        # The daemon's log (what it writes to daemon.log; here the test's file of its output).
        wait_until(lambda: "alert delivery" in daemon.log_text(), timeout=60)
        time.sleep(3)  # deliveries to unreachable services fail and say so
        logged = daemon.log_text()
    finally:
        daemon.close()
    leaks = {where: [secret for secret in secrets if secret in text]
             for where, text in (("config show (no daemon)", offline), ("config show", online), ("/v1/config", raw),
                                 ("daemon.log", logged))}
    assert all(not leaked for leaked in leaks.values()), {where: f"{len(leaked)} of {len(secrets)}: {leaked}"
                                                          for where, leaked in leaks.items()}
    assert shown == list(PLANTED.values())  # the scheme, a route's tags, and the host where it is one
