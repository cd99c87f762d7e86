"""The Grafana dashboard and the Prometheus alert rules query only series the coordinator exports.

The exported names come from the registry of a constructed ``CoordinatorMetrics`` (its prometheus_client
collectors, the process and platform ones included), never from a list kept by hand; the names a
query uses are read out of its PromQL. The dashboard's queries must also parse: promtool checks them
as recording rules (``make install`` puts promtool in the venv; see tools/debian_tools.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from coordinator.metrics import CoordinatorMetrics
from tools.debian_tools import promtool

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "chtxn-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

#: The sample names each kind of metric family exports beside (or instead of) its own name.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
#: PromQL words that are neither series nor functions.
KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2", "start", "end"}
#: Grafana's variables, and what they stand for when a query is checked by promtool.
GRAFANA_VARIABLES = {"$pipeline": ".+", "$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def exported_names() -> set[str]:
    """Every sample name a coordinator's ``/metrics`` can show."""
    names: set[str] = set()
    for family in CoordinatorMetrics("any").registry.collect():
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def series_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: every identifier that is no function, aggregation,
    keyword, label name, label value, duration or Grafana variable."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\b(?:group_left|group_right)\b", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        before = text[match.start() - 1] if match.start() else " "
        if before.isdigit() or before == ".":  # 1e3, 0.5e-1, offset 5m
            continue
        if text[match.end() :].lstrip().startswith("(") or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    panels = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # the panels of a collapsed row
    return panels


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard."""
    return [(p["title"], t["expr"]) for p in dashboard_panels() for t in p.get("targets", [])]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


# ---- the name finder --------------------------------------------------------------------------


def test_the_name_finder_sees_every_series_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (pipeline, le) (rate(a_bucket{pipeline=~"$pipeline", x="y z"}[$__rate_interval])))'
        " / on (instance) group_left (pipeline) b_info + 1e3 * sum(c:recorded) without (job) > bool 0.5"
        ' or absent(d) unless e offset 5m and label_replace(f, "dst", "$1", "src", "(.*)")'
    )
    assert series_names(expr) == {"a_bucket", "b_info", "c:recorded", "d", "e", "f"}


def test_the_exported_names_come_from_the_registry() -> None:
    names = exported_names()
    # one of each kind: counter, gauge, histogram, info, and the process collector's
    assert {"chtxn_transactions_total", "chtxn_leader", "chtxn_commit_latency_seconds_bucket"} <= names
    assert {"chtxn_build_info", "process_cpu_seconds_total", "python_info"} <= names
    assert "chtxn_participants_alive" not in names  # it counted partitions: now chtxn_partitions_live


# ---- the dashboard ----------------------------------------------------------------------------


def test_every_dashboard_query_uses_only_exported_series() -> None:
    exported = exported_names()
    queries = dashboard_queries()
    assert len(queries) >= 20
    unknown = {(title, name) for title, expr in queries for name in series_names(expr) - exported}
    assert unknown == set(), "the dashboard queries series no coordinator exports"
    assert all(series_names(expr) for _, expr in queries), "a query selects no series"


def test_every_chtxn_metric_has_a_panel() -> None:
    used = set().union(*(series_names(expr) for _, expr in dashboard_queries()))
    families = {f.name for f in CoordinatorMetrics("any").registry.collect() if f.name.startswith("chtxn_")}
    missing = {family for family in families if not any(name.startswith(family) for name in used)}
    assert missing == set()


def test_the_pipeline_variable_lists_an_exported_series() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    match = re.fullmatch(r"label_values\((\w+),\s*pipeline\)", variables["pipeline"]["definition"])
    assert match is not None and match.group(1) in exported_names()


def test_the_panels_are_laid_out_on_the_grid_and_use_the_datasource_variable() -> None:
    panels = dashboard_panels()
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    rules = []
    for i, (_, expr) in enumerate(dashboard_queries()):
        for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([str(promtool()), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


# ---- the alert rules --------------------------------------------------------------------------


def test_every_alert_uses_only_exported_series() -> None:
    exported = exported_names()
    rules = alert_rules()
    unknown = {(rule["alert"], name) for rule in rules for name in series_names(rule["expr"]) - exported}
    assert unknown == set(), "an alert queries series no coordinator exports"


def test_the_alerts_cover_what_an_operator_is_woken_for() -> None:
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert {
        "ChtxnNoLeader",
        "ChtxnCommitsStalled",
        "ChtxnLagGrowing",
        "ChtxnAbortsRising",
        "ChtxnDeadLettersRising",
        "ChtxnFreshnessOverTarget",
    } <= set(alerts)
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        assert "pipeline" in rule["expr"], f"{name} is not per pipeline"
