"""docker-compose.yml, checked without a Docker engine.

Debian's ``docker-compose config`` validates it against the Compose schema (``make install`` puts
it in the venv: tools/debian_tools.py); the other tests load it with PyYAML and check what makes it
run: the source topic is created before anything needs it, one-shot services are waited for until
they succeed, coordinators restart, images are pinned, every mounted file exists, and the metrics
port and address that Prometheus scrapes are the ones the coordinators' config serves.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from protocol.config.parse import PipelineConfig, load_config
from tools import debian_tools
from tools.debian_tools import docker_compose

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CONFIG_IN_CONTAINER = "/etc/chtxn/pipeline.toml"
#: A version tag (``3.9.0``, ``v2.53.3``, ``25.8.29.51``), or a digest.
PINNED = re.compile(r"^[^:@]+(?::v?\d+\.\d+\.\d+[\w.-]*)?(?:@sha256:[0-9a-f]{64})?$")


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def one_shots() -> set[str]:
    return {name for name, s in services().items() if s.get("restart") == "no"}


def coordinators() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if s.get("command", [""])[0] == "coordinator"}


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(source in the repository, target in the container) of each ``./`` volume."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts.append((ROOT / source, target))
    return mounts


def effective_config(service: dict[str, Any]) -> PipelineConfig:
    """The config a service's container reads: the mounted file, with the service's environment applied."""
    source = next(src for src, target in bind_mounts(service) if target == CONFIG_IN_CONTAINER)
    return load_config(str(source), {k: str(v) for k, v in service.get("environment", {}).items()})


def compose_config() -> subprocess.CompletedProcess[str]:
    argv, env = docker_compose()
    return subprocess.run([*argv, "-f", str(COMPOSE), "config"], capture_output=True, text=True, env=env, cwd=ROOT)


def test_docker_compose_config_accepts_the_file_and_resolves_the_same_services() -> None:
    result = compose_config()
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    assert set(resolved) == set(services())
    for name, service in services().items():
        assert resolved[name].get("depends_on") == service.get("depends_on"), name
        assert resolved[name].get("restart") == service.get("restart"), name


def test_docker_compose_config_refuses_a_wrong_condition(tmp_path: Path) -> None:
    """The validation can fail: the same file with an unknown depends_on condition is refused."""
    broken = COMPOSE.read_text().replace("service_completed_successfully", "service_finished", 1)
    (tmp_path / "docker-compose.yml").write_text(broken)
    argv, env = docker_compose()
    result = subprocess.run(
        [*argv, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"], capture_output=True, text=True, env=env
    )
    assert result.returncode != 0
    assert "service_finished" in result.stderr


def test_the_source_topic_is_created_then_fed_then_ingested() -> None:
    all_services = services()
    command = all_services["create-topic"]["command"]
    topic = command[command.index("--topic") + 1]
    assert "--if-not-exists" in command  # a rerun of the stack is a no-op
    assert all_services["producer"]["environment"]["SAMPLE_TOPIC"] == topic
    assert topic in effective_config(all_services["init"]).pipeline.topics
    assert "create-topic" in all_services["init"]["depends_on"]
    assert "create-topic" in all_services["producer"]["depends_on"]


def test_every_dependency_waits_for_a_condition_and_one_shots_for_success() -> None:
    shots = one_shots()
    assert {"create-topic", "init"} <= shots
    for name, service in services().items():
        depends_on = service.get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: the list form of depends_on waits only for the start"
        for dependency, how in depends_on.items():
            expected = (
                "service_completed_successfully"
                if dependency in shots
                else "service_healthy"
                if "healthcheck" in services()[dependency]
                else "service_started"
            )
            assert how == {"condition": expected}, f"{name} -> {dependency}"


def test_coordinators_and_every_long_running_service_restart() -> None:
    assert len(coordinators()) >= 2  # one leads, one stands by
    for name, service in coordinators().items():
        assert service["restart"] == "unless-stopped", name
        assert service["depends_on"]["init"] == {"condition": "service_completed_successfully"}, name
    for name, service in services().items():
        if name not in one_shots():
            assert service.get("restart") in {"unless-stopped", "on-failure", "always"}, name


def test_every_image_is_pinned() -> None:
    for name, service in services().items():
        image = service["image"]
        if "build" in service:
            assert "/" not in image, f"{name}: a built image is local, never pulled"
            continue
        assert PINNED.match(image) and (":" in image or "@" in image), f"{name}: {image} is not pinned"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert bases and all(PINNED.match(base) and ":" in base for base in bases), bases
    assert "-c constraints.txt" in dockerfile  # the Python packages pinned as CI tests them


def test_the_pin_pattern_refuses_what_floats() -> None:
    for floating in ("grafana/grafana", "grafana/grafana:latest", "clickhouse/clickhouse-server:25.8", "python:3.11"):
        assert not (PINNED.match(floating) and ":" in floating), floating
    assert PINNED.match("prom/prometheus:v2.53.3")
    assert PINNED.match("clickhouse/clickhouse-server:25.8.29.51@sha256:" + "0" * 64)


def test_every_mounted_file_and_copied_directory_exists() -> None:
    for name, service in services().items():
        for source, _ in bind_mounts(service):
            assert source.exists(), f"{name} mounts {source.relative_to(ROOT)}, which is not in the repository"
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), line


def test_prometheus_scrapes_the_port_and_address_each_coordinator_serves() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    expected = set()
    for name, service in coordinators().items():
        cfg = effective_config(service)
        port = cfg.coordinator.metrics_port
        assert port > 0, f"{name} serves no metrics"
        assert cfg.coordinator.metrics_address == "0.0.0.0", f"{name}'s metrics are unreachable from another container"
        assert any(str(p).endswith(f":{port}") for p in service["ports"]), f"{name} does not publish {port}"
        assert f"127.0.0.1:{port}/ready" in " ".join(service["healthcheck"]["test"]), name
        expected.add(f"{name}:{port}")
    assert targets == expected


def test_prometheus_and_grafana_get_the_rules_and_the_dashboard() -> None:
    all_services = services()
    prometheus = dict((target, source) for source, target in bind_mounts(all_services["prometheus"]))
    config = yaml.safe_load(prometheus["/etc/prometheus/prometheus.yml"].read_text())
    for rule_file in config["rule_files"]:
        assert prometheus[f"/etc/prometheus/{rule_file}"] == ROOT / "deploy" / "prometheus" / "alerts.yml"

    grafana = dict((target, source) for source, target in bind_mounts(all_services["grafana"]))
    provisioning = grafana["/etc/grafana/provisioning"]
    providers = yaml.safe_load((provisioning / "dashboards" / "chtxn.yml").read_text())["providers"]
    dashboards_dir = providers[0]["options"]["path"]
    assert grafana[f"{dashboards_dir}/chtxn-dashboard.json"] == ROOT / "deploy" / "grafana" / "chtxn-dashboard.json"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "9090:9090" in all_services["prometheus"]["ports"]


def test_the_venvs_docker_compose_runs_as_it_is_from_any_directory(tmp_path: Path) -> None:
    """``.venv/debian-tools/bin/docker-compose``, as docs/operations.md tells operators to run it:
    no PYTHONPATH, no interpreter named, another working directory."""
    wrapper = debian_tools.default_dir() / "bin" / "docker-compose"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(wrapper), "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    version = subprocess.run([str(wrapper), "version", "--short"], capture_output=True, text=True, env=env)
    assert version.stdout.startswith("1.29"), version.stdout + version.stderr
