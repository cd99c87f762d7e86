"""A pipeline into a sharded ClickHouse (``clickhouse.shards``, issue 39): three real embedded
endpoints, each its own chDB process and data; the real coordinator service and participant tasks
in threads. Each test ends with the oracle over the union of the shards (``tests.sharded``)."""

from __future__ import annotations

import json

import pytest

from clients import failpoints
from procs import free_port
from protocol import shards as shard_rules
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.sharded import (
    assert_exactly_once_over_shards,
    client_of,
    config_with_shards,
    make_sharded_pipeline,
    more_shards,
    rows_per_shard,
    stage_tables_on_shards,
    union_count,
)

WAIT_S = 60.0


@pytest.fixture(scope="module")
def shard_urls(stack, tmp_path_factory):
    with more_shards(stack, tmp_path_factory.mktemp("shards"), 2) as shards:
        yield shards.urls


def test_each_partition_is_staged_on_its_shard_and_committed_once_over_all(stack, shard_urls, tmp_path):
    pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, unique_name("shard"), partitions=6)
    produced = pipeline.produce(1_200)
    with participants(pipeline, tasks=2), coordinator(pipeline):
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed over the shards")
        produced += pipeline.produce(600, start_id=produced)
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "the second batch committed")
    assert_exactly_once_over_shards(pipeline, produced)
    placed = {shard_rules.shard_of(tp.topic, tp.partition, 3) for tp in pipeline.partitions}
    assert placed == {0, 1, 2}, "six partitions of one topic go round the three shards"
    assert all(rows for rows in rows_per_shard(pipeline)), "every shard holds rows"
    wait_until(lambda: stage_tables_on_shards(pipeline) == [], WAIT_S, "no stage table left on any shard")


def test_a_txn_has_stage_tables_only_on_the_shards_whose_partitions_have_records_waiting(stack, shard_urls, tmp_path):
    """Per-txn cost grows with the shards a txn touches, not with those that exist: records wait in shard
    1's partitions only, so the txns make their stage tables there alone; then records arrive in shard
    3's partitions, whose holders stage nothing into the txn under way (its shard has no stage table)
    and the next txn takes them. Shard 2 never gets a stage table once the leader knows where records
    wait (its first txns, before any heartbeat told a log end, are on every shard)."""
    pipeline = make_sharded_pipeline(
        stack,
        shard_urls,
        tmp_path,
        unique_name("shtouch"),
        partitions=6,
        settings={"transaction.idle_interval_s": 0.5},  # idle txns end at the interval: a stream of empty txns
    )
    on = {tp.partition: shard_rules.shard_of(tp.topic, tp.partition, 3) for tp in pipeline.partitions}
    address = [shard_rules.address(url) for url in shard_urls]
    with participants(pipeline, tasks=2), coordinator(pipeline):
        produced = pipeline.produce(600, into=[p for p, shard in on.items() if shard == 0])
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "shard 1's records committed")
        wait_until(lambda: not pipeline.ledger().commits()[-1].shards, WAIT_S, "a txn with no records waiting")
        since = pipeline.ledger().commits()[-1].commit_seq
        produced += pipeline.produce(300, start_id=produced, into=[p for p, shard in on.items() if shard == 2])
        produced += pipeline.produce(300, start_id=produced, into=[p for p, shard in on.items() if shard == 0])
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "shard 3's and shard 1's records committed")
    later = [c for c in pipeline.ledger().commits() if c.commit_seq > since and c.txn.startswith("e")]
    assert later and all(address[1] not in c.shards for c in later), [c.shards for c in later]
    for commit in later:  # each partition with rows in a txn is on one of its shards
        assert {address[on[r.partition]] for r in commit.ranges if r.rows} <= set(commit.shards), commit
    assert {address[2], address[0]} <= {a for c in later for a in c.shards}
    assert_exactly_once_over_shards(pipeline, produced)
    assert rows_per_shard(pipeline)[1] == [], "shard 2 never received a row"
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    wait_until(lambda: stage_tables_on_shards(pipeline) == [], WAIT_S, "no stage table left on any shard")


