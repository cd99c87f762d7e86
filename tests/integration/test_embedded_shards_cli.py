"""``chtxn embedded up --shards N`` as a user runs it: N ClickHouse endpoints, each its own process,
all in one cluster; ``status`` and ``--json`` show every shard, a killed shard comes back on its port
(the others untouched), a grown cluster restarts the running shards with it, fewer shards than the
data directory holds are refused, and ``down`` leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path

import clickhouse_connect
import pytest

from procs import port_is_free
from tests.helpers import gone, run_chtxn, wait_until

chtxn = partial(run_chtxn, check=True)
CLUSTERS = "SELECT shard_num, port, is_local FROM system.clusters WHERE cluster = 'chtxn_shards' ORDER BY shard_num"


@pytest.fixture
def data_dir(tmp_path: Path):
    """A data directory whose stack is brought down at the end, whatever the test did."""
    directory = tmp_path / "embedded"
    yield directory
    chtxn("embedded", "down", "--data-dir", str(directory), check=False)


def up(data_dir: Path, *extra: str, check: bool = True):
    ports = ("--kafka-port", "0", "--clickhouse-port", "0")
    return chtxn("embedded", "up", "--data-dir", str(data_dir), *ports, "--json", *extra, check=check)


def status(data_dir: Path) -> tuple[int, dict]:
    result = chtxn("embedded", "status", "--data-dir", str(data_dir), "--json", check=False)
    return result.returncode, json.loads(result.stdout)


def clusters(url: str) -> list[tuple]:
    client = clickhouse_connect.get_client(dsn=url)
    try:
        return [tuple(r) for r in client.query(CLUSTERS).result_rows]
    finally:
        client.close()


def test_up_shards_status_a_killed_shard_and_down(data_dir: Path) -> None:
    started = json.loads(up(data_dir, "--shards", "2").stdout)
    assert started["started"] == ["kafka", "clickhouse", "clickhouse-shard2"]
    shards = started["clickhouse_shards"]
    assert len(shards) == 2 and shards[0] == started["clickhouse_url"]
    assert [started["components"][n]["address"] for n in ("clickhouse", "clickhouse-shard2")] == shards
    assert started["env"]["CHTXN_CLICKHOUSE_SHARDS"] == ",".join(shards)
    assert started["env"]["CHTXN_CLICKHOUSE_URL"] == shards[0]
    assert started["cluster"] == "chtxn_shards"
    ports = [started["components"][n]["port"] for n in ("clickhouse", "clickhouse-shard2")]
    assert [clusters(url) for url in shards] == [
        [(1, ports[0], 1), (2, ports[1], 0)],
        [(1, ports[0], 0), (2, ports[1], 1)],
    ]

    code, report = status(data_dir)
    assert code == 0 and report["up"] is True
    assert {n: (c["running"], c["answering"]) for n, c in report["components"].items()} == {
        "kafka": (True, True),
        "clickhouse": (True, True),
        "clickhouse-shard2": (True, True),
    }

    # Shard 2 killed: status says so; `up` (no --shards: the data directory holds 2) starts it alone, on its port.
    victim = started["components"]["clickhouse-shard2"]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: gone(victim) and port_is_free("127.0.0.1", ports[1]), 30, "shard 2 to exit and free its port")
    code, report = status(data_dir)
    assert code == 1 and report["components"]["clickhouse-shard2"]["running"] is False
    again = json.loads(up(data_dir).stdout)
    assert again["started"] == ["clickhouse-shard2"] and again["notes"] == []
    assert again["clickhouse_shards"] == shards
    assert again["components"]["clickhouse"]["pid"] == started["components"]["clickhouse"]["pid"]

    refused = up(data_dir, "--shards", "1", check=False)
    assert refused.returncode == 1
    assert "holds the data of 2 ClickHouse shards" in refused.stderr and "--shards 2" in refused.stderr

    pids = [c["pid"] for c in again["components"].values()]
    down = chtxn("embedded", "down", "--data-dir", str(data_dir))
    assert "ClickHouse endpoint (chDB), shard 2" in down.stdout
    for pid in pids:
        wait_until(lambda pid=pid: gone(pid), 30, f"pid {pid} of the stack to exit")
    assert status(data_dir)[0] == 1


def test_a_grown_cluster_restarts_the_running_shards_with_it(data_dir: Path) -> None:
    first = json.loads(up(data_dir).stdout)
    assert first["clickhouse_shards"] == [first["clickhouse_url"]] and first["cluster"] is None
    assert "CHTXN_CLICKHOUSE_SHARDS" not in first["env"]
    client = clickhouse_connect.get_client(dsn=first["clickhouse_url"])
    client.command("CREATE TABLE kept (id UInt64) ENGINE = MergeTree ORDER BY id")
    client.command("INSERT INTO kept VALUES (7)")
    client.close()

    grown = json.loads(up(data_dir, "--shards", "3", "--cluster", "three").stdout)
    assert grown["started"] == ["clickhouse", "clickhouse-shard2", "clickhouse-shard3"]
    assert grown["clickhouse_url"] == first["clickhouse_url"]  # shard 1 restarted on its port
    assert any("restarted on port" in n and "its data kept" in n for n in grown["notes"]), grown["notes"]
    assert grown["cluster"] == "three"
    client = clickhouse_connect.get_client(dsn=grown["clickhouse_url"])
    assert client.query("SELECT id FROM kept").result_rows == [(7,)]
    assert client.command("SELECT count() FROM system.clusters WHERE cluster = 'three'") == 3
    client.close()


def test_up_help_has_a_shards_example_and_a_bad_cluster_name_starts_nothing(data_dir: Path) -> None:
    text = chtxn("embedded", "up", "--help").stdout
    assert "chtxn embedded up --shards 3 --json" in text and "--cluster" in text
    bad = up(data_dir, "--shards", "2", "--cluster", "9lives", check=False)
    assert bad.returncode == 1 and "a cluster name is letters, digits and _" in bad.stderr
    assert status(data_dir)[0] == 1 and not (data_dir / "state.json").exists()
