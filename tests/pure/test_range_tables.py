"""Which table each committed range went to: written by the leader, read back (rows of earlier
versions included), and the outcome of ``verify --deep`` built from per-partition checks. No server."""

from __future__ import annotations

from datetime import datetime

import msgspec

from protocol.ledger import claims as ledger_claims, range_tables, rows as ledger
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.routing import Route
from protocol.verify import check as deep_check, report as deep_report
from protocol.verify.report import PartitionCheck


class R(msgspec.Struct, frozen=True):
    topics: tuple[str, ...]
    table: str


ROUTES: tuple[Route, ...] = (R(("orders",), "a"), R(("re:pay.*",), "b"), R(("re:pay.*",), "c"))


def commit(target: str, *ranges: PartitionRange) -> LedgerRow:
    return LedgerRow(
        pipeline="p", txn="e1_t1", event=LedgerEvent.COMMITTED, epoch=1, commit_seq=1, target=target, ranges=ranges
    )


def rng(topic: str, table: str = "") -> PartitionRange:
    return PartitionRange(topic=topic, partition=0, start=0, end=10, rows=10, table=table)


def test_a_range_names_the_table_its_route_gives_else_the_txns_only_stage_tables():
    assert range_tables.tables_at_commit(ROUTES, ["orders", "gone"], ["a", "b"]) == {"orders": "a", "gone": ""}
    # an unrouted or ambiguous topic is staged where a participant falls back: the txn's only stage table
    assert range_tables.tables_at_commit(ROUTES, ["gone", "payments"], ["b"]) == {"gone": "b", "payments": "b"}


def test_a_range_of_an_earlier_version_goes_to_its_rows_one_target_else_to_todays_route_if_the_row_names_it():
    today = range_tables.routed_today(ROUTES, ["orders", "payments", "gone"])
    assert today == {"orders": "a"}  # payments matches two tables, gone none
    assert range_tables.table_of_range(commit("x", rng("orders", "b")), rng("orders", "b"), today) == "b"
    assert range_tables.table_of_range(commit("x"), rng("orders"), today) == "x"  # its single target then
    assert range_tables.table_of_range(commit("a,z"), rng("orders"), today) == "a"
    assert range_tables.table_of_range(commit("y,z"), rng("orders"), today) == ""  # cannot be told
    assert range_tables.table_of_range(commit(""), rng("orders"), today) == "a"  # written by hand
    assert range_tables.table_of_range(commit("y,z"), rng("gone"), today) == ""
    assert range_tables.route_parameters(today) == {"route_topics": ["orders"], "route_tables": ["a"]}


def test_rows_without_tables_read_as_ranges_of_no_table():
    """A ledger row of an earlier version: no ``tables`` column (or an empty array after the upgrade),
    and a Keeper claim's JSON without ``table`` in its ranges."""
    new = commit("a", rng("orders", "a"))
    values = [*ledger.to_insert_values(new), 0]
    by_name = dict(zip((*ledger.INSERT_COLUMNS, "event_time"), values))
    assert by_name["tables"] == ["a"]
    old_values = [int(v.timestamp() * 1000) if isinstance(v, datetime) else v for v in values]  # as a query returns
    old_values[ledger.INSERT_COLUMNS.index("tables")] = []
    assert ledger.from_result_row(old_values).ranges == (rng("orders"),)
    encoded = msgspec.json.encode(new).replace(b',"table":"a"', b"")
    assert ledger_claims.decode_row(encoded.decode()).ranges == (rng("orders"),)
    assert ledger.ADDED_COLUMNS == (("tables", "Array(LowCardinality(String))"), ("shards", "Array(String)"))
    assert ledger.add_column_sql("db", "tables") == (
        "ALTER TABLE `db`.`chtxn_ledger` ADD COLUMN IF NOT EXISTS tables Array(LowCardinality(String))"
    )


def check(**fields: object) -> PartitionCheck:
    base = dict(topic="t", partition=0, committed_from=0, committed_to=10, expected_rows=10, rows=10)
    base |= dict(distinct_offsets=10, duplicates=0, outside=0, dead_letters=0, ok=True)
    return PartitionCheck(**{**base, **fields})  # type: ignore[arg-type]  # fields of mixed types


def test_expired_evidence_is_its_own_outcome_and_a_failure_outranks_it():
    clean = deep_report.table_report([check()])
    assert (clean.outcome, clean.ok) == (deep_check.PASSED, True)
    gone = deep_report.table_report([check(unsure=1, rows=9)], expired=["t-0: 1 committed rows missing ..."])
    assert (gone.outcome, gone.ok, gone.anomalies) == (deep_check.EXPIRED, True, ())
    assert "evidence expired: t-0" in gone.reason
    broken = deep_report.table_report([check(ok=False, duplicates=1, rows=11)])
    assert (broken.outcome, broken.ok) == (deep_check.FAILED, False)
    assert "1 duplicates, 0 missing" in broken.anomalies[0]
    assert deep_report.amended(gone, anomalies=["lost"]).outcome == deep_check.FAILED
    both = deep_report.merged({"a": clean, "b": gone})
    assert (both.outcome, both.ok, both.expired) == (
        deep_check.EXPIRED,
        True,
        ("b: t-0: 1 committed rows missing ...",),
    )
    assert deep_report.merged({"a": broken, "b": gone}).outcome == deep_check.FAILED


def test_ranges_given_in_python_are_written_into_the_sql_text_quoted():
    assert deep_check.sql_string("it's a \\ path") == "'it\\'s a \\\\ path'"
    sql = deep_check.given_ranges_sql([("e1_t1", "o'rders", 0, 10, 20, 10, "events")])
    assert "('e1_t1', 'o\\'rders', 0, 10, 20, 10, 'events', 0)" in sql and "{" not in sql
    assert "CAST([], 'Array(Tuple(String, Int32, Int64))')" in deep_check.given_floors_sql([])
