"""Schema evolution on the real engine (``[schema]``, stager step 1.5): with ``add-columns`` a
``Stager`` adds a new field's column to the target and the stage table before the insert, and the
rows carry the value; a value its column cannot read is a dead letter naming the field; with
``unknown_fields = "dead-letter"`` a record carrying a field the target lacks is a letter; an ALTER
that fails fails the chunk (its txn aborts) instead of dropping anything."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from coordinator.stage.tables import StageTables
from participant.dead_letters import DeadLetterSink
from participant.stager import Stager
from protocol import naming
from protocol.chunking import ChunkBuilder
from protocol.config.sections import SchemaSection
from protocol.participant.events import ChunkStaged
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, make_pipeline
from tests.records import Rec
from tests.routed import assert_exactly_once_per_table, make_routed_pipeline, table_count

ADD_COLUMNS = SchemaSection(evolve="add-columns")


def pipeline_of(stack, tmp_path, prefix: str) -> Pipeline:
    return make_pipeline(stack, tmp_path, unique_name(prefix), partitions=1)


def stager_of(pipeline: Pipeline, schema: SchemaSection) -> Stager:
    cfg = pipeline.cfg
    sink = DeadLetterSink(pipeline.client(), database=cfg.clickhouse.database, pipeline=cfg.name)
    return Stager(
        client=pipeline.client(),
        section=cfg.clickhouse,
        attempts=2,
        dead_letters=sink,
        sleep=lambda _: None,
        schema=schema,
    )


def stages_of(pipeline: Pipeline) -> StageTables:
    cfg = pipeline.cfg
    return StageTables(
        pipeline.client(), database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name
    )


def new_stage(pipeline: Pipeline, txn: str) -> str:
    table = naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, txn)
    stages_of(pipeline).create(table)
    return table


def stage(stager: Stager, pipeline: Pipeline, table: str, txn: str, values: list[bytes], first: int = 0) -> ChunkStaged:
    builder = ChunkBuilder(
        pipeline=pipeline.cfg.name,
        txn=txn,
        topic=pipeline.topic,
        partition=0,
        start_offset=first,
        chunk_rows=10_000,
        chunk_bytes=1 << 30,
    )
    records = [Rec(pipeline.topic, 0, first + i, v, b"k") for i, v in enumerate(values)]
    assert builder.add(records) == []
    chunk = builder.flush()
    assert chunk is not None
    return stager.stage(table, chunk)


def columns(pipeline: Pipeline, table: str) -> list[tuple[str, str]]:
    rows = (
        pipeline.client()
        .query(
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} "
            "ORDER BY position",
            parameters={"db": pipeline.cfg.clickhouse.database, "t": table},
        )
        .result_rows
    )
    return [(name, kind) for name, kind in rows]


def rows_of(pipeline: Pipeline, table: str, *names: str) -> list[tuple]:
    db = pipeline.cfg.clickhouse.database
    cols = ", ".join(f"`{n}`" for n in names)
    return [
        tuple(r) for r in pipeline.client().query(f"SELECT {cols} FROM `{db}`.`{table}` ORDER BY _offset").result_rows
    ]


def letters(pipeline: Pipeline) -> list[tuple[int, int, str]]:
    return [
        (int(offset), int(code), error)
        for offset, code, error in pipeline.client()
        .query(
            f"SELECT offset, error_code, error FROM `{pipeline.cfg.clickhouse.database}`.chtxn_dead_letters "
            "WHERE pipeline = {p:String} ORDER BY offset",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    ]


def event(i: int, **extra: object) -> bytes:
    return json.dumps({"id": i, "user": f"u{i}", "amount": i / 2, **extra}).encode()


def test_add_columns_adds_each_new_field_to_the_target_and_the_stage_table_before_the_rows(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "evolve")
    target = pipeline.cfg.clickhouse.target_table
    table = new_stage(pipeline, "t1")
    values = [
        event(0),
        event(1, country="fr", score=3, flag=True, ratio=1, tags=["a", "b"], meta={"k": [1, 2]}, nothing=None),
        event(2, country="de", score=-4, flag=False, ratio=2.5, mixed=1, nothing=None),
        event(3, mixed="one"),
    ]
    result = stage(stager_of(pipeline, ADD_COLUMNS), pipeline, table, "t1", values)
    assert (result.error, result.rows, result.dead_letters) == ("", 4, 0)

    base = columns(pipeline, target)[:6]
    added = columns(pipeline, target)[6:]
    assert added == [
        ("country", "String"),
        ("score", "Int64"),
        ("flag", "Bool"),
        ("ratio", "Float64"),
        ("tags", "String"),
        ("meta", "String"),
        ("mixed", "String"),
    ]  # "nothing" was only ever null: it waits for a value
    assert columns(pipeline, table) == base + added  # same names, types and order: commit step 5 sees no change
    assert stages_of(pipeline).check(table).altered == ""
    assert rows_of(pipeline, table, "_offset", "country", "score", "flag", "ratio", "tags", "meta", "mixed") == [
        (0, "", 0, False, 0.0, "", "", ""),
        (1, "fr", 3, True, 1.0, '["a", "b"]', '{"k": [1, 2]}', ""),
        (2, "de", -4, False, 2.5, "", "", "1"),
        (3, "", 0, False, 0.0, "", "", "one"),
    ]

    again = stage(stager_of(pipeline, ADD_COLUMNS), pipeline, table, "t1", [event(4, country="it")], first=4)
    assert (again.error, again.rows) == ("", 1)  # a known field: no ALTER
    assert columns(pipeline, target)[6:] == added


def test_a_spare_stage_table_made_before_the_target_changed_gets_the_targets_column(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "spare")
    first, spare = new_stage(pipeline, "t1"), new_stage(pipeline, "t2")
    stager = stager_of(pipeline, ADD_COLUMNS)
    assert stage(stager, pipeline, first, "t1", [event(0, score=1)]).error == ""
    pipeline.client().command(  # a participant elsewhere added a column in the meantime
        f"ALTER TABLE `{pipeline.cfg.clickhouse.database}`.`events` ADD COLUMN region String"
    )
    assert stages_of(pipeline).check(spare).altered == "columns added: score, region"
    result = stage(stager, pipeline, spare, "t2", [event(1, region="eu", score=2)], first=1)
    assert result.error == ""
    assert stages_of(pipeline).check(spare).altered == ""  # placed as in the target
    assert rows_of(pipeline, spare, "_offset", "score", "region") == [(1, 2, "eu")]


def test_the_stage_table_takes_the_type_another_participant_gave_the_target(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "theirs")
    table = new_stage(pipeline, "t1")
    pipeline.client().command(f"ALTER TABLE `{pipeline.cfg.clickhouse.database}`.`events` ADD COLUMN score String")
    result = stage(stager_of(pipeline, ADD_COLUMNS), pipeline, table, "t1", [event(0, score=7), event(1, score=8)])
    assert result.error == ""
    assert ("score", "String") in columns(pipeline, table)
    assert rows_of(pipeline, table, "score") == [("7",), ("8",)]


def test_a_value_its_column_cannot_read_is_a_dead_letter_naming_the_field(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "conflict")
    stager = stager_of(pipeline, ADD_COLUMNS)
    table = new_stage(pipeline, "t1")
    assert stage(stager, pipeline, table, "t1", [event(0, score=1)]).error == ""
    values = [event(1, score=2), event(2, score="abc"), event(3, score=4), event(4, score=1.5)]
    result = stage(stager, pipeline, table, "t1", values, first=1)
    assert (result.error, result.rows, result.dead_letters) == ("", 2, 2)
    assert rows_of(pipeline, table, "_offset", "score") == [(0, 1), (1, 2), (3, 4)]
    found = letters(pipeline)
    assert [offset for offset, _, _ in found] == [2, 4]
    assert all(code != 0 for _, code, _ in found)  # ClickHouse refused them
    assert found[0][2].startswith("field score: column score is Int64 and cannot hold a string (ClickHouse: ")
    assert found[1][2].startswith("field score: column score is Int64 and cannot hold a float (ClickHouse: ")


def test_unknown_fields_dead_letter_sets_aside_records_carrying_a_field_the_target_lacks(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "unknown")
    table = new_stage(pipeline, "t1")
    stager = stager_of(pipeline, SchemaSection(unknown_fields="dead-letter"))
    values = [event(0), event(1, country="fr"), event(2, country=None), event(3, country="de", zone=1)]
    result = stage(stager, pipeline, table, "t1", values)
    assert (result.error, result.rows, result.dead_letters) == ("", 2, 2)
    assert rows_of(pipeline, table, "_offset") == [(0,), (2,)]  # a null field carries nothing: stored
    assert letters(pipeline) == [
        (1, 0, 'unknown field country: the target has no column country (schema.evolve = "off")'),
        (
            3,
            0,
            'unknown field country: the target has no column country (schema.evolve = "off"); '
            "other unknown fields: zone",
        ),
    ]
    assert "country" not in dict(columns(pipeline, "events"))


def test_off_and_ignore_store_the_rows_without_the_field_as_before(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "ignore")
    table = new_stage(pipeline, "t1")
    result = stage(stager_of(pipeline, SchemaSection()), pipeline, table, "t1", [event(0, country="fr")])
    assert (result.error, result.rows, result.dead_letters) == ("", 1, 0)
    assert "country" not in dict(columns(pipeline, table))


def test_a_field_that_cannot_be_a_column_is_a_dead_letter(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "badname")
    table = new_stage(pipeline, "t1")
    values = [event(0), b'{"id": 1, "user": "u", "amount": 0, "": 5}']
    result = stage(stager_of(pipeline, ADD_COLUMNS), pipeline, table, "t1", values)
    assert (result.error, result.rows, result.dead_letters) == ("", 1, 1)
    [(offset, code, error)] = letters(pipeline)
    assert (offset, code) == (1, 0)
    assert error.startswith("field '': an empty name cannot be a ClickHouse column")


def test_an_alter_that_fails_fails_the_chunk_and_stages_nothing(stack, tmp_path):
    pipeline = pipeline_of(stack, tmp_path, "alterfails")
    table = new_stage(pipeline, "t1")
    db = pipeline.cfg.clickhouse.database
    pipeline.client().command(f"DROP TABLE `{db}`.`events` SYNC")  # the target is gone: ALTER it fails for good
    result = stage(stager_of(pipeline, ADD_COLUMNS), pipeline, table, "t1", [event(0), event(1, country="fr")])
    assert result.rows == 0
    assert result.error.startswith(f"cannot add columns country String to {db}.events for fields the records carry")
    assert rows_of(pipeline, table, "_offset") == []
    assert letters(pipeline) == []


def test_add_columns_with_routes_adds_each_field_to_the_table_its_records_go_to(stack, tmp_path):
    """Issue 35 item 9: with ``[[route]]`` (no ``clickhouse.target_table``) a new field becomes a
    column of the table its topic is routed to, not an ALTER of an empty table name. Real leader and
    participant tasks; every record once in its table."""
    pipeline = make_routed_pipeline(
        stack, tmp_path, unique_name("evroute"), tables=2, extra='\n[schema]\nevolve = "add-columns"\n'
    )
    name = pipeline.cfg.name
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "linger.ms": 5})
    for i in range(300):  # country in both topics, score in t1's only
        producer.produce(f"{name}_t0", json.dumps({"id": i, "country": "NL"}).encode(), partition=i % 2)
        producer.produce(f"{name}_t1", json.dumps({"id": i, "country": "FR", "score": i}).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    produced = {"t0": 300, "t1": 300}
    with coordinator(pipeline), participants(pipeline, tasks=2):
        wait_until(
            lambda: all(table_count(pipeline, t) == n for t, n in produced.items()), 60, "every record committed"
        )
    assert ("country", "String") in columns(pipeline, "t0") and "score" not in dict(columns(pipeline, "t0"))
    assert {("country", "String"), ("score", "Int64")} <= set(columns(pipeline, "t1"))
    db = pipeline.cfg.clickhouse.database
    assert pipeline.client().command(f"SELECT countIf(country = 'FR' AND score >= 0) FROM `{db}`.t1") == 300
    assert_exactly_once_per_table(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
