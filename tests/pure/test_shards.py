"""Sharded ClickHouse, the pure parts: placement, ``clickhouse.shards`` in the config, step 5's merge
of every shard's check, and the SQL ``verify --deep`` counts the union of the shards with."""

from __future__ import annotations

from collections import Counter

import pytest

from coordinator.stage.shards import merged
from coordinator.stage.tables import StageCheck
from protocol import shards
from protocol.config.parse import parse_config
from protocol.coordinator.events import PartitionStats
from protocol.errors import ConfigError
from protocol.framing import Column, MetadataInsert
from protocol.messages import TopicPartition
from protocol.shards import url_login
from protocol.verify.check import sharded_target_sql
from tests.records import Rec

BASE = """
[pipeline]
name = "orders"
topics = ["src"]

[clickhouse]
url = "http://ch-1:8123"
target_table = "events_local"
"""


def test_a_topics_partitions_go_round_the_shards_in_turn() -> None:
    placed = [shards.shard_of("orders", p, 3) for p in range(12)]
    assert Counter(placed) == {0: 4, 1: 4, 2: 4}
    assert placed[:3] == placed[3:6]  # round and round, from the shard the topic's name picks
    assert shards.shard_of("orders", 5, 3) == shards.shard_of("orders", 5, 3)
    assert {shards.shard_of(t, 0, 1) for t in ("a", "b", "orders")} == {0}


def test_no_shards_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one shard"):
        shards.shard_of("orders", 0, 0)


def test_the_shards_of_a_config_are_sections_of_their_own() -> None:
    cfg = parse_config(BASE + 'shards = ["http://ch-1:8123", "https://ch-2:8443"]\n', {})
    assert [s.url for s in cfg.shard_sections] == ["http://ch-1:8123", "https://ch-2:8443"]
    assert all(s.target_table == "events_local" and s.shards == [] for s in cfg.shard_sections)
    assert parse_config(BASE, {}).shard_sections == (parse_config(BASE, {}).clickhouse,)
    assert shards.where(1, "https://ch-2:8443") == "shard 2 (ch-2:8443)"


@pytest.mark.parametrize(
    ("urls", "says"),
    [
        ('["ch-2:8123"]', "every shard's URL must start with http:// or https://"),
        ('["http://u:secret@ch-2:8123"]', "holds a user or password"),
        ('["http://ch-1:8123", "http://ch-1"]', "names one server twice"),
    ],
)
def test_bad_shard_lists_are_refused_naming_the_key(urls: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + f"shards = {urls}\n", {}, source="pipeline.toml")
    assert "clickhouse.shards" in str(info.value) and says in str(info.value)
    assert "secret" not in str(info.value)


def test_step_5_sums_each_partition_over_the_shards() -> None:
    a, b = TopicPartition(topic="t", partition=0), TopicPartition(topic="t", partition=1)
    checks = [
        StageCheck("", 10, {a: PartitionStats(10, 0, 9)}),
        StageCheck("", 0, {}),
        StageCheck("", 7, {a: PartitionStats(2, 10, 11), b: PartitionStats(5, 100, 104)}),
    ]
    found = merged(checks)
    assert found == StageCheck("", 17, {a: PartitionStats(12, 0, 11), b: PartitionStats(5, 100, 104)})
    assert merged([*checks[:2], StageCheck("column x added", 0, {})]).altered == "shard 3: column x added"
    assert merged([checks[0], StageCheck("", 3, None)]) == StageCheck("", 13, None)


def test_verify_reads_the_other_shards_through_url() -> None:
    sql = sharded_target_sql(
        "db", "events", ["http://ch-1:8123", "http://ch-2:8123"], here="http://ch-1:8123", login=url_login("u", "p'w")
    )
    assert sql.count(" UNION ALL ") == 1
    assert "FROM `db`.`events`" in sql and "url('http://ch-2:8123/?query=SELECT%20" in sql
    assert "headers('X-ClickHouse-User' = 'u', 'X-ClickHouse-Key' = 'p\\'w')" in sql


