"""The DDL of stage tables of replicated and shared targets, of chtxn's own replicated tables, and
the local table behind a Distributed target (``protocol.tables.replicated_ddl``): text in, text out."""

from __future__ import annotations

import pytest

from protocol.dead_letters import letters as dead_letters
from protocol.ledger import rows as ledger
from protocol.tables.replicated_ddl import (
    STAGE_PATH_ROOT,
    base_engine,
    distributed_local_table,
    drop_table_sql,
    family,
    on_cluster,
    parse_engine,
    stage_engine,
    stage_keeper_path,
    with_settings,
)
from protocol.tables.shape import Shape, difference, engine_clause_as, merges_rows

STAGE = "events__chtxn_orders__e3_t17"
UUID = "5c7e4a1e-0d3b-4b8e-9a51-2f0c1d2e3f40"
DEDUP = {"replicated_deduplication_window": 100000, "replicated_deduplication_window_seconds": 604800}
DEDUP_TEXT = "replicated_deduplication_window = 100000, replicated_deduplication_window_seconds = 604800"


def stage_of(engine_full: str, **kwargs) -> str:
    args = {"database": "analytics", "table": "events", "uuid": UUID, "stage": STAGE, "settings": DEDUP, **kwargs}
    return stage_engine(engine_full, **args)


def test_an_explicit_path_gets_a_stage_path_of_its_own_under_the_stage_root() -> None:
    target = "ReplicatedMergeTree('/clickhouse/tables/{shard}/analytics/events', '{replica}') ORDER BY id"

    assert stage_of(target + " SETTINGS index_granularity = 8192") == (
        f"ReplicatedMergeTree('{STAGE_PATH_ROOT}/clickhouse/tables/{{shard}}/analytics/events/{STAGE}', '{{replica}}') "
        f"ORDER BY id SETTINGS index_granularity = 8192, {DEDUP_TEXT}"
    )


def test_a_literal_path_and_replica_name_are_kept_as_written() -> None:
    target = "ReplicatedMergeTree('/clickhouse/tables/t1', 'r1') PARTITION BY toYYYYMM(d) ORDER BY id"

    assert stage_of(target, settings={}) == (
        f"ReplicatedMergeTree('{STAGE_PATH_ROOT}/clickhouse/tables/t1/{STAGE}', 'r1') PARTITION BY toYYYYMM(d) ORDER BY id"
    )


def test_database_and_table_macros_name_the_target_and_other_macros_stay_for_each_server() -> None:
    # ClickHouse unfolds {database} and {table} when it creates a table; servers older than 20.10 did not.
    target = "ReplicatedMergeTree('/clickhouse/tables/{layer}-{shard}/{database}/{table}', '{replica}') ORDER BY id"

    path = parse_engine(stage_of(target)).args[0]

    assert path == f"'{STAGE_PATH_ROOT}/clickhouse/tables/{{layer}}-{{shard}}/analytics/events/{STAGE}'"


def test_the_default_path_names_the_targets_uuid() -> None:
    # CREATE TABLE ... ENGINE = ReplicatedMergeTree ORDER BY id: the server writes its defaults in.
    target = "ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY id"

    assert parse_engine(stage_of(target)).args == (
        f"'{STAGE_PATH_ROOT}/clickhouse/tables/{UUID}/{{shard}}/{STAGE}'",
        "'{replica}'",
    )
    assert "{uuid}" in parse_engine(stage_of(target, uuid="")).args[0], "no UUID known: the macro is left as it is"


@pytest.mark.parametrize(
    "target",
    [
        "ReplicatedMergeTree('/clickhouse/tables/{shard}/analytics/events', '{replica}') ORDER BY id",
        "ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY id",
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/analytics/events', '{replica}', ver) ORDER BY id",
    ],
)
def test_a_stage_path_is_never_the_targets_nor_under_it_and_is_the_same_for_the_same_stage(target: str) -> None:
    target_path = parse_engine(target).args[0].strip("'").replace("{uuid}", UUID)
    first = parse_engine(stage_of(target)).args[0].strip("'")

    assert first != target_path and not first.startswith(target_path + "/")
    assert first == parse_engine(stage_of(target)).args[0].strip("'"), "a stage made again gets the same path"
    assert first != parse_engine(stage_of(target, stage=STAGE + "x")).args[0].strip("'")


