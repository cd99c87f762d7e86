"""embedded.ch_sql: where an INSERT's data begins, and the input() call the endpoint reads it in."""

from __future__ import annotations

from embedded.ch_request import split_statement
from embedded.ch_sql import split_insert

SELECT_INPUT = (
    "INSERT INTO db.t (a, `b`, _offset) SELECT a, ifNull(b, 'x)'), {first:UInt64} + rowNumberInAllBlocks() "
    "FROM input('a UInt64, b Nullable(String)') FORMAT JSONEachRow"
)


def test_an_insert_select_from_input_has_its_data_after_the_format() -> None:
    text = SELECT_INPUT + '\n{"a":1}\n{"a":2}'
    insert = split_insert(text)
    assert insert is not None
    assert (insert.input_format, text[insert.data_offset :]) == ("JSONEachRow", '{"a":1}\n{"a":2}')
    assert insert.input_args == "'a UInt64, b Nullable(String)'"
    assert insert.input_call is not None
    start, end = insert.input_call
    assert insert.statement[start:end] == "input('a UInt64, b Nullable(String)')"
    assert insert.statement == SELECT_INPUT.removesuffix(" FORMAT JSONEachRow")


def test_the_query_parameter_and_the_body_join_as_clickhouse_joins_them() -> None:
    stmt = split_statement(SELECT_INPUT, b"1\t2\n")
    assert stmt.insert is not None and bytes(stmt.data) == b"1\t2\n"


def test_an_insert_select_without_input_has_no_data() -> None:
    assert split_insert("INSERT INTO t SELECT * FROM numbers(3) FORMAT TSV") is None
    assert split_insert("INSERT INTO t SELECT input FROM s FORMAT TSV\n1") is None  # a column, not the function
    plain = split_insert("INSERT INTO t (a) FORMAT CSV\n1")
    assert plain is not None and plain.input_call is None
