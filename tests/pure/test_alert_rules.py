"""The Prometheus files in deploy/prometheus, checked by promtool: the rules are valid, each alert
fires (and stays quiet) on the input series of alerts_test.yml, and the compose stack's
prometheus.yml loads them. ``make install`` puts promtool in the venv (tools/debian_tools.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tools.debian_tools import promtool

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], cwd=PROMETHEUS, capture_output=True, text=True)


def alert_names() -> list[str]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_expect() -> None:
    result = run_promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fired == set(alert_names())
    assert quiet == set(alert_names())


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests with one annotation changed do."""
    (tmp_path / "alerts.yml").write_text((PROMETHEUS / "alerts.yml").read_text())
    text = (PROMETHEUS / "alerts_test.yml").read_text()
    (tmp_path / "wrong_test.yml").write_text(text.replace("has no leader", "has one leader", 1))
    result = subprocess.run(
        [str(promtool()), "test", "rules", "wrong_test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_the_compose_prometheus_loads_the_rules() -> None:
    result = run_promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_every_alert_is_explained_in_the_operations_guide() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide.split("## Dashboards and alerts", 1)[1].split("\n## ", 1)[0]
    explained = set(re.findall(r"\*\*(Chtxn\w+)\*\*", section))
    assert explained == set(alert_names())
