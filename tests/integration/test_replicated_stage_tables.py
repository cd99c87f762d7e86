"""Stage tables of ReplicatedMergeTree targets, created for real on chDB configured for a real
ZooKeeper (``keeper_stack``, macros ``{shard}`` = 01 and ``{replica}`` = chdb): each stage table
gets a Keeper path of its own, for a target with an explicit path, a macro path and the server's
default ``{uuid}`` path, and a dropped stage table frees its path for the next one of its name.

What chDB cannot show: rows. Its replicated tables stay read-only, because a replica becomes
active only once it has published its interserver address, and chDB starts no interserver
endpoint ("Parameter 'interserver_http(s)_port' required for replication is not specified in
configuration file", logged by ReplicatedMergeTreeRestartingThread), so inserts, ``SYSTEM SYNC
REPLICA`` and ``MOVE PARTITION`` between replicated tables cannot run here (the last test pins
that down). Also a Distributed target, refused at take-over naming its local table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clients.target_table import check_target
from coordinator.stage.tables import StageTables
from embedded.ch_engine import MACROS
from protocol import naming
from protocol.chcodes import UNKNOWN_TABLE
from protocol.config.parse import parse_config
from protocol.errors import SetupError
from protocol.tables.replicated_ddl import STAGE_PATH_ROOT
from protocol.tables.shape import SHAPES_SQL, difference, shapes_of
from tests.helpers import unique_name

REPLICA_ALREADY_EXISTS, TABLE_IS_READ_ONLY, BAD_ARGUMENTS = 253, 242, 36
SHARD, REPLICA = MACROS["shard"], MACROS["replica"]
COLUMNS = "(id UInt64, d Date, body String, _topic String, _partition Int32, _offset Int64)"
UUID = "2f6e0b8a-41c3-4d5e-9f70-8a1b2c3d4e5f"


@pytest.fixture(scope="module")
def client(keeper_stack):  # TestStack -> clickhouse-connect client
    c = keeper_stack.clickhouse_client()
    yield c
    c.close()


@pytest.fixture
def database(client) -> Iterator[str]:
    """A fresh Atomic database (its tables have UUIDs), dropped with its tables' Keeper paths."""
    name = unique_name("t_repl")
    client.command(f"CREATE DATABASE `{name}` ENGINE = Atomic")
    yield name
    client.command(f"DROP DATABASE IF EXISTS `{name}` SYNC")


def stages_of(client, database: str, target: str = "events") -> StageTables:
    return StageTables(client, database=database, target=target, pipeline="orders")


def replica_of(client, database: str, table: str) -> tuple[str, str]:
    """(zookeeper_path, replica_name) of ``table`` in ``system.replicas``, with the macros expanded."""
    rows = client.query(
        "SELECT zookeeper_path, replica_name FROM system.replicas WHERE database = {db:String} AND table = {t:String}",
        parameters={"db": database, "t": table},
    ).result_rows
    assert len(rows) == 1, f"{database}.{table} is not a replicated table"
    return rows[0][0], rows[0][1]


def definition(client, database: str, table: str) -> tuple:
    return client.query(
        "SELECT engine, partition_key, sorting_key, primary_key, storage_policy FROM system.tables "
        "WHERE database = {db:String} AND name = {t:String}",
        parameters={"db": database, "t": table},
    ).result_rows[0]


def columns(client, database: str, table: str) -> list[tuple]:
    return client.query(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        parameters={"db": database, "t": table},
    ).result_rows


def code_of(statement) -> int:
    with pytest.raises(DatabaseError) as failed:
        statement()
    return failed.value.code


#: The target's ENGINE clause and its Keeper path as ``system.replicas`` shows it ({db}: the database).
TARGETS = {
    "explicit path": (
        "ReplicatedMergeTree('/chtxn_tests/{db}/events', 'r1')",
        "/chtxn_tests/{db}/events",
        "r1",
    ),
    "macro path": (
        "ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{{database}}/{{table}}', '{{replica}}')",
        f"/clickhouse/tables/{SHARD}/{{db}}/events",
        REPLICA,
    ),
    "default path": ("ReplicatedMergeTree", f"/clickhouse/tables/{UUID}/{SHARD}", REPLICA),
}


@pytest.mark.parametrize("kind", list(TARGETS))
def test_a_stage_table_gets_a_keeper_path_of_its_own_on_the_targets_replicas(client, database: str, kind: str) -> None:
    engine, target_path, replica = TARGETS[kind]
    # The default path names the table's UUID, which chDB accepts only when the CREATE gives it.
    uuid = f" UUID '{UUID}'" if kind == "default path" else ""
    client.command(
        f"CREATE TABLE `{database}`.events{uuid} {COLUMNS} ENGINE = {engine.format(db=database)} "
        "PARTITION BY toYYYYMM(d) ORDER BY (id, d) SETTINGS index_granularity = 4096"
    )
    assert replica_of(client, database, "events") == (target_path.format(db=database), replica)
    stages = stages_of(client, database)
    stage = naming.stage_table("events", "orders", "e1_t1")

    stages.create(stage)

    stage_path = f"{STAGE_PATH_ROOT}{target_path.format(db=database)}/{stage}"
    assert replica_of(client, database, stage) == (stage_path, replica), "its own path, the target's replica name"
    # What a move needs of the two tables: same columns, partition key, sorting key and storage policy.
    assert definition(client, database, stage) == ("ReplicatedMergeTree", *definition(client, database, "events")[1:])
    assert columns(client, database, stage) == columns(client, database, "events")
    settings = client.command(
        "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        parameters={"db": database, "t": stage},
    )
    assert "index_granularity = 4096" in settings and "replicated_deduplication_window = 100000" in settings

    stages.create(stage)  # idempotent
    # Today's `CREATE TABLE stage AS target` takes the target's path: its replica exists already
    # (or, for the default path, the {uuid} macro is refused outside ON CLUSTER).
    copy = f"CREATE TABLE `{database}`.copy AS `{database}`.events"
    assert code_of(lambda: client.command(copy)) == (
        BAD_ARGUMENTS if kind == "default path" else REPLICA_ALREADY_EXISTS
    )


