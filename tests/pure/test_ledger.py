"""The ledger schema, row conversion, txn summaries and the commit-chain audit (no server)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from protocol.ledger import rows as ledger
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.ledger.view import audit, summarize


def rng(partition: int, start: int, end: int, rows: int | None = None, topic: str = "src") -> PartitionRange:
    return PartitionRange(
        topic=topic, partition=partition, start=start, end=end, rows=end - start if rows is None else rows
    )


def row(event: LedgerEvent, txn: str = "e1_t1", **fields: object) -> LedgerRow:
    return LedgerRow(pipeline="orders", txn=txn, event=event, epoch=fields.pop("epoch", 1), **fields)  # type: ignore[arg-type]  # fields of mixed types


def commit(seq: int, *ranges: PartitionRange, txn: str | None = None) -> LedgerRow:
    return row(LedgerEvent.COMMITTED, txn or f"e1_t{seq}", commit_seq=seq, ranges=ranges)


def test_ddl_has_no_partition_key_and_a_dedup_window() -> None:
    ddl = ledger.create_table_sql("db1")
    assert "CREATE TABLE IF NOT EXISTS `db1`.`chtxn_ledger`" in ddl
    assert "PARTITION BY" not in ddl
    assert f"non_replicated_deduplication_window = {ledger.DEDUP_WINDOW}" in ddl
    assert "ENGINE = MergeTree" in ddl
    replicated = ledger.create_table_sql("db1", replicated=True)
    assert "ReplicatedMergeTree" in replicated and "replicated_deduplication_window" in replicated
    for column in ledger.INSERT_COLUMNS:
        assert f"\n    {column} " in ddl, column


def test_a_row_survives_conversion_to_insert_values_and_back() -> None:
    original = row(
        LedgerEvent.COMMITTED,
        commit_seq=4,
        coordinator="c1",
        claim_id="abc",
        target="events",
        stage_table="events__chtxn_e1_t1",
        ranges=(rng(0, 10, 20), rng(1, 5, 5, topic="other")),
        total_rows=10,
        total_bytes=999,
        dead_letters=1,
        started_at=1700000000.125,
        ended_at=1700000001.5,
        committed_at=1700000001.75,
        reason="",
    )
    values = ledger.to_insert_values(original)
    assert len(values) == len(ledger.INSERT_COLUMNS)
    by_name = dict(zip(ledger.INSERT_COLUMNS, values))
    assert by_name["topics"] == ["src", "other"] and by_name["end_offsets"] == [20, 5]
    assert by_name["started_at"] == datetime(2023, 11, 14, 22, 13, 20, 125000, tzinfo=timezone.utc)
    # what a query returns: times as unix milliseconds, event_time last
    returned = [int(v.timestamp() * 1000) if isinstance(v, datetime) else v for v in values] + [1700000002000]
    back = ledger.from_result_row(returned)
    assert back == LedgerRow(
        **{**{f: getattr(original, f) for f in original.__struct_fields__}, "event_time": 1700000002.0}
    )


def test_state_precedence_in_python_and_sql_agree() -> None:
    assert ledger.state_of(["STARTED"]) == "STARTED"
    assert ledger.state_of(["STARTED", "ABORTED"]) == "ABORTED"
    assert ledger.state_of(["STARTED", "COMMITTED"]) == "COMMITTED"
    assert ledger.state_of(["STARTED", "COMMITTED", "PUBLISHED"]) == "PUBLISHED"
    assert ledger.state_of(["GAP"]) == "STARTED"
    sql = ledger.state_sql("e")
    assert sql.index("'PUBLISHED'") < sql.index("'COMMITTED'") < sql.index("'ABORTED'")


def test_summary_of_a_published_txn() -> None:
    rows = [
        row(LedgerEvent.STARTED, ranges=(rng(0, 0, -1, 0),), started_at=100.0, event_time=100.01, coordinator="c1"),
        row(
            LedgerEvent.COMMITTED,
            commit_seq=1,
            ranges=(rng(0, 0, 50),),
            total_rows=50,
            started_at=100.0,
            ended_at=101.0,
            committed_at=101.25,
            event_time=101.3,
            coordinator="c1",
            target="events",
        ),
        row(LedgerEvent.PUBLISHED, commit_seq=1, ranges=(rng(0, 0, 50),), published_at=101.5, event_time=101.5),
    ]
    s = summarize(list(reversed(rows)))
    assert (s.txn, s.state, s.epoch, s.commit_seq, s.total_rows) == ("e1_t1", "PUBLISHED", 1, 1, 50)
    assert s.ranges == (rng(0, 0, 50),)
    assert (s.consume_ms, s.commit_ms, s.publish_ms, s.total_ms) == (1000.0, 250.0, 250.0, 1500.0)
    assert s.events == ("STARTED", "COMMITTED", "PUBLISHED")
    assert s.coordinator == "c1" and s.target == "events"


def test_summary_of_an_aborted_txn() -> None:
    rows = [
        row(LedgerEvent.STARTED, ranges=(rng(0, 10, 10, 0),), started_at=100.0, event_time=100.0),
        row(LedgerEvent.ABORTED, reason="write-status timeout", ended_at=0.0, event_time=130.0),
    ]
    s = summarize(rows)
    assert (s.state, s.reason, s.aborted_at) == ("ABORTED", "write-status timeout", 130.0)
    assert s.ranges == (rng(0, 10, 10, 0),)  # the abort row had none: the start offsets remain
    assert s.total_ms == 30000.0 and s.consume_ms is None and s.commit_ms is None


def test_summary_needs_rows() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_a_sound_chain_has_no_anomalies() -> None:
    chain = [commit(1, rng(0, 0, 10), rng(1, 0, 5)), commit(2, rng(0, 10, 10)), commit(3, rng(0, 10, 30), rng(1, 5, 9))]
    assert audit(chain) == []


def test_audit_reports_overlap_backward_gap_and_missing_slots() -> None:
    chain = [
        commit(1, rng(0, 0, 10)),
        commit(2, rng(0, 8, 20)),  # overlaps 8..9
        commit(3, rng(0, 25, 30)),  # gap 20..24
        commit(5, rng(0, 30, 28, 0)),  # slot 4 missing; goes backward
    ]
    problems = audit(chain)
    assert len(problems) == 4, problems
    assert "src/0: offsets 8..9 are committed twice, by commit 1 (txn e1_t1) and commit 2 (txn e1_t2)" in problems
    assert any("offsets 20..24 were never committed" in p and "recorded" not in p for p in problems)
    assert any("commit slots 4..4 are missing" in p for p in problems)
    assert any("goes backward: end 28 < start 30" in p for p in problems)


def test_audit_mentions_a_gap_recorded_as_skipped() -> None:
    chain = [commit(1, rng(0, 0, 10)), commit(2, rng(0, 15, 20))]
    gap = row(LedgerEvent.GAP, txn="", ranges=(rng(0, 10, 15, 0),), reason="offsets 10..14 gone")
    [problem] = audit(chain, [gap])
    assert "offsets 10..14 were never committed" in problem
    assert "recorded as skipped" in problem and "offsets 10..14 gone" in problem


def test_audit_treats_partitions_independently() -> None:
    chain = [commit(1, rng(0, 0, 10)), commit(2, rng(1, 0, 10)), commit(3, rng(0, 10, 12), rng(1, 10, 11))]
    assert audit(chain) == []