@pytest.mark.parametrize(
    ("extra", "scale"),
    [
        ("", 1),
        ('shards = ["http://a:1", "http://b:1", "http://c:1"]\n', 1),
        ('shards = ["http://a:1", "http://b:1", "http://c:1"]\nplacement = "sharding-key"\nsharding_key = "id"\n', 3),
    ],
)
def test_chunks_placed_by_a_key_hold_the_shard_count_times_the_rows(extra: str, scale: int) -> None:
    """Each shard's part of a chunk placed by key is about as large as a chunk placed by partition."""
    cfg = parse_config(BASE + extra + "\n[participant]\nchunk_rows = 5000\n", {})
    assert cfg.chunk_scale == scale == shards.chunk_scale(cfg.clickhouse.placement, len(cfg.clickhouse.shards))
    assert cfg.participant.chunk_rows == 5000  # the config keeps what it was given; the participant scales it


@pytest.mark.parametrize("key", ["rand()", "cityHash64(user) + rand64()", "toUInt64(now())", "rowNumberInAllBlocks()"])
def test_a_key_that_changes_between_tries_is_refused(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            BASE
            + f'shards = ["http://ch-1:8123", "http://ch-2:8123"]\nplacement = "sharding-key"\nsharding_key = "{key}"\n',
            {},
        )
    assert "clickhouse.sharding_key" in str(info.value) and "store them twice" in str(info.value)


@pytest.mark.parametrize(
    ("extra", "key", "says"),
    [
        ('shards = ["http://a:1", "http://b:1"]\nshard_weights = [1]\n', "clickhouse.shard_weights", "one weight"),
        ('shards = ["http://a:1", "http://b:1"]\nshard_weights = [0, 0]\n', "clickhouse.shard_weights", "above 0"),
        (
            'shards = ["http://a:1", "https://b:1"]\nplacement = "sharding-key"\nsharding_key = "id"\n',
            "clickhouse.shards",
            "mixes http:// and https://",
        ),
    ],
)
def test_a_sharding_key_placement_needs_its_parts(extra: str, key: str, says: str) -> None:
    """Those the config alone can tell; the shards and the key may come from a Distributed target
    (tests/pure/test_distributed_target.py)."""
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + extra, {})
    assert key in str(info.value) and says in str(info.value)


def test_the_routed_insert_sends_each_shard_its_rows_with_the_chunks_token() -> None:
    router = shards.ShardRouter(["http://ch-1:8123", "http://ch-2:8123"], "cityHash64(user)", [1, 2], login="")
    insert = MetadataInsert(
        "db", "stage", [Column("user", "String", "", ""), Column("_offset", "Int64", "", "")], "CSV"
    )
    select, _ = insert.select("t", 0, [Rec("t", 0, 5, b"a"), Rec("t", 0, 6, b"b")])
    sql = router.statement(insert, select, {"insert_deduplication_token": "p/e1_t1/t/0/1/0-10", "async_insert": 0})
    assert sql.startswith(
        "INSERT INTO FUNCTION url('http://{_partition_id}/?query=INSERT%20INTO%20%60db%60.%60stage%60"
    )
    assert "&insert_deduplication_token=p%2Fe1_t1%2Ft%2F0%2F1%2F0-10&async_insert=0'" in sql
    assert "'Native', '`user` String, `_offset` Int64')" in sql
    assert "PARTITION BY ['ch-1:8123', 'ch-2:8123', 'ch-2:8123'][multiIf(byteSize((cityHash64(user))) <= 4" in sql
    assert sql.endswith(f"PARTITION BY {router.placement} {select}") and "input('`user` String') FORMAT CSV" in sql


def test_the_shards_and_their_weights_come_from_the_environment_comma_separated() -> None:
    """``chtxn embedded up --shards N --env`` prints ``CHTXN_CLICKHOUSE_SHARDS``: a pipeline reads it."""
    environ = {"CHTXN_CLICKHOUSE_SHARDS": "http://ch-1:8123, http://ch-2:8123", "CHTXN_CLICKHOUSE_SHARD_WEIGHTS": "1,2"}
    cfg = parse_config(BASE, environ)
    assert cfg.clickhouse.shards == ["http://ch-1:8123", "http://ch-2:8123"] and cfg.clickhouse.shard_weights == [1, 2]
