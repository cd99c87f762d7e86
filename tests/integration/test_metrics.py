"""The coordinator's metrics port, on the embedded stack: what a standby and a leader export, the
readiness endpoint, and the bind address. Each replica is a ``chtxn coordinator`` process; test code
plays the participants (``ScriptedParticipants``). The participants' figures need real participants:
that test runs the live pipeline in threads (``live_pipeline``) and serves each replica's registry.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from coordinator.metrics import CoordinatorMetrics, package_version
from coordinator.metrics_server import MetricsServer
from coordinator.readiness import Readiness
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

REPO = Path(__file__).resolve().parents[2]
CHTXN = Path(sys.executable).with_name("chtxn")  # the console script of the installed distribution


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(config: Path, coordinator_id: str, log: Path, *extra: str, env: dict[str, str] | None = None):
    """``chtxn coordinator --config F`` as its own process, its output in ``log``."""
    environ = {**os.environ, "CHTXN_COORDINATOR_ID": coordinator_id, "PYTHONPATH": str(REPO), **(env or {})}
    with log.open("w") as out:
        return subprocess.Popen(
            [str(CHTXN), "coordinator", "--config", str(config), *extra],
            env=environ,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(60)


def get(url: str) -> tuple[int, str]:
    """Status and body of a GET, 503 included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(address: str, port: int) -> dict[tuple[str, tuple], float]:
    """Every sample on ``/metrics``, by (name, sorted labels)."""
    _, text = get(f"http://{address}:{port}/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def listening(port: int) -> set[str]:
    """The IPv4 addresses a socket of this host listens on at ``port`` (/proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


class Replica:
    """A coordinator process and where it serves its metrics."""

    def __init__(self, pipeline: Pipeline, name: str, tmp_path: Path, address: str | None = None) -> None:
        self.pipeline, self.name = pipeline, name
        self.address, self.port = address or "127.0.0.1", free_port()
        flags = ["--metrics-port", str(self.port)] + (["--metrics-address", address] if address else [])
        self.log = tmp_path / f"{name}.log"
        self.proc = spawn(pipeline.config_path, name, self.log, *flags)

    def value(self, metric: str, **labels: str) -> float | None:
        key = (metric, tuple(sorted({"pipeline": self.pipeline.cfg.name, **labels}.items())))
        return scrape(self.address, self.port).get(key)

    def names(self) -> set[str]:
        return {name for name, _ in scrape(self.address, self.port)}

    def ready(self) -> tuple[int, str]:
        return get(f"http://{self.address}:{self.port}/ready")


def test_a_standby_exports_leader_0_and_the_leader_its_commits_then_they_swap(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("metrics"))
    produced = pipeline.produce(400)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
        first = Replica(pipeline, "first", tmp_path)
        second = None
        try:
            wait_until(lambda: first.value("chtxn_leader") == 1, 60, "the first replica to lead", ignore=(OSError,))
            _, line = wait_until(
                lambda: (r := first.ready())[0] == 200 and r, 60, "the leader ready after its take-over"
            )
            assert line == "ready: leader of epoch 1\n"
            second = Replica(pipeline, "second", tmp_path, address="127.0.0.2")
            wait_until(lambda: second.ready()[0] == 200, 60, "the standby ready", ignore=(OSError,))
            assert second.ready() == (200, "ready: standby\n")
            assert listening(first.port) == {"127.0.0.1"}  # the default: this host only
            assert listening(second.port) == {"127.0.0.2"}

            # The standby: every series there, leader 0, no leader-only figures.
            assert second.value("chtxn_leader") == 0
            assert second.value("chtxn_epoch") == 0
            assert second.value("chtxn_partitions_live") == 0
            assert second.value("chtxn_last_commit_timestamp_seconds") == 0
            assert not any(name == "chtxn_partition_lag" for name in second.names())
            build = {"pipeline": pipeline.cfg.name, "version": package_version(), "python": platform.python_version()}
            assert [dict(k[1]) for k in scrape(second.address, second.port) if k[0] == "chtxn_build_info"] == [build]
            assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= second.names()

            # The leader: commits, with their time; its partitions live.
            wait_until(lambda: pipeline.target_count() == produced, 60, "the records published")
            last = first.value("chtxn_last_commit_timestamp_seconds")
            assert last is not None and time.time() - 60 < last <= time.time()
            assert first.value("chtxn_partitions_live") == len(pipeline.partitions)
            assert "chtxn_participants_alive" not in first.names()

            # SIGTERM the leader: the standby takes over, and its series say so.
            stop(first.proc)
            assert first.proc.returncode == 0, first.log.read_text()
            wait_until(lambda: second.value("chtxn_leader") == 1, 60, "the standby to lead")
            wait_until(lambda: second.ready() == (200, "ready: leader of epoch 2\n"), 60, "the new leader ready")
            assert second.value("chtxn_epoch") == 2
            more = pipeline.produce(200, start_id=produced)
            produced += more
            wait_until(lambda: pipeline.target_count() == produced, 60, "the new leader's records published")
            wait_until(
                lambda: (second.value("chtxn_last_commit_timestamp_seconds") or 0) > last,
                30,
                "the new leader's commit time",
            )
        finally:
            stop(first.proc)
            if second is not None:
                stop(second.proc)
    assert second.proc.returncode == 0, second.log.read_text()
    assert_exactly_once(pipeline, produced)


def test_ready_is_503_naming_what_failed_while_clickhouse_is_unreachable(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("unready"))
    port, dead = free_port(), free_port()
    env = {"CHTXN_CLICKHOUSE_URL": f"http://127.0.0.1:{dead}"}
    log = tmp_path / "unready.log"
    proc = spawn(pipeline.config_path, "unready", log, "--metrics-port", str(port), env=env)
    try:
        status, line = wait_until(
            lambda: (r := get(f"http://127.0.0.1:{port}/ready"))[1].startswith("not ready: restarting") and r,
            60,
            "/ready to name the failure",
            ignore=(OSError,),
        )
        assert status == 503
        assert line.count("\n") == 1 and "cannot connect to ClickHouse" in line, line
        assert f"127.0.0.1:{dead}" in line
        _, metrics = get(f"http://127.0.0.1:{port}/metrics")  # the metrics stay served
        assert f'chtxn_leader{{pipeline="{pipeline.cfg.name}"}} 0.0' in metrics
    finally:
        stop(proc)
    assert proc.returncode == 0, log.read_text()


def test_a_metrics_port_that_cannot_be_bound_is_one_line_naming_the_address(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("badbind"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for address, why in ((None, "in use"), ("256.0.0.1", "cannot resolve")):
            flags = ["--metrics-port", str(port)] + (["--metrics-address", address] if address else [])
            result = subprocess.run(
                [str(CHTXN), "coordinator", "--config", str(pipeline.config_path), *flags],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 1, result.stderr
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert lines[0].startswith(f"chtxn: cannot serve metrics on {address or '127.0.0.1'}:{port}: ")
            assert why in lines[0].lower() and "--metrics-address" in lines[0]


def test_the_server_answers_ready_from_the_readiness_and_metrics_on_every_other_path():
    metrics, readiness = CoordinatorMetrics("served"), Readiness()
    server = MetricsServer(metrics.registry, readiness, address="127.0.0.1", port=0)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(f"{base}/ready") == (503, "not ready: starting (connecting to ClickHouse and the broker)\n")
        readiness.standby()
        assert get(f"{base}/ready/") == (200, "ready: standby\n")
        for path in ("/metrics", "/"):
            status, text = get(base + path)
            assert status == 200
            assert 'chtxn_leader{pipeline="served"} 0.0' in text
    finally:
        server.stop()


def test_the_leader_exports_each_participant_copys_figures_and_a_standby_none(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("figures"))
    with (
        coordinator(pipeline, coordinator_id="figures-a") as first,
        participants(pipeline, tasks=2),
    ):
        wait_until(lambda: first.epoch == 1, 60, "the first replica to lead")
        with coordinator(pipeline, coordinator_id="figures-b") as second:
            servers = [
                MetricsServer(s.metrics.registry, s.readiness, address="127.0.0.1", port=0) for s in (first, second)
            ]
            for server in servers:
                server.start()
            try:
                produced = pipeline.produce(600)
                wait_until(lambda: pipeline.target_count() == produced, 60, "the records published")

                def figures(server: MetricsServer) -> dict[str, dict[str, float]]:
                    """Per participant figure, its value per participant copy, from one scrape of ``server``."""
                    found: dict[str, dict[str, float]] = {}
                    for (sample, labels), value in scrape("127.0.0.1", server.port).items():
                        if sample.startswith("chtxn_participant_") and dict(labels)["pipeline"] == pipeline.cfg.name:
                            found.setdefault(sample, {})[dict(labels)["participant"]] = value
                    return found

                def all_reported() -> dict[str, dict[str, float]] | None:
                    """The leader's figures once every row read and a chunk staged by each copy are in them."""
                    f = figures(leader)
                    rows, chunks = (
                        f.get("chtxn_participant_rows_read_total", {}),
                        f.get("chtxn_participant_chunks_staged_total", {}),
                    )
                    done = sum(rows.values()) >= produced and len(chunks) == 2 and all(chunks.values())
                    return f if done else None

                leader, standby = servers
                reported = wait_until(all_reported, 30, "the participants' heartbeats to report their work")
                rows = reported["chtxn_participant_rows_read_total"]
                assert set(rows) == {"task-0", "task-1"} and all(v > 0 for v in rows.values()), rows
                chunks = reported["chtxn_participant_chunks_staged_total"]
                inserts = reported["chtxn_participant_insert_seconds_count"]
                seconds = reported["chtxn_participant_insert_seconds_sum"]
                assert all(inserts[p] >= chunks[p] and seconds[p] > 0 for p in rows), (chunks, inserts, seconds)
                assert set(reported["chtxn_participant_retries_total"]) == set(rows)  # 0 unless ClickHouse failed
                assert second.epoch == 0, "the second replica stands by"
                names = {name for name, _ in scrape("127.0.0.1", standby.port)}
                assert not {n for n in names if n.startswith("chtxn_participant_")}, "a standby exports none"
            finally:
                for server in servers:
                    server.stop()
    assert_exactly_once(pipeline, produced)