def test_an_auxiliary_keeper_is_kept_so_both_tables_share_one_session() -> None:
    path = stage_keeper_path("aux:/clickhouse/tables/events", database="d", table="events", uuid="", stage="s")

    assert path == f"aux:{STAGE_PATH_ROOT}/clickhouse/tables/events/s"


def test_characters_a_keeper_path_cannot_hold_are_escaped() -> None:
    path = stage_keeper_path("/t/", database="d", table="t", uuid="", stage="a/b{c}")

    assert path == f"{STAGE_PATH_ROOT}/t/a%2Fb%7Bc%7D"


@pytest.mark.parametrize(
    ("target", "rest"),
    [
        ("ReplicatedReplacingMergeTree('/p/{shard}/t', '{replica}', version) ORDER BY id", " ORDER BY id"),
        ("ReplicatedSummingMergeTree('/p/{shard}/t', '{replica}', (clicks, cost)) ORDER BY (k, d)", " ORDER BY (k, d)"),
        ("ReplicatedCollapsingMergeTree('/p/{shard}/t', '{replica}', sign) PARTITION BY d ORDER BY k", None),
        ("ReplicatedVersionedCollapsingMergeTree('/p/{shard}/t', '{replica}', sign, ver) ORDER BY k", " ORDER BY k"),
        ("ReplicatedAggregatingMergeTree('/p/{shard}/t', '{replica}') ORDER BY k", " ORDER BY k"),
    ],
)
def test_a_replicated_merging_engine_gets_a_plain_replicated_stage_with_the_same_clauses(
    target: str, rest: str | None
) -> None:
    stage = parse_engine(stage_of(target, settings={}))

    assert stage.name == "ReplicatedMergeTree"
    assert stage.args == (f"'{STAGE_PATH_ROOT}/p/{{shard}}/t/{STAGE}'", "'{replica}'"), "no merge-mode argument left"
    assert stage.rest == (rest if rest is not None else " PARTITION BY d ORDER BY k")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            "SharedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY key "
            "SETTINGS index_granularity = 8192",
            f"SharedMergeTree ORDER BY key SETTINGS index_granularity = 8192, {DEDUP_TEXT}",
        ),
        (
            "SharedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', eventTime) ORDER BY key",
            f"SharedMergeTree ORDER BY key SETTINGS {DEDUP_TEXT}",
        ),
        (
            "SharedSummingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') PARTITION BY d ORDER BY key",
            f"SharedMergeTree PARTITION BY d ORDER BY key SETTINGS {DEDUP_TEXT}",
        ),
    ],
)
def test_a_shared_target_gets_a_shared_stage_on_the_servers_default_path(target: str, expected: str) -> None:
    # No arguments: the default path names the stage table's own UUID (ClickHouse Cloud).
    assert stage_of(target) == expected


def test_in_a_replicated_database_the_stage_takes_no_keeper_arguments() -> None:
    # database_replicated_allow_replicated_engine_arguments = 0 refuses explicit ones there.
    target = "ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', v) ORDER BY id"

    assert stage_of(target, replicated_database=True, settings={}) == "ReplicatedMergeTree ORDER BY id"


def test_a_single_servers_merging_engine_gets_plain_mergetree_and_its_clauses_unchanged() -> None:
    target = "ReplacingMergeTree(version) PARTITION BY toYYYYMM(ts) ORDER BY id SETTINGS index_granularity = 8192"

    assert engine_clause_as(target, "ReplacingMergeTree") == (
        "MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id SETTINGS index_granularity = 8192"
    )
    with pytest.raises(ValueError, match="is not replicated"):
        stage_of(target)


