"""``StageTables`` on the embedded ClickHouse: step 5's check and publish's reads, one query
each in the steady state, and the long way when a stage table is gone or its metadata columns
are not what the last one had; and the nice value the coordinator's queries and copies run at."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.service import clickhouse_stores
from coordinator.stage.publish import StageTableMissing
from coordinator.stage.tables import STAGE_DEDUP_WINDOW, STAGE_MIN_PARTS_TO_MERGE, StageTables
from protocol import naming
from protocol.coordinator.events import PartitionStats
from protocol.messages import TopicPartition
from tests.helpers import unique_name
from tests.pipelines import make_pipeline

PLAIN_TARGET_DDL = "CREATE TABLE {db}.{table} (id UInt64, s String) ENGINE = MergeTree ORDER BY id"


class Counting:
    """A clickhouse-connect client that counts the statements sent through it."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name not in ("query", "command"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


def stages_of(pipeline) -> tuple[StageTables, Counting]:  # tests.pipelines.Pipeline
    cfg = pipeline.cfg
    client = Counting(pipeline.client())
    return StageTables(
        client, database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name
    ), client


def stage_table(pipeline, txn: str) -> str:
    return naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, txn)


def q(pipeline, table: str) -> str:
    return f"`{pipeline.cfg.clickhouse.database}`.`{table}`"


#: The metadata columns, to insert rows into a stage table of ``TARGET_DDL``'s shape.
METADATA = "(id, _topic, _partition, _offset)"


def staged(pipeline, stages: StageTables, client: Counting, txn: str, values: str, columns: str = "") -> str:
    """A stage table of ``txn`` holding ``values``; the statements counted from here on."""
    table = stage_table(pipeline, txn)
    stages.create(table)
    client.command(f"INSERT INTO {q(pipeline, table)} {columns} VALUES {values}")
    client.calls = 0
    return table


def test_check_reads_shapes_and_rows_per_partition_in_one_query(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("stagecheck"))
    stages, client = stages_of(pipeline)
    topic = pipeline.topic
    table = staged(
        pipeline,
        stages,
        client,
        "e1_t1",
        f"(1, '{topic}', 0, 10), (2, '{topic}', 0, 11), (3, '{topic}', 1, 4)",
        METADATA,
    )

    check = stages.check(table)

    assert (check.altered, check.count) == ("", 3)
    assert check.partitions == {
        TopicPartition(topic=topic, partition=0): PartitionStats(2, 10, 11),
        TopicPartition(topic=topic, partition=1): PartitionStats(1, 4, 4),
    }
    assert client.calls == 1, "step 5 reads the structures and the staged rows in one query"

    pipeline.client().command(f"ALTER TABLE {q(pipeline, pipeline.cfg.clickhouse.target_table)} ADD COLUMN note String")
    assert stages.check(table).altered == "columns added: note"
    with pytest.raises(StageTableMissing, match="does not exist"):
        stages.check(stage_table(pipeline, "e1_t2"))


def test_check_of_a_target_without_metadata_columns_counts_and_learns_to_ask_for_a_count(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("stageplain"), target_ddl=PLAIN_TARGET_DDL)
    stages, client = stages_of(pipeline)
    for txn in ("e1_t1", "e1_t2"):
        table = staged(pipeline, stages, client, txn, "(1, 'a'), (2, 'b')")

        check = stages.check(table)

        assert (check.altered, check.count, check.partitions) == ("", 2, None)
    assert client.calls == 1, "once a stage table had no metadata columns, the next check asks for a count"

    target = q(pipeline, pipeline.cfg.clickhouse.target_table)
    pipeline.client().command(
        f"ALTER TABLE {target} ADD COLUMN _topic String, ADD COLUMN _partition Int32, ADD COLUMN _offset Int64"
    )
    check = stages.check(staged(pipeline, stages, client, "e1_t3", "(1, 'a', 't', 0, 7)"))
    assert check.partitions == {TopicPartition(topic="t", partition=0): PartitionStats(1, 7, 7)}, (
        "metadata columns added to the target are counted per partition from the next stage table on"
    )


