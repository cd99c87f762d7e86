"""``chtxn doctor`` run as an operator runs it, against the session's broker and ClickHouse (and the
ClickHouse configured for a real ZooKeeper): it passes on a sound pipeline in both commit-point modes,
and for each misconfiguration it fails, exit code 1, naming the failing check and the fix."""

from __future__ import annotations

import json
import socket
import time
from functools import partial
from pathlib import Path

import clickhouse_connect
import pytest

from procs import free_port
from protocol import shards as shard_rules
from tests.helpers import create_topic, run_chtxn, unique_name, wait_until
from tests.pipelines import Pipeline, make_pipeline
from tests.sharded import client_of, config_with_shards, make_sharded_pipeline, more_shards

chtxn = partial(run_chtxn, timeout_s=240, installed=True, inherit_chtxn_vars=False, env={"COLUMNS": "200"})


def doctor(pipeline: Pipeline, *extra: str, config: Path | None = None) -> tuple[int, dict[str, dict], str]:
    """Exit code, the checks by name, and stderr of ``chtxn doctor --json`` (on ``config``, else the pipeline's)."""
    result = chtxn("doctor", "--config", str(config or pipeline.config_path), "--json", *extra)
    report = json.loads(result.stdout)
    assert report["ok"] == (result.returncode == 0), result.stdout
    return result.returncode, {c["name"]: c for c in report["checks"]}, result.stderr


def failing(checks: dict[str, dict]) -> list[str]:
    return [name for name, c in checks.items() if c["status"] == "fail"]


def with_ledger_section(pipeline: Pipeline, text: str) -> Pipeline:
    """``pipeline`` with ``[ledger]`` lines appended to its config file (make_pipeline writes none)."""
    pipeline.config_path.write_text(pipeline.config_path.read_text() + f"[ledger]\n{text}\n")
    return pipeline


def sql(stack, statement: str, **settings: object) -> None:  # stack: a TestStack
    client = stack.clickhouse_client()
    try:
        client.command(statement, settings=settings or None)
    finally:
        client.close()


def probe_tables(stack, database: str) -> list[str]:  # stack: a TestStack
    client = stack.clickhouse_client()
    try:
        query = "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, 'chtxn_doctor_')"
        return [r[0] for r in client.query(query, parameters={"db": database}).result_rows]
    finally:
        client.close()


# ---- passes -------------------------------------------------------------------------------------


def test_doctor_passes_on_the_embedded_stack_with_the_token_commit_point(stack, tmp_path: Path) -> None:
    pipeline = make_pipeline(stack, tmp_path, unique_name("doc_ok"))
    code, checks, _ = doctor(pipeline)
    assert code == 0 and failing(checks) == [], checks
    assert checks["commit point"]["found"] == "token: the ledger's deduplication, on one server"
    assert checks["keeper"]["found"] == "not probed: ledger.commit_point = token"
    assert checks["control topic"]["status"] == checks["dead-letter transactions"]["status"] == "ok"

    table = chtxn("doctor", "--config", str(pipeline.config_path))
    assert table.returncode == 0, table.stdout + table.stderr
    assert "exactly-once: no check failed" in table.stdout
    assert any(line.split()[:3] == ["server", "version", "ok"] for line in table.stdout.splitlines())


def test_doctor_passes_with_the_keeper_commit_point_and_leaves_no_probe_behind(keeper_stack, tmp_path: Path) -> None:
    name = unique_name("doc_kok")
    pipeline = make_pipeline(keeper_stack, tmp_path, name, settings={"ledger.commit_point": "keeper"})
    nodes = keeper_nodes(keeper_stack)
    code, checks, _ = doctor(pipeline)
    assert code == 0 and failing(checks) == [], checks
    assert checks["keeper"]["status"] == "ok"
    assert checks["keeper"]["found"].startswith(f"KeeperMap probe at /chtxn/{name}/doctor-")
    assert "a second was refused, the key read back" in checks["keeper"]["found"]
    assert probe_tables(keeper_stack, name) == []
    assert keeper_nodes(keeper_stack) == nodes  # the probe's znodes went with its table


def keeper_nodes(keeper_stack) -> int:  # keeper_stack: a TestStack
    """How many znodes ZooKeeper holds (its ``srvr`` answer)."""
    [line] = [line for line in keeper_stack.keeper.ask("srvr").splitlines() if line.startswith("Node count:")]
    return int(line.removeprefix("Node count:"))


# ---- fails, naming the fix ---------------------------------------------------------------------