def test_verify_deep_counts_every_offset_over_the_shards(stack, shard_urls, tmp_path):
    """``chtxn verify --deep`` agrees with the oracle over the union of the shards, and fails on a row of
    shard 1 copied into shard 3: a duplicate no check of one shard alone could see."""
    pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, unique_name("shver"), partitions=6)
    produced = pipeline.produce(900)
    with participants(pipeline, tasks=2), coordinator(pipeline):
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed over the shards")
    assert_exactly_once_over_shards(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    (report,) = json.loads(verified.stdout)["tables"].values()
    assert report["rows_in_target"] == produced, report

    db = pipeline.cfg.clickhouse.database
    (row,) = client_of(shard_urls[0]).query(f"SELECT * FROM `{db}`.`events` LIMIT 1").result_rows
    client_of(shard_urls[2]).insert(
        f"{db}.events", [row], column_names=["id", "user", "amount", "_topic", "_partition", "_offset"]
    )
    doubled = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep")
    assert doubled.returncode == 1, doubled.stdout + doubled.stderr
    assert "1 duplicates" in doubled.stdout and "FAILED" in doubled.stdout


def test_by_a_sharding_key_each_row_goes_where_the_distributed_table_would_put_it(stack, shard_urls, tmp_path):
    """``clickhouse.placement = "sharding-key"`` with weights 1, 2, 1: the rows of every source partition
    spread over the three shards as ClickHouse's Distributed table places them (the key modulo the
    total weight, shard 2 owning two slots), each row once, parsed by one server per chunk."""
    pipeline = make_sharded_pipeline(
        stack,
        shard_urls,
        tmp_path,
        unique_name("shkey"),
        partitions=3,  # record i goes to partition i % 3, and to shard slot i % 4
        settings={
            "clickhouse.placement": "sharding-key",
            "clickhouse.sharding_key": "id",
            "clickhouse.shard_weights": [1, 2, 1],
        },
    )
    produced = pipeline.produce(2_000)
    with participants(pipeline, tasks=2), coordinator(pipeline):
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed over the shards")
    assert_exactly_once_over_shards(pipeline, produced, by_partition=False)
    db, owner = pipeline.cfg.clickhouse.database, [0, 1, 1, 2]
    for i, url in enumerate(shard_urls):
        ids = [r[0] for r in client_of(url).query(f"SELECT id FROM `{db}`.`events`").result_rows]
        assert ids and all(owner[n % 4] == i for n in ids), f"shard {i + 1} holds rows of another shard"
        partitions = client_of(url).command(f"SELECT uniqExact(_partition) FROM `{db}`.`events`")
        assert int(partitions) == 3, "every source partition is spread over every shard"
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep")
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("key_type", ["Int8", "UInt16", "Int32", "Int64", "UInt64"])
def test_placement_by_key_is_the_distributed_tables_for_every_integer_width(stack, key_type):
    """ClickHouse's ``createBlockSelector``: a key of 32 bits or fewer is taken as a ``UInt32`` (a negative
    one sign-extended first), a wider one as a ``UInt64``, modulo the total weight, into the slots."""
    weights = [2, 1, 3]
    sql = shard_rules.placement_sql("x", weights, ["s0", "s1", "s2"])
    rows = (
        client_of(stack.clickhouse_url)
        .query(f"SELECT x, {sql} FROM (SELECT to{key_type}(number * 7919 - 300000) AS x FROM numbers(1000))")
        .result_rows
    )
    bits = 32 if key_type in ("Int8", "UInt16", "Int32") else 64
    owner = shard_rules.slots(weights)
    assert [f"s{owner[(int(x) % 2**bits) % len(owner)]}" for x, _ in rows] == [placed for _, placed in rows]


def test_status_and_txn_show_give_each_shard_its_rows_and_stage_tables(stack, shard_urls, tmp_path):
    """With a committed txn held before its publish: ``txn show`` gives its stage table on every shard with
    the rows of the partitions placed there, ``status`` each shard's target rows and staged txns; once
    published, no stage table is left; a fourth shard at a free port fails status's ``shards`` check."""
    pipeline = make_sharded_pipeline(stack, shard_urls, tmp_path, unique_name("shstat"), partitions=6)
    config = str(pipeline.config_path)
    produced = pipeline.produce(900)
    with participants(pipeline, tasks=2), coordinator(pipeline, coordinator_id="c1"):
        publishing = failpoints.arm("leader.before-publish", "pause*1", who="c1")
        try:
            assert publishing.reached.wait(WAIT_S), "no txn reached its publish"
            k = wait_until(
                lambda: next(
                    (t for t in pipeline.ledger().history(limit=50) if t.state == "COMMITTED" and t.total_rows), None
                ),
                WAIT_S,
                "a txn with rows committed and not published (the publishes wait behind the paused one)",
            )
            shown = json.loads(run_chtxn("txn", "show", k.txn, "--config", config, "--json", check=True).stdout)
            placed = [
                sum(r.rows for r in k.ranges if shard_rules.shard_of(r.topic, r.partition, 3) == i) for i in range(3)
            ]
            assert sum(placed) == k.total_rows > 0
            assert shown["shards"] == [
                {
                    "shard": shard_rules.label(i),
                    "address": shard_rules.address(url),
                    "error": "",
                    "stage_tables": [k.stage_table],
                    "rows": placed[i],
                }
                for i, url in enumerate(shard_urls)
            ]
            table = run_chtxn("txn", "show", k.txn, "--config", config, check=True).stdout
            assert f"shard 2  {shard_rules.address(shard_urls[1])}  {k.stage_table}" in table, table

            status = json.loads(run_chtxn("status", "--config", config, "--json").stdout)
            db = pipeline.cfg.clickhouse.database
            for i, (url, shard) in enumerate(zip(shard_urls, status["shards"])):
                assert shard["shard"] == shard_rules.label(i) and shard["error"] == ""
                assert shard["target_rows"] == int(client_of(url).command(f"SELECT count() FROM `{db}`.events"))
                assert k.txn in shard["staged_txns"], shard
            assert {"name": "shards", "status": "ok", "found": "all 3 shards answered", "fix": ""} in status["checks"]
        finally:
            failpoints.release("leader.before-publish")
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed over the shards")
        wait_until(lambda: pipeline.ledger().txn(k.txn).state == "PUBLISHED", WAIT_S, f"{k.txn} published")
        shown = json.loads(run_chtxn("txn", "show", k.txn, "--config", config, "--json", check=True).stdout)
        assert [(s["stage_tables"], s["rows"]) for s in shown["shards"]] == [([], 0)] * 3
    assert_exactly_once_over_shards(pipeline, produced)

    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    four = config_with_shards(pipeline, [*shard_urls, dead], tmp_path / "four.toml")
    result = run_chtxn("status", "--config", str(four), "--json")
    status = json.loads(result.stdout)
    assert result.returncode == 1 and "shards" in status["failed"], result.stdout
    fourth = status["shards"][3]
    assert (fourth["shard"], fourth["target_rows"], fourth["staged_txns"]) == ("shard 4", None, [])
    assert fourth["error"].startswith(f"cannot connect to ClickHouse at {dead}")
    assert [s["target_rows"] for s in status["shards"][:3]] == [len(rows) for rows in rows_per_shard(pipeline)]
    (check,) = [c for c in status["checks"] if c["name"] == "shards"]
    assert check["found"].startswith(f"shard 4 ({shard_rules.address(dead)}): cannot connect")
    lines = run_chtxn("status", "--config", str(four)).stdout.splitlines()
    assert any(line.split()[:3] == ["shard", "4", shard_rules.address(dead)] and " no " in line for line in lines), (
        lines
    )
