"""protocol.framing: bodies framed without reading records, and the INSERT that fills the metadata."""

from __future__ import annotations

import pytest

from protocol.errors import SetupError
from protocol.framing import Column, MetadataInsert, check_format, frame, offset_runs, varint
from tests.records import Rec

COLUMNS = [
    Column("id", "UInt64"),
    Column("country", "LowCardinality(String)", "DEFAULT", "'none'"),
    Column("tags", "Array(String)", "DEFAULT", "[]"),
    Column("day", "Date", "MATERIALIZED", "today()"),
    Column("_topic", "String"),
    Column("_partition", "UInt32"),
    Column("_offset", "UInt64"),
]


def recs(offsets: list[int], value: bytes = b"{}") -> list[Rec]:
    return [Rec("src.a", 3, o, value) for o in offsets]


@pytest.mark.parametrize(
    "fmt, expected",
    [
        ("JSONEachRow", b'{"a":1}\n1,"x"'),
        ("CSV", b'{"a":1}\n1,"x"'),
        ("TabSeparated", b'{"a":1}\n1,"x"'),
        ("RowBinary", b'{"a":1}1,"x"'),
        ("AvroConfluent", b'{"a":1}1,"x"'),
        ("Protobuf", b'\x07{"a":1}\x051,"x"'),
    ],
)
def test_a_body_is_the_values_framed_by_their_format(fmt: str, expected: bytes) -> None:
    assert frame([Rec("t", 0, 0, b'{"a":1}'), Rec("t", 0, 1, b'1,"x"')], fmt) == expected


def test_varints_are_protobufs():
    assert [varint(n) for n in (0, 1, 127, 128, 300, 16384)] == [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
        b"\x80\x80\x01",
    ]


def test_offsets_become_runs():
    assert offset_runs([5, 6, 7, 9, 10, 20]) == ([5, 9, 20], [3, 2, 1])
    assert offset_runs([4]) == ([4], [1])


def test_consecutive_offsets_pass_the_first_one_only():
    statement, params = MetadataInsert("db", "stage", COLUMNS, "JSONEachRow").statement("src.a", 3, recs([7, 8, 9]))
    assert params == {"chtxn_topic": "src.a", "chtxn_partition": 3, "chtxn_first": 7}
    assert statement == (
        "INSERT INTO `db`.`stage` (`id`, `country`, `tags`, `_topic`, `_partition`, `_offset`) "
        "SELECT `id`, ifNull(`country`, 'none'), `tags`, {chtxn_topic:String}, {chtxn_partition:UInt32}, "
        "{chtxn_first:UInt64} + rowNumberInAllBlocks() "
        "FROM input('`id` UInt64, `country` LowCardinality(Nullable(String)), `tags` Array(String)') FORMAT JSONEachRow"
    )


def test_offsets_with_gaps_pass_their_runs():
    statement, params = MetadataInsert("db", "stage", COLUMNS, "CSV").statement("src.a", 3, recs([7, 8, 10, 11, 15]))
    assert params == {
        "chtxn_topic": "src.a",
        "chtxn_partition": 3,
        "chtxn_starts": [7, 10, 15],
        "chtxn_lengths": [2, 2, 1],
    }
    assert "{chtxn_starts:Array(UInt64)}, {chtxn_lengths:Array(UInt64)}))[rowNumberInAllBlocks() + 1]" in statement
    assert statement.endswith("FORMAT CSV")


def test_only_the_metadata_columns_the_table_has_are_filled():
    insert = MetadataInsert("db", "t", [Column("v", "String"), Column("_offset", "Int64")], "JSONEachRow")
    statement, params = insert.statement("src", 0, recs([3]))
    assert insert.metadata == ("_offset",) and params == {"chtxn_topic": "src", "chtxn_partition": 0, "chtxn_first": 3}
    assert (
        "(`v`, `_offset`) SELECT `v`, {chtxn_first:UInt64} + rowNumberInAllBlocks() FROM input('`v` String')"
        in statement
    )
    assert MetadataInsert("db", "t", [Column("v", "String")], "CSV").metadata == ()


def test_metadata_columns_need_a_format_of_one_record_per_row():
    with pytest.raises(SetupError, match=r"input_format is 'Parquet'.*one record per row.*AvroConfluent"):
        check_format("Parquet", ["x", "_offset"])
    check_format("Parquet", ["x"])
    for fmt in ("NDJSON", "CSV", "TSV", "RowBinary", "AvroConfluent", "Protobuf"):
        check_format(fmt, ["_offset"])
