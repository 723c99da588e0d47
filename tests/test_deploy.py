"""deploy/: the Prometheus alerting rules and the systemd unit are valid, and the rules use
only metrics the daemon exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ALERTS = REPO / "deploy" / "alerts.yml"
UNIT = REPO / "deploy" / "supervise.service"
EXPECTED_ALERTS = {"SuperviseShardLoadingStuck", "SuperviseJobCrashLooping", "SuperviseJobFailed",
                   "SuperviseGpuMemoryLeaked", "SuperviseDaemonEventLoopLagging"}


def test_alert_rules_structure_and_metric_names() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    exported = (REPO / "supervisor" / "daemon" / "metrics.py").read_text()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])
        names = set(re.findall(r"\bsupervise_[a-z_]+", rule["expr"]))
        assert names, rule["alert"]
        for name in names:
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            assert f'"{base}"' in exported, f"{rule['alert']} uses {name}, which the daemon does not export"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    check = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 5 rules found" in check.stdout
    tests = subprocess.run(["promtool", "test", "rules", "alerts.test.yml"], cwd=REPO / "tests" / "data",
                           capture_output=True, text=True, timeout=60, check=False)
    assert tests.returncode == 0, tests.stdout + tests.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    # The unit names the tool's usual install path; verify a copy that points at this interpreter.
    text = UNIT.read_text()
    assert "KillMode=process" in text and "ExecStart=%h/.venvs/supervise/bin/supervise daemon --foreground" in text
    unit = tmp_path / "supervise.service"
    unit.write_text(text.replace("%h/.venvs/supervise/bin/supervise", str(Path(sys.executable).parent / "supervise")))
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    result = subprocess.run(["systemd-analyze", "--user", "verify", str(unit)], capture_output=True, text=True,
                            timeout=60, env=env, check=False)
    if "Failed to initialize manager" in result.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {result.stderr.strip()}")
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
