"""Schema evolution rules (``protocol.tables.schema_types``): kinds and type inference, the scan of a chunk's
fields, the DDL text, naming the field of a refused record, and the ``[schema]`` config checks."""

from __future__ import annotations

import json

import pytest

from protocol import insert_settings
from protocol.config.parse import parse_config
from protocol.errors import ConfigError
from protocol.tables.schema_types import (
    Kind,
    accepts,
    add_columns_sql,
    addable,
    column_type,
    conflict,
    conflict_error,
    kind_of_raw,
    kind_of_value,
    scan_fields,
    stage_additions,
    unknown_field_error,
)

# ---- kinds and inference --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"null", Kind.NULL),
        (b"true", Kind.BOOL),
        (b"false", Kind.BOOL),
        (b"0", Kind.INT),
        (b"-17", Kind.INT),
        (b"9223372036854775807", Kind.INT),
        (b"-9223372036854775808", Kind.INT),
        (b"9223372036854775808", Kind.BIG_INT),
        (b"-9223372036854775809", Kind.BIG_INT),
        (b"18446744073709551616", Kind.BIG_INT),
        (b"1.5", Kind.FLOAT),
        (b"1e3", Kind.FLOAT),
        (b"-2E-4", Kind.FLOAT),
        (b'"1"', Kind.STRING),
        (b'{"a": [1]}', Kind.OBJECT),
        (b"[1, 2]", Kind.ARRAY),
    ],
)
def test_the_kind_of_a_raw_value(raw: bytes, kind: Kind) -> None:
    assert kind_of_raw(raw) is kind
    assert kind_of_value(json.loads(raw)) is kind  # the fallback reader agrees


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ({Kind.BOOL}, "Bool"),
        ({Kind.INT}, "Int64"),
        ({Kind.INT, Kind.NULL}, "Int64"),
        ({Kind.FLOAT}, "Float64"),
        ({Kind.INT, Kind.FLOAT}, "Float64"),
        ({Kind.BIG_INT, Kind.FLOAT}, "Float64"),
        ({Kind.BIG_INT}, "String"),
        ({Kind.INT, Kind.BIG_INT}, "String"),
        ({Kind.STRING}, "String"),
        ({Kind.OBJECT}, "String"),
        ({Kind.ARRAY}, "String"),
        ({Kind.OBJECT, Kind.ARRAY}, "String"),
        ({Kind.BOOL, Kind.INT}, "String"),
        ({Kind.INT, Kind.STRING}, "String"),
        ({Kind.FLOAT, Kind.BOOL}, "String"),
        ({Kind.NULL}, None),
        (set(), None),
    ],
)
def test_type_inference(kinds: set[Kind], expected: str | None) -> None:
    assert column_type(kinds) == expected


def test_metadata_columns_and_empty_names_are_never_added() -> None:
    assert addable("country")
    assert addable("a.b")
    assert not addable("_offset")
    assert not addable("_topic")
    assert not addable("")


# ---- scanning a chunk's fields ----------------------------------------------------------------


def test_a_chunk_with_only_known_fields_finds_nothing() -> None:
    values = [json.dumps({"id": i, "user": "u"}).encode() for i in range(100)]
    found = scan_fields(values, {"id", "user", "amount"})
    assert (found.kinds, found.unknown, found.unread) == ({}, {}, [])
    assert found.types() == {}


def test_new_fields_are_found_with_their_kinds_and_records() -> None:
    values = [
        b'{"id": 1}',
        b'{"id": 2, "country": "fr", "score": 3}',
        b'{"score": 4.5, "id": 3, "tags": ["a"], "gone": null}',
        b'{"id": 4, "gone": null, "meta": {"x": 1}}',
    ]
    found = scan_fields(values, {"id"})
    assert found.kinds == {
        "country": {Kind.STRING},
        "score": {Kind.INT, Kind.FLOAT},
        "tags": {Kind.ARRAY},
        "gone": {Kind.NULL},
        "meta": {Kind.OBJECT},
    }
    assert list(found.kinds) == ["country", "score", "tags", "gone", "meta"]  # first met first
    assert found.unknown == {1: ["country", "score"], 2: ["score", "tags"], 3: ["meta"]}  # nulls are absent
    assert found.types() == {"country": "String", "score": "Float64", "tags": "String", "meta": "String"}