def test_publish_reads_once_moves_every_partition_and_names_a_missing_stage_table(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("stagepub"))
    stages, client = stages_of(pipeline)
    topic = pipeline.topic
    table = staged(
        pipeline, stages, client, "e1_t1", f"(1, '{topic}', 0, 0), (2, '{topic}', 1, 0), (3, '{topic}', 1, 1)", METADATA
    )

    assert stages.publish(table, "e1_t1") == 3

    # one read, one move per ClickHouse partition (PARTITION BY _partition), the check that it is empty
    assert client.calls == 1 + 2 + 1
    assert pipeline.target_count() == 3
    assert stages.count(table) == 0
    with pytest.raises(StageTableMissing, match="of committed txn e1_t2 does not exist"):
        stages.publish(stage_table(pipeline, "e1_t2"), "e1_t2")


class OlderServer(Counting):
    """A client of a server that does not know ``min_parts_to_merge_at_once``: the setting is sent
    under a name no server knows, so the refusal (UNKNOWN_SETTING) is the server's own."""

    def __getattr__(self, name: str) -> Any:
        attr = super().__getattr__(name)
        if name != "command":
            return attr
        return lambda sql, *a, **kw: attr(sql.replace("min_parts_to_merge_at_once", "no_such_merge_setting"), *a, **kw)


def settings_of(pipeline, table: str) -> str:
    return pipeline.client().command(
        "SELECT engine_full FROM system.tables WHERE database = %(db)s AND name = %(t)s",
        parameters={"db": pipeline.cfg.clickhouse.database, "t": table},
    )


def test_a_stage_table_merges_only_many_parts_at_once_and_an_older_server_gets_one_as_before(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("stagemerge"))
    stages, client = stages_of(pipeline)
    stages.create(stage_table(pipeline, "e1_t1"))
    engine = settings_of(pipeline, stage_table(pipeline, "e1_t1"))
    assert f"min_parts_to_merge_at_once = {STAGE_MIN_PARTS_TO_MERGE}" in engine
    assert f"non_replicated_deduplication_window = {STAGE_DEDUP_WINDOW}" in engine
    assert client.calls == 2, "the target's definition, then one CREATE"

    cfg = pipeline.cfg
    older = OlderServer(pipeline.client())
    stages = StageTables(older, database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name)
    for txn in ("e1_t2", "e1_t3"):
        older.calls = 0
        stages.create(stage_table(pipeline, txn))
        engine = settings_of(pipeline, stage_table(pipeline, txn))
        assert "merge_at_once" not in engine and f"deduplication_window = {STAGE_DEDUP_WINDOW}" in engine
        assert older.calls == (3 if txn == "e1_t2" else 2), "refused once, then created without the setting"


#: A target that records, per row, the nice value of the insert that wrote it.
NICE_TARGET_DDL = (
    "CREATE TABLE {db}.{table} (id UInt64, nice Int32 MATERIALIZED getSetting('os_thread_priority')) "
    "ENGINE = MergeTree ORDER BY id"
)


@pytest.mark.parametrize("nice", [-10, 0])
def test_the_coordinators_queries_run_at_its_nice_value_and_its_bulk_copies_do_not(stack, tmp_path, nice):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("stagenice"),
        target_ddl=NICE_TARGET_DDL,
        settings={"transaction.publish_mode": "insert-select", "coordinator.clickhouse_nice": nice},
    )
    _, stages = clickhouse_stores(pipeline.cfg)
    assert stages.client.command("SELECT getSetting('os_thread_priority')") == nice

    table = stage_table(pipeline, "e1_t1")
    stages.create(table)
    stages.client.command(f"INSERT INTO {q(pipeline, table)} (id) VALUES (1), (2)")
    assert stages.publish(table, "e1_t1") == 2

    # the stage table's rows were written at the coordinator's nice value, the copy's at 0
    assert stages.client.query(f"SELECT nice, count() FROM {q(pipeline, table)} GROUP BY nice").result_rows == [
        (nice, 2)
    ]
    assert stages.client.query(f"SELECT nice, count() FROM {q(pipeline, 'events')} GROUP BY nice").result_rows == [
        (0, 2)
    ]
