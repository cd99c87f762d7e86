"""``protocol.tables.target_rules``: the one judgement of a target table that init, doctor, the coordinator
and the participant share, fed with what a server would say of the table."""

from __future__ import annotations

import msgspec
import pytest

from protocol.config.parse import PipelineConfig, parse_config
from protocol.tables.target_rules import ClusterShard, TargetFacts, ViewTable, refusals

METADATA = ("id", "_topic", "_partition", "_offset")
PLAIN = TargetFacts(engine="MergeTree", engine_full="MergeTree ORDER BY id", columns=METADATA)
WINDOWED = msgspec.structs.replace(
    PLAIN, engine_full="MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
)


def config(*, publish_mode: str = "move", input_format: str = "JSONEachRow", route: bool = False) -> PipelineConfig:
    topics, table = ("", "") if route else ('topics = ["src"]\n', 'target_table = "events"\n')
    text = (
        f'[pipeline]\nname = "p"\n{topics}[kafka]\nbootstrap_servers = "k:9092"\n'
        f'[clickhouse]\nurl = "http://c:8123"\ndatabase = "db"\n{table}input_format = "{input_format}"\n'
        f'[transaction]\npublish_mode = "{publish_mode}"\n'
    )
    if route:
        text += '[[route]]\ntopics = ["src"]\ntable = "events"\n'
    return parse_config(text, {})


def test_a_merge_tree_target_with_json_records_is_accepted() -> None:
    assert refusals(config(), "events", PLAIN) == []
    assert refusals(config(publish_mode="insert-select"), "events", WINDOWED) == []
    replicated = TargetFacts(
        engine="ReplicatedMergeTree", engine_full="ReplicatedMergeTree('/p', '{replica}') ORDER BY id"
    )
    assert refusals(config(publish_mode="insert-select"), "events", replicated) == []  # its default window > 0


def test_a_missing_target_says_how_to_create_it_and_which_setting_names_it() -> None:
    [single] = refusals(config(), "events", None)
    assert single.check == "target table"
    assert single.message.startswith("target table db.events does not exist: create it (CREATE TABLE db.events")
    assert single.message.endswith("or fix clickhouse.target_table")
    [routed] = refusals(config(route=True), "events", None)
    assert routed.message.endswith("or fix the table of its [[route]]")


@pytest.mark.parametrize("engine", ["Memory", "Log", "Buffer", "Null"])
def test_an_engine_outside_the_merge_tree_family_is_refused_alone(engine: str) -> None:
    facts = TargetFacts(engine=engine, engine_full=engine, columns=METADATA, views=("db.v",))
    [refusal] = refusals(config(input_format="CSV"), "events", facts)  # nothing else is judged
    assert refusal.check == "target table"
    assert refusal.message.startswith(f"target table db.events has engine {engine}, not of the MergeTree family")
    assert refusal.message.endswith("recreate it with a MergeTree-family engine (e.g. ENGINE = MergeTree ORDER BY ...)")


def test_a_distributed_target_names_the_local_table() -> None:
    facts = TargetFacts(engine="Distributed", engine_full="Distributed('main', 'shard', 'events_local', rand())")
    [refusal] = refusals(config(), "events", facts)
    assert refusal.message.startswith("target table db.events is a Distributed table over shard.events_local")
    assert 'set clickhouse.target_table = "events_local" and clickhouse.database = "shard"' in refusal.message
    assert "clickhouse.sharding_key" not in refusal.message  # rand() places no row twice alike


def test_a_distributed_target_with_a_deterministic_key_names_the_placement_that_keeps_it() -> None:
    facts = TargetFacts(engine="Distributed", engine_full="Distributed('main', '', 'events_local', cityHash64(user))")
    [refusal] = refusals(config(), "events", facts)
    assert "list one server of every shard of cluster main in clickhouse.shards" in refusal.message
    assert 'clickhouse.placement = "sharding-key" and clickhouse.sharding_key = "cityHash64(user)"' in refusal.message


def test_every_refusal_of_a_merge_tree_target_is_listed_in_order() -> None:
    facts = msgspec.structs.replace(PLAIN, views=("db.v",))
    found = refusals(config(input_format="Parquet"), "events", facts)
    assert [r.check for r in found] == ["metadata columns", "materialized views"]
    assert found[0].message.startswith(
        "target table db.events has metadata columns _topic, _partition, _offset but clickhouse.input_format is "
        "'Parquet', which chtxn does not load one record per row: set clickhouse.input_format to one of "
    )
    assert found[1].message.endswith('MOVE PARTITION: set transaction.publish_mode = "insert-select"')


def test_insert_select_needs_a_window_in_the_target_then_in_each_views_table() -> None:
    cfg = config(publish_mode="insert-select")
    [target] = refusals(cfg, "events", PLAIN)
    assert (target.check, target.message.split(":")[0]) == (
        "dedup: target",
        "publish_mode insert-select needs deduplication on db.events so that a repeated publish stores rows once",
    )
    agg = ViewTable(view="db.v", table="db.agg", engine="MergeTree", engine_full="MergeTree ORDER BY id")
    views = msgspec.structs.replace(WINDOWED, views=("db.v",), view_tables=(agg,))
    [view] = refusals(cfg, "events", views)
    assert view.check == "materialized views" and view.message.startswith("materialized view db.v on db.events")
    memory = msgspec.structs.replace(agg, engine="Memory", engine_full="Memory")  # not a MergeTree: nothing to set
    assert refusals(cfg, "events", msgspec.structs.replace(views, view_tables=(memory,))) == []


def test_a_distributed_target_on_a_defined_cluster_names_its_shards_at_the_http_port() -> None:
    facts = TargetFacts(
        engine="Distributed",
        engine_full="Distributed('main', '', 'events_local', cityHash64(user))",
        cluster_shards=(
            ClusterShard(host="ch-1", port=9000, local=True),
            ClusterShard(host="ch-2", port=9000),
            ClusterShard(host="ch-3", port=9000, weight=2),
        ),
    )
    [refusal] = refusals(config(), "events", facts)
    assert (
        'set clickhouse.shards = ["http://ch-1:8123", "http://ch-2:8123", "http://ch-3:8123"] '
        "(cluster main) to load them all" in refusal.message
    )
    assert 'clickhouse.sharding_key = "cityHash64(user)" and clickhouse.shard_weights = [1, 1, 2]' in refusal.message