def test_settings_replace_the_targets_values_and_keep_the_rest_quotes_and_all() -> None:
    rest = " ORDER BY id SETTINGS storage_policy = 'hot, cold', replicated_deduplication_window = 0"

    assert with_settings(rest, {"replicated_deduplication_window": 5}) == (
        " ORDER BY id SETTINGS storage_policy = 'hot, cold', replicated_deduplication_window = 5"
    )
    assert with_settings(" ORDER BY tuple()", {"a": 1}) == " ORDER BY tuple() SETTINGS a = 1"


def test_a_path_without_a_replica_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no Keeper path and replica name"):
        stage_of("ReplicatedMergeTree ORDER BY id")


def test_engine_names() -> None:
    assert [
        family(e) for e in ("MergeTree", "ReplicatedSummingMergeTree", "SharedMergeTree", "ReplacingSharedMergeTree")
    ] == [
        "",
        "Replicated",
        "Shared",
        "Shared",
    ]
    assert [
        base_engine(e) for e in ("ReplicatedReplacingMergeTree", "SharedMergeTree", "ReplacingSharedMergeTree")
    ] == [
        "ReplacingMergeTree",
        "MergeTree",
        "ReplacingMergeTree",
    ]
    assert merges_rows("ReplicatedCollapsingMergeTree") and merges_rows("SharedReplacingMergeTree")
    assert not merges_rows("ReplicatedMergeTree") and not merges_rows("SharedMergeTree")


def test_a_replicated_merging_targets_implicit_sorting_key_is_no_difference() -> None:
    # VersionedCollapsing adds its version column to the sorting key; the plain stage table does not.
    stage = Shape("ReplicatedMergeTree", "d", "k", "k", [("k", "UInt64"), ("d", "Date")])
    target = Shape("ReplicatedVersionedCollapsingMergeTree", "d", "k, ver", "k", [("k", "UInt64"), ("d", "Date")])

    assert difference(stage, target) == ""
    assert difference(stage, Shape(target.engine, "k", "k, ver", "k", target.columns)) != ""


def test_on_cluster_and_drops() -> None:
    assert on_cluster("") == ""
    assert on_cluster("main") == " ON CLUSTER `main`"
    assert drop_table_sql("`db`.`s`") == "DROP TABLE IF EXISTS `db`.`s` SYNC"
    assert drop_table_sql("`db`.`s`", cluster="main") == "DROP TABLE IF EXISTS `db`.`s` ON CLUSTER `main` SYNC"


@pytest.mark.parametrize(
    ("engine_full", "expected"),
    [
        ("Distributed('main', 'analytics', 'events_local', rand())", ("main", "analytics", "events_local")),
        ("Distributed('main', '', 'events_local')", ("main", "db", "events_local")),
        ("Distributed(main, other, `events local`, cityHash64(id), 'ssd')", ("main", "other", "events local")),
    ],
)
def test_the_local_table_behind_a_distributed_table(engine_full: str, expected: tuple[str, str, str]) -> None:
    assert distributed_local_table(engine_full, "db") == expected


def test_chtxns_own_tables_replicated_on_a_cluster_have_distinct_explicit_paths() -> None:
    ledger_ddl = ledger.create_table_sql("analytics", replicated=True, cluster="main")
    letters_ddl = dead_letters.create_table_sql("analytics", replicated=True, cluster="main")

    assert ledger_ddl.startswith("CREATE TABLE IF NOT EXISTS `analytics`.`chtxn_ledger` ON CLUSTER `main`\n(")
    assert (
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/analytics/chtxn_ledger', '{replica}')" in ledger_ddl
    )
    assert letters_ddl.startswith("CREATE TABLE IF NOT EXISTS `analytics`.`chtxn_dead_letters` ON CLUSTER `main`\n(")
    assert (
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/analytics/chtxn_dead_letters', '{replica}')"
        in letters_ddl
    )
    assert "replicated_deduplication_window = 100000" in ledger_ddl
    single = ledger.create_table_sql("analytics")
    assert "ON CLUSTER" not in single and "ENGINE = MergeTree\n" in single