def test_records_msgspec_refuses_are_read_by_pythons_json_and_malformed_ones_left_to_clickhouse() -> None:
    values = [
        b'{"id": 1, "ratio": NaN}',  # msgspec refuses NaN, Python's json reads it
        b'{"id": 2, "note": "a\nb"}',  # a raw newline inside a string
        b'{"id": 3, "broken": ',  # malformed: ClickHouse refuses it, then it is a letter
        b'{"id": 4, "name": "\xff"}',  # not UTF-8: msgspec keeps the raw bytes
    ]
    found = scan_fields(values, {"id"})
    assert found.kinds == {"ratio": {Kind.FLOAT}, "note": {Kind.STRING}, "name": {Kind.STRING}}
    assert found.unread == [2]
    assert found.unknown == {0: ["ratio"], 1: ["note"], 3: ["name"]}


def test_the_unknown_field_error_names_the_field() -> None:
    assert unknown_field_error(["country"]) == (
        'unknown field country: the target has no column country (schema.evolve = "off")'
    )
    assert unknown_field_error(["a", "b", "c"]).endswith("; other unknown fields: b, c")


# ---- DDL ------------------------------------------------------------------------------------


def test_add_columns_sql() -> None:
    sql = add_columns_sql(
        "`db`.`t`",
        [("a", "Int64", None), ("b`c", "String", ""), ("d", "Bool", "a")],
        on_cluster=" ON CLUSTER `c1`",
    )
    assert sql == (
        "ALTER TABLE `db`.`t` ON CLUSTER `c1` ADD COLUMN IF NOT EXISTS `a` Int64, "
        "ADD COLUMN IF NOT EXISTS `b\\`c` String FIRST, ADD COLUMN IF NOT EXISTS `d` Bool AFTER `a`"
    )


BASE = [("id", "UInt64"), ("user", "String"), ("_offset", "Int64")]


def test_a_stage_table_gets_the_targets_type_and_place() -> None:
    target = [*BASE, ("x", "Int64"), ("y", "String")]
    assert stage_additions(target, ["id", "user", "_offset"], {"y", "x"}) == [
        ("x", "Int64", "_offset"),
        ("y", "String", "x"),
    ]
    assert stage_additions(target, ["id", "user", "_offset", "x"], {"x", "y"}) == [("y", "String", "x")]
    assert stage_additions(target, ["id", "user", "_offset", "x", "y"], {"x"}) == []
    assert stage_additions([("x", "Int64"), *BASE], ["id", "user", "_offset"], {"x"}) == [("x", "Int64", "")]


def test_fields_arriving_in_any_order_leave_the_stage_in_the_targets_order() -> None:
    """Two participants each add their field: applied one after the other (each reading the stage
    table before its own ALTER), the stage table's columns come out in the target's order."""
    target = [*BASE, ("x", "Int64"), ("y", "String"), ("z", "Bool")]
    for order in (["x", "y", "z"], ["z", "y", "x"], ["y", "z", "x"], ["z", "x", "y"]):
        stage = [name for name, _ in BASE]
        for name in order:
            for added, _, after in stage_additions(target, stage, {name}):
                stage.insert(stage.index(after) + 1 if after else 0, added)
        assert stage == [name for name, _ in target], order


# ---- naming the field of a refused record ------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "raw", "ok"),
    [
        ("Int64", b"1", True),
        ("Int64", b"true", True),
        ("Int64", b'"12"', True),
        ("Int64", b'"abc"', False),
        ("Int64", b"1.5", False),
        ("Nullable(UInt32)", b"1.5", False),
        ("Float64", b"3", True),
        ("Float64", b'"1.25"', True),
        ("Float64", b'"x"', False),
        ("Decimal(10, 2)", b'"x"', False),
        ("Bool", b"true", True),
        ("Bool", b"1", True),
        ("Bool", b"2", False),
        ("Bool", b'"true"', False),
        ("String", b"[1]", True),
        ("LowCardinality(String)", b"1", True),
        ("DateTime", b'"x"', True),  # not judged here: ClickHouse is
        ("Interval", b"1.5", True),
        ("Int64", b"null", True),
    ],
)
def test_which_values_a_column_reads(column: str, raw: bytes, ok: bool) -> None:
    assert accepts(column, kind_of_raw(raw), raw) is ok