def test_a_control_topic_with_three_partitions(stack, kafka_admin, tmp_path: Path) -> None:
    control = create_topic(kafka_admin, unique_name("doc_ctl"), 3)
    pipeline = make_pipeline(stack, tmp_path, unique_name("doc_ctl"), settings={"pipeline.control_topic": control})
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["control topic"])
    assert checks["control topic"]["found"] == f"{control}: 3 partition(s)"
    assert checks["control topic"]["fix"] == (
        f"control topic {control} has 3 partitions; chtxn needs exactly 1: delete and recreate it with one "
        "partition, or point pipeline.control_topic at a new topic"
    )


def test_a_missing_target_table(stack, tmp_path: Path) -> None:
    name = unique_name("doc_notarget")
    pipeline = make_pipeline(stack, tmp_path, name, settings={"clickhouse.target_table": "nosuch"})
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["target table"])
    assert checks["target table"]["found"] == f"{name}.nosuch does not exist"
    assert checks["target table"]["fix"].startswith(f"target table {name}.nosuch does not exist: create it")


@pytest.mark.parametrize("engine", ["Memory", "Log"])
def test_a_target_outside_the_merge_tree_family(stack, tmp_path: Path, engine: str) -> None:
    name = unique_name(f"doc_{engine.lower()}")
    ddl = f"CREATE TABLE {{db}}.{{table}} (id UInt64, _topic String, _partition Int32, _offset Int64) ENGINE = {engine}"
    code, checks, _ = doctor(make_pipeline(stack, tmp_path, name, target_ddl=ddl))
    assert (code, failing(checks)) == (1, ["target table"])
    assert checks["target table"]["found"].startswith(f"{name}.events: {engine}, not of the MergeTree family")
    assert checks["target table"]["fix"] == (
        f"target table {name}.events has engine {engine}, not of the MergeTree family, which chtxn needs: it "
        "stages into clones of the target and moves their partitions in; recreate it with a MergeTree-family "
        "engine (e.g. ENGINE = MergeTree ORDER BY ...)"
    )


def test_a_distributed_target(stack, tmp_path: Path) -> None:
    # A Distributed table needs a cluster at CREATE; ATTACH (possible in an Ordinary database) skips
    # that check, as a server does for tables it loads at start.
    db = unique_name("doc_dist")
    sql(stack, f"CREATE DATABASE `{db}` ENGINE = Ordinary", allow_deprecated_database_ordinary=1)
    sql(stack, f"CREATE TABLE `{db}`.events_local (id UInt64) ENGINE = MergeTree ORDER BY id")
    sql(stack, f"ATTACH TABLE `{db}`.events (id UInt64) ENGINE = Distributed('shards', '{db}', 'events_local', rand())")
    pipeline = make_pipeline(stack, tmp_path, unique_name("doc_dist"), settings={"clickhouse.database": db})
    code, checks, _ = doctor(pipeline)
    # its cluster is not defined here, so its shards cannot be learnt (docs/clusters.md, A Distributed target)
    assert (code, failing(checks)) == (1, ["learnt shards", "target table"])
    assert checks["learnt shards"]["fix"].startswith(
        f"target table {db}.events is a Distributed table on cluster shards, which the server at clickhouse.url does "
        "not define in system.clusters: list one server of every shard in clickhouse.shards"
    )
    assert checks["target table"]["found"] == f"{db}.events: Distributed over {db}.events_local (cluster shards)"
    assert checks["target table"]["fix"].startswith(
        f"target table {db}.events is a Distributed table over {db}.events_local on cluster shards; chtxn publishes "
        "by moving partitions between tables of one server, which a Distributed table has not: set "
        'clickhouse.target_table = "events_local", and list one server of every shard of cluster shards in '
        "clickhouse.shards"
    )


def test_move_into_a_target_with_a_materialized_view(stack, tmp_path: Path) -> None:
    name = unique_name("doc_view")
    pipeline = make_pipeline(stack, tmp_path, name)
    sql(
        stack,
        f"CREATE MATERIALIZED VIEW `{name}`.totals ENGINE = MergeTree ORDER BY id AS SELECT id FROM `{name}`.events",
    )
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["materialized views"])
    assert checks["materialized views"]["found"] == f"1 on the target ({name}.totals), publish_mode = move"
    assert checks["materialized views"]["fix"].endswith('set transaction.publish_mode = "insert-select"')


def test_insert_select_into_a_target_without_a_deduplication_window(stack, tmp_path: Path) -> None:
    name = unique_name("doc_nodedup")
    pipeline = make_pipeline(stack, tmp_path, name, settings={"transaction.publish_mode": "insert-select"})
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["dedup: target"])
    assert checks["dedup: target"]["found"].startswith("non_replicated_deduplication_window = 0 (server default)")
    assert checks["dedup: target"]["fix"].endswith(
        f"ALTER TABLE {name}.events MODIFY SETTING non_replicated_deduplication_window = 1000"
    )