def test_a_dropped_stage_table_frees_its_path_for_the_next_of_its_name(client, database: str) -> None:
    client.command(
        f"CREATE TABLE `{database}`.events {COLUMNS} "
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY id"
    )
    stages = stages_of(client, database)
    stage = naming.stage_table("events", "orders", "e2_t5")
    stages.create(stage)
    path = replica_of(client, database, stage)

    stages.drop(stage)  # DROP ... SYNC
    assert not stages.exists(stage)
    stages.create(stage)  # after a crash, the txn's stage table is made again under the same name

    assert replica_of(client, database, stage) == path
    # Without SYNC the drop leaves the replica in Keeper until the table's data is removed, minutes later.
    client.command(f"DROP TABLE `{database}`.`{stage}`")
    assert code_of(lambda: stages.create(stage)) == REPLICA_ALREADY_EXISTS


def test_a_replicated_merging_target_gets_a_plain_replicated_stage_table(client, database: str) -> None:
    client.command(
        f"CREATE TABLE `{database}`.events (id UInt64, v UInt32, sign Int8) "
        "ENGINE = ReplicatedVersionedCollapsingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', "
        "'{replica}', sign, v) ORDER BY id"
    )
    stages = stages_of(client, database)
    stage = naming.stage_table("events", "orders", "e1_t2")

    stages.create(stage)

    assert definition(client, database, stage)[0] == "ReplicatedMergeTree", "its count() is the rows staged"
    assert replica_of(client, database, stage)[0] == (
        f"{STAGE_PATH_ROOT}/clickhouse/tables/{SHARD}/{database}/events/{stage}"
    )
    # The target's sorting key gained the version column implicitly; the stage table's did not, and
    # that is no difference that would stop a move (step 5 would report one as `altered`).
    shapes = shapes_of(client.query(SHAPES_SQL, parameters={"db": database, "names": [stage, "events"]}).result_rows)
    assert (shapes[stage].sorting, shapes["events"].sorting) == ("id", "id, v")
    assert difference(shapes[stage], shapes["events"]) == ""


def test_chdb_keeps_replicated_tables_read_only_so_no_rows_can_be_staged_here(client, database: str) -> None:
    client.command(
        f"CREATE TABLE `{database}`.events {COLUMNS} "
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY id"
    )
    stages = stages_of(client, database)
    stage = naming.stage_table("events", "orders", "e1_t3")
    stages.create(stage)

    insert = f"INSERT INTO `{database}`.`{stage}` (id, d, body) SETTINGS insert_keeper_max_retries = 0 VALUES (1, today(), 'x')"
    assert code_of(lambda: client.command(insert)) == TABLE_IS_READ_ONLY
    assert code_of(lambda: stages.check(stage)) == TABLE_IS_READ_ONLY, "step 5 syncs the replica first"
    stages.drop(stage)
    assert code_of(lambda: client.command(f"SELECT 1 FROM `{database}`.`{stage}`")) == UNKNOWN_TABLE


def test_a_distributed_target_is_refused_naming_the_local_table(client) -> None:
    # A Distributed table needs a cluster at CREATE; ATTACH in an Ordinary database skips that check.
    db = unique_name("t_dist")
    client.command(f"CREATE DATABASE `{db}` ENGINE = Ordinary", settings={"allow_deprecated_database_ordinary": 1})
    try:
        client.command(f"CREATE TABLE `{db}`.events_local (id UInt64) ENGINE = MergeTree ORDER BY id")
        client.command(
            f"ATTACH TABLE `{db}`.events (id UInt64) ENGINE = Distributed('main', '', 'events_local', rand())"
        )

        with pytest.raises(SetupError) as refused:
            cfg = parse_config(
                f'[pipeline]\nname = "p"\ntopics = ["t"]\n[kafka]\nbootstrap_servers = "x:1"\n'
                f'[clickhouse]\nurl = "http://x:1"\ndatabase = "{db}"\ntarget_table = "events"\n'
            )
            check_target(client, cfg, "events")

        assert str(refused.value) == (
            f"target table {db}.events is a Distributed table over {db}.events_local on cluster main; chtxn "
            "publishes by moving partitions between tables of one server, which a Distributed table has not: set "
            'clickhouse.target_table = "events_local", and list one server of every shard of cluster main in '
            "clickhouse.shards to load them all (docs/clusters.md, A sharded cluster)"
        )
    finally:
        client.command(f"DROP DATABASE IF EXISTS `{db}` SYNC")