def test_a_conflict_names_the_field() -> None:
    columns = {"id": "UInt64", "score": "Int64", "note": "String"}
    found = conflict(b'{"id": 1, "note": 2, "score": "abc"}', columns)
    assert found == ("score", "Int64", Kind.STRING)
    assert conflict_error(found, "Code: 27. Cannot parse input") == (
        "field score: column score is Int64 and cannot hold a string (ClickHouse: Code: 27. Cannot parse input)"
    )
    assert conflict(b'{"id": 1, "score": 2}', columns) is None
    assert conflict(b'{"id": 1, "score": ', columns) is None


# ---- [schema] config ----------------------------------------------------------------------------

CONFIG = """
[pipeline]
name = "orders"
topics = ["orders"]

[clickhouse]
target_table = "events"
"""


def error_of(text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, environ or {}, source="pipeline.toml")
    return info.value


def test_schema_defaults_and_modes() -> None:
    cfg = parse_config(CONFIG, {})
    assert (cfg.schema.evolve, cfg.schema.unknown_fields) == ("off", "ignore")
    cfg = parse_config(CONFIG + '[schema]\nevolve = "add-columns"\n', {})
    assert cfg.schema.evolve == "add-columns"
    cfg = parse_config(CONFIG, {"CHTXN_SCHEMA_UNKNOWN_FIELDS": "dead-letter"})
    assert cfg.schema.unknown_fields == "dead-letter"


def test_an_unknown_mode_is_refused_naming_the_key() -> None:
    error = error_of(CONFIG + '[schema]\nevolve = "add-everything"\n')
    assert error.key == "schema.evolve"


@pytest.mark.parametrize(
    ("schema", "key"),
    [('evolve = "add-columns"', "schema.evolve"), ('unknown_fields = "dead-letter"', "schema.unknown_fields")],
)
def test_the_modes_need_a_json_object_input_format(schema: str, key: str) -> None:
    text = CONFIG.replace('target_table = "events"', 'target_table = "events"\ninput_format = "CSV"')
    error = error_of(f"{text}[schema]\n{schema}\n")
    assert error.key == key
    assert "clickhouse.input_format is 'CSV'" in str(error)
    assert parse_config(text, {}).schema.evolve == "off"  # off, CSV stays as it was


def test_dead_letter_goes_with_evolve_off_only() -> None:
    error = error_of(CONFIG + '[schema]\nevolve = "add-columns"\nunknown_fields = "dead-letter"\n')
    assert error.key == "schema.unknown_fields"


def test_add_columns_refuses_insert_settings_that_turn_its_own_off() -> None:
    text = CONFIG + "[clickhouse.insert_settings]\ninput_format_skip_unknown_fields = 0\n"
    assert parse_config(text, {}).schema.evolve == "off"  # today's behaviour: the user's choice
    error = error_of(text + '[schema]\nevolve = "add-columns"\n')
    assert error.key == "clickhouse.insert_settings.input_format_skip_unknown_fields"
    ok = CONFIG + "[clickhouse.insert_settings]\ninput_format_json_read_objects_as_strings = 1\n"
    assert parse_config(ok + '[schema]\nevolve = "add-columns"\n', {}).schema.evolve == "add-columns"


def test_add_columns_adds_its_input_format_settings_to_chunk_inserts() -> None:
    plain = insert_settings.for_server(None)
    evolving = insert_settings.for_server(None, add_columns=True)
    assert "input_format_skip_unknown_fields" not in plain  # off: the server's default, as before
    assert evolving == {**plain, **insert_settings.ADD_COLUMNS_SETTINGS}
    known = {name: "" for name in plain} | {"input_format_skip_unknown_fields": ""}
    assert set(insert_settings.for_server(known, add_columns=True)) == {*plain, "input_format_skip_unknown_fields"}