def test_the_keeper_commit_point_on_a_server_without_keeper(stack, tmp_path: Path) -> None:
    pipeline = with_ledger_section(
        make_pipeline(stack, tmp_path, unique_name("doc_nokeeper")), 'commit_point = "keeper"'
    )
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["keeper"])
    assert "the server has no KeeperMap" in checks["keeper"]["found"]
    assert checks["keeper"]["fix"] == (
        "configure <zookeeper> (or <keeper>) and <keeper_map_path_prefix> in the server config; "
        'or set ledger.commit_point = "token" (one server only)'
    )


def test_the_keeper_commit_point_with_zookeeper_stopped(keeper_stack, tmp_path: Path) -> None:
    name = unique_name("doc_zkdown")
    pipeline = make_pipeline(keeper_stack, tmp_path, name, settings={"ledger.commit_point": "keeper"})
    keeper_stack.keeper.stop()
    try:
        started = time.monotonic()
        code, checks, _ = doctor(pipeline)
        took = time.monotonic() - started
    finally:
        keeper_stack.restart_keeper()
        _wait_for_keeper_map(keeper_stack, name)
    assert (code, failing(checks)) == (1, ["keeper"])
    assert "Keeper did not answer" in checks["keeper"]["found"]
    assert checks["keeper"]["fix"].startswith("start Keeper (or ZooKeeper), or fix <zookeeper> in the server config")
    assert took < 120, f"doctor took {took:.0f} s with ZooKeeper down"
    assert "no answer within 4 s to CREATE TABLE" in checks["keeper"]["found"], "the probe waited past its bound"
    assert probe_tables(keeper_stack, name) == []


def _wait_for_keeper_map(keeper_stack, database: str) -> None:  # keeper_stack: a TestStack
    """Return once the restarted ZooKeeper serves KeeperMap reads again (the other tests need it)."""
    client = keeper_stack.clickhouse_client()
    try:
        wait_until(
            lambda: client.query(f"SELECT count() FROM `{database}`.chtxn_claims").result_rows is not None,
            60,
            "KeeperMap to answer after ZooKeeper's restart",
            interval_s=0.2,
            ignore=(clickhouse_connect.driver.exceptions.DatabaseError,),
        )
    finally:
        client.close()


def test_a_replicated_target_with_the_token_commit_point(keeper_stack, tmp_path: Path) -> None:
    name = unique_name("doc_repl")
    ddl = (
        "CREATE TABLE {db}.{table} (id UInt64, _topic String, _partition Int32, _offset Int64) "
        f"ENGINE = ReplicatedMergeTree('/chtxn_tests/{name}/events', 'r1') ORDER BY id"
    )
    code, checks, _ = doctor(make_pipeline(keeper_stack, tmp_path, name, target_ddl=ddl))
    assert code == 1 and "commit point" in failing(checks)
    assert checks["commit point"]["fix"].startswith('set ledger.commit_point = "keeper"')
    assert checks["keeper"]["status"] == "ok"  # probed: switching would work
    assert checks["macros"]["status"] == "ok"  # the embedded keeper config defines shard and replica
    assert checks["quorum"]["fix"] == "set clickhouse.cluster to the target's cluster"


def test_a_missing_source_topic(stack, tmp_path: Path) -> None:
    name = unique_name("doc_nosrc")
    missing = unique_name("doc_nosuch")
    pipeline = make_pipeline(stack, tmp_path, name, settings={"pipeline.topics": [f"{name}_events", missing]})
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["source topics"])
    assert checks["source topics"]["found"] == f"missing: {missing}; found {name}_events (2 partitions)"
    assert checks["source topics"]["fix"] == (
        f"create them (e.g. kafka-topics.sh --create --topic {missing} --partitions N) or fix pipeline.topics"
    )


