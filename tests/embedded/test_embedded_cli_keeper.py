"""``chtxn embedded up --keeper`` as a user runs it: the keeper starts before the ClickHouse endpoint
configured for it, a keeper killed with SIGKILL comes back on its port with its data, and ``down``
leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path

import clickhouse_connect
import pytest

from embedded.ch_engine import CONFIG_FILE
from embedded.keeper import ask
from tests.helpers import gone, run_chtxn, wait_until

chtxn = partial(run_chtxn, check=True)


@pytest.fixture
def data_dir(tmp_path: Path):
    """A data directory whose stack is brought down at the end, whatever the test did."""
    directory = tmp_path / "embedded"
    yield directory
    chtxn("embedded", "down", "--data-dir", str(directory), check=False)


def up(data_dir: Path, *extra: str) -> dict:
    ports = ("--kafka-port", "0", "--clickhouse-port", "0", "--keeper-port", "0")
    return json.loads(chtxn("embedded", "up", "--data-dir", str(data_dir), *ports, "--json", *extra).stdout)


def test_up_keeper_serves_keeper_map_and_survives_a_killed_keeper(data_dir: Path) -> None:
    started = up(data_dir, "--keeper")
    assert started["started"] == ["keeper", "kafka", "clickhouse"]
    keeper = started["components"]["keeper"]
    assert started["keeper"] == keeper["address"] == started["env"]["CHTXN_EMBEDDED_KEEPER"]
    assert started["components"]["clickhouse"]["keeper"] == keeper["address"]
    host, port = keeper["address"].rsplit(":", 1)
    assert ask(host, int(port), "ruok") == "imok"

    client = clickhouse_connect.get_client(dsn=started["clickhouse_url"])
    client.command("CREATE TABLE kv (key String, v String) ENGINE = KeeperMap('/kv') PRIMARY KEY key")
    client.command("INSERT INTO kv VALUES ('x', '1')", settings={"keeper_map_strict_mode": 1})

    status = json.loads(chtxn("embedded", "status", "--data-dir", str(data_dir), "--json").stdout)
    assert status["up"] is True
    assert {n: (c["running"], c["answering"]) for n, c in status["components"].items()} == {
        "keeper": (True, True),
        "kafka": (True, True),
        "clickhouse": (True, True),
    }

    os.kill(keeper["pid"], signal.SIGKILL)
    wait_until(lambda: gone(keeper["pid"]), 30, "the killed keeper to exit")
    assert chtxn("embedded", "status", "--data-dir", str(data_dir), check=False).returncode == 1
    again = up(data_dir)  # no --keeper: the stack has one
    assert again["started"] == ["keeper"]
    assert again["keeper"] == keeper["address"]  # the port the running endpoint was configured with
    wait_until(
        lambda: client.query("SELECT v FROM kv WHERE key = 'x'").result_rows == [("1",)],
        30,
        "the endpoint to read the key through the restarted keeper",
        ignore=(clickhouse_connect.driver.exceptions.DatabaseError,),
    )

    pids = [c["pid"] for c in again["components"].values()]
    down = chtxn("embedded", "down", "--data-dir", str(data_dir), "--purge")
    assert "Keeper (ZooKeeper)" in down.stdout
    for pid in pids:
        wait_until(lambda pid=pid: gone(pid), 30, f"pid {pid} of the stack to exit")
    assert not data_dir.exists()


def test_up_without_keeper_starts_none(data_dir: Path) -> None:
    started = up(data_dir)
    assert started["started"] == ["kafka", "clickhouse"] and started["keeper"] is None
    assert "CHTXN_EMBEDDED_KEEPER" not in started["env"]
    assert not (data_dir / "keeper").exists()
    assert "<zookeeper>" not in (data_dir / "clickhouse" / CONFIG_FILE).read_text()


def test_up_keeper_on_a_running_stack_restarts_clickhouse_with_it_keeping_its_data(data_dir: Path) -> None:
    started = up(data_dir)
    client = clickhouse_connect.get_client(dsn=started["clickhouse_url"])
    client.command("CREATE TABLE kept (id UInt64) ENGINE = MergeTree ORDER BY id")
    client.command("INSERT INTO kept SELECT number FROM numbers(10)")

    again = up(data_dir, "--keeper")
    assert again["started"] == ["keeper", "clickhouse"], again
    assert again["components"]["kafka"]["pid"] == started["components"]["kafka"]["pid"]
    assert again["clickhouse_url"] == started["clickhouse_url"], "the endpoint moved to another port"
    assert again["components"]["clickhouse"]["keeper"] == again["keeper"]
    assert any("restarted on port" in note and "its data kept" in note for note in again["notes"]), again["notes"]
    client = clickhouse_connect.get_client(dsn=again["clickhouse_url"])
    assert client.command("SELECT count() FROM kept") == 10
    client.command("CREATE TABLE kv (key String, v String) ENGINE = KeeperMap('/kv_up') PRIMARY KEY key")
    client.command("INSERT INTO kv VALUES ('x', '1')", settings={"keeper_map_strict_mode": 1})
    assert client.query("SELECT v FROM kv").result_rows == [("1",)]