def test_an_unreachable_broker_is_one_line_within_the_timeout(stack, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    pipeline = make_pipeline(stack, tmp_path, unique_name("doc_nobroker"), settings={"kafka.bootstrap_servers": closed})
    started = time.monotonic()
    code, checks, stderr = doctor(pipeline, "--timeout", "2")
    took = time.monotonic() - started
    assert (code, failing(checks)) == (1, ["kafka broker"])
    assert checks["kafka broker"]["found"].startswith(f"cannot reach a Kafka broker at {closed} within 2 s")
    assert checks["kafka broker"]["fix"] == "start the broker or fix [kafka]"
    assert not {"control topic", "source topics", "dead-letter transactions"} & set(checks)
    assert stderr == "", stderr  # no librdkafka log lines
    assert took < 30, f"doctor took {took:.0f} s with the broker unreachable"

    table = chtxn("doctor", "--config", str(pipeline.config_path), "--timeout", "2")
    assert table.returncode == 1 and table.stderr == ""
    [line] = [line for line in table.stdout.splitlines() if line.startswith("kafka broker")]
    assert f"cannot reach a Kafka broker at {closed} within 2 s" in line
    assert "exactly-once: 1 check(s) failed: kafka broker" in table.stdout


# ---- a sharded ClickHouse ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shard_urls(stack, tmp_path_factory):
    """Three shards: the stack's endpoint and two more embedded ones, each its own chDB process and data."""
    with more_shards(stack, tmp_path_factory.mktemp("doctor_shards"), 2) as shards:
        yield shards.urls


def test_sharded_the_checks_are_made_on_every_shard_and_the_ledgers_once(stack, shard_urls, tmp_path: Path) -> None:
    name = unique_name("doc_shards")
    pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, name)
    code, checks, _ = doctor(pipeline)
    assert code == 0 and failing(checks) == [], checks
    assert checks["target table"]["found"] == f"all 3 shards: {name}.events: MergeTree"
    assert checks["metadata columns"]["found"].startswith("all 3 shards: _topic, _partition, _offset")
    ledger = f"the ledger's server ({shard_rules.address(shard_urls[0])})"
    assert checks["commit point"]["found"] == f"{ledger}: token: the ledger's deduplication, on one server"
    assert checks["shard tables"] == {
        "name": "shard tables",
        "status": "ok",
        "found": f"{name}.events: the same columns and types, sorting key and partition key on 3 shards",
        "fix": "",
    }


def test_sharded_a_column_of_another_type_on_one_shard_fails_naming_it(stack, shard_urls, tmp_path: Path) -> None:
    name = unique_name("doc_shtype")
    pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, name)
    client_of(shard_urls[2]).command(f"ALTER TABLE `{name}`.events MODIFY COLUMN amount Float32")
    code, checks, _ = doctor(pipeline)
    assert (code, failing(checks)) == (1, ["shard tables"])
    third = shard_rules.where(2, shard_urls[2])
    assert checks["shard tables"]["found"] == f"{third}: column amount is Float32, shard 1 has Float64"
    assert checks["shard tables"]["fix"].startswith(f"ALTER TABLE {name}.events on shard 3 (or on the others)")

    table = chtxn("doctor", "--config", str(pipeline.config_path))
    assert table.returncode == 1, table.stdout + table.stderr
    [line] = [line for line in table.stdout.splitlines() if line.startswith("shard tables")]
    assert line.split()[2] == "fail" and f"{third}: column amount is Float32" in line, line
    assert "exactly-once: 1 check(s) failed: shard tables" in table.stdout


def test_sharded_an_unreachable_shard_is_named_with_what_to_do(stack, shard_urls, tmp_path: Path) -> None:
    name = unique_name("doc_shdown")
    pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, name)
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    config = config_with_shards(pipeline, [*shard_urls, dead], tmp_path / "four.toml")
    code, checks, _ = doctor(pipeline, config=config)
    assert (code, failing(checks)) == (1, ["clickhouse"])
    fourth = shard_rules.where(3, dead)
    assert checks["clickhouse"]["found"].startswith(f"{fourth}: cannot connect to ClickHouse at {dead}")
    assert checks["clickhouse"]["fix"] == "start the server, or fix its URL in clickhouse.shards"
    assert checks["target table"]["found"] == f"shard 1, shard 2, shard 3: {name}.events: MergeTree"
    assert checks["shard tables"]["found"].endswith("on 3 shards (1 not read)")


def test_sharded_by_a_key_that_is_no_integer_fails_and_an_integer_key_passes(stack, shard_urls, tmp_path: Path) -> None:
    """A Distributed table places a row by an integer key; every shard's server evaluates the key over its target."""
    for key, status, kind in (("user", "fail", "String"), ("cityHash64(user)", "ok", "UInt64")):
        settings = {"clickhouse.placement": "sharding-key", "clickhouse.sharding_key": key}
        pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, unique_name("doc_shkey"), settings=settings)
        code, checks, _ = doctor(pipeline)
        assert (code, checks["sharding key"]["status"]) == (int(status == "fail"), status), checks
        name = pipeline.cfg.clickhouse.database
        assert checks["sharding key"]["found"].startswith(f"all 3 shards: {key} over {name}.events is {kind}")


def test_before_chtxn_init_the_missing_ledger_is_said_in_a_line_with_what_to_do(stack, tmp_path: Path) -> None:
    pipeline = make_pipeline(stack, tmp_path, unique_name("doc_noledger"))
    sql(stack, f"DROP TABLE `{pipeline.cfg.clickhouse.database}`.chtxn_ledger SYNC")
    _, checks, _ = doctor(pipeline)
    assert checks["dedup: ledger"]["status"] == "warn"
    assert checks["partition logs"] == {
        "name": "partition logs",
        "status": "warn",
        "found": "no ledger yet",
        "fix": "run chtxn init",
    }
