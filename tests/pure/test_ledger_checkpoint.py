"""Checkpoint rows, the head overlay, the settled prefix, the expiry SQL and the audit from a checkpoint."""

from __future__ import annotations

from protocol.ledger import checkpoint as ledger_checkpoint, rows as ledger, sql as ledger_sql
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.ledger.view import audit
from protocol.messages import TopicPartition


def tp(partition: int) -> TopicPartition:
    return TopicPartition(topic="src", partition=partition)


def commit(seq: int, *ranges: tuple[int, int, int]) -> LedgerRow:
    return LedgerRow(
        pipeline="p",
        txn=f"e1_t{seq}",
        event=LedgerEvent.COMMITTED,
        epoch=1,
        commit_seq=seq,
        ranges=tuple(PartitionRange(topic="src", partition=p, start=s, end=e) for p, s, e in ranges),
    )


def test_a_checkpoint_row_holds_every_partitions_end_and_reads_back() -> None:
    row = ledger_checkpoint.checkpoint_row("p", 7, {tp(1): 30, tp(0): 10}, epoch=2, coordinator="c1")
    assert (row.event, row.commit_seq, row.txn, row.epoch) == (LedgerEvent.CHECKPOINT, 7, "", 2)
    assert [(r.partition, r.start, r.end) for r in row.ranges] == [(0, 10, 10), (1, 30, 30)]
    assert ledger_checkpoint.offsets_of(row) == {tp(0): 10, tp(1): 30}
    assert ledger_checkpoint.offsets_of(None) == {}


def test_overlay_applies_the_commits_after_the_checkpoint() -> None:
    checkpoint = ledger_checkpoint.checkpoint_row("p", 7, {tp(0): 10, tp(1): 30}, epoch=1, coordinator="c1")
    head_rows = [("src", 1, 45, 9), ("", 0, 0, 10)]  # a seal at slot 10 lands in the ('', 0) group
    assert ledger_checkpoint.overlay(checkpoint, head_rows) == (10, {tp(0): 10, tp(1): 45})
    assert ledger_checkpoint.overlay(checkpoint, []) == (7, {tp(0): 10, tp(1): 30})
    assert ledger_checkpoint.overlay(None, [("src", 2, 5, 1)]) == (1, {tp(2): 5})


def test_the_settled_prefix_stops_at_a_hole_or_an_unpublished_commit() -> None:
    assert ledger_checkpoint.settled_through(4, [5, 6, 7], []) == 7
    assert ledger_checkpoint.settled_through(4, [5, 6, 7], [6]) == 5
    assert ledger_checkpoint.settled_through(4, [5, 7, 8], []) == 5  # slot 6 holds no commit
    assert ledger_checkpoint.settled_through(4, [5, 6], [5]) == 4
    assert ledger_checkpoint.settled_through(0, [], []) == 0


def test_reads_are_bounded_by_the_primary_key() -> None:
    assert "commit_seq > {after:UInt64} AND commit_seq <= {through:UInt64}" in ledger_sql.resolved_commits_sql("db")
    unpublished = ledger_sql.committed_unpublished_sql("db")
    assert "AND event IN ('PUBLISHED', 'LOST') AND (commit_seq > {after:UInt64} OR commit_seq = 0)" in unpublished
    assert "event = 'CHECKPOINT'" in ledger_sql.max_epoch_sql("db")
    assert "event_time >= fromUnixTimestamp64Milli({since_ms:Int64})" in ledger_sql.history_txns_sql("db")
    assert "AS fence_ms" in ledger_sql.slot_winner_sql("db", LedgerEvent.COMMITTED)
    assert "fence_ms" not in ledger_sql.slot_winner_sql("db", LedgerEvent.EPOCH)


def test_expiry_spares_the_horizon_and_the_rows_nobody_may_lose() -> None:
    checkpoints = ledger_checkpoint.expire_checkpoints_sql("db")
    assert checkpoints.startswith("DELETE FROM `db`.`chtxn_ledger`")
    assert "event = 'CHECKPOINT' AND commit_seq < {through:UInt64}" in checkpoints  # K itself stays
    rows = ledger_checkpoint.expire_rows_sql("db")
    assert "event IN ('COMMITTED', 'PUBLISHED') AND commit_seq BETWEEN 1 AND {through:UInt64}" in rows
    assert "event IN ('STARTED', 'ABORTED') AND event_time < fromUnixTimestamp64Milli({before_ms:Int64})" in rows
    for kept in ("EPOCH", "INITIAL", "GAP", "LOST", "CHECKPOINT"):
        assert f"'{kept}'" not in rows


def test_the_ddl_has_the_skip_indexes_and_older_ledgers_get_them() -> None:
    ddl = ledger.create_table_sql("db")
    for name, definition in ledger.SKIP_INDEXES:
        assert f"INDEX {name} {definition}" in ddl
    add, materialize = ledger.add_index_sql("db", "chtxn_txn")
    assert (
        add == "ALTER TABLE `db`.`chtxn_ledger` ADD INDEX IF NOT EXISTS chtxn_txn txn TYPE bloom_filter GRANULARITY 1"
    )
    assert materialize == "ALTER TABLE `db`.`chtxn_ledger` MATERIALIZE INDEX chtxn_txn"


def test_audit_from_a_checkpoint_finds_overlaps_gaps_and_disagreements() -> None:
    start = ledger_checkpoint.checkpoint_row("p", 10, {tp(0): 100, tp(1): 50}, epoch=1, coordinator="c1")
    sound = [commit(11, (0, 100, 120)), commit(12, (1, 50, 60))]
    later = ledger_checkpoint.checkpoint_row("p", 12, {tp(0): 120, tp(1): 60}, epoch=1, coordinator="c1")
    assert audit(sound, start=start, checkpoints=[start, later]) == []

    problems = audit([commit(11, (0, 90, 120)), commit(13, (1, 55, 60))], start=start)
    assert problems == [
        "src/0: offsets 90..99 are committed twice, by the checkpoint at slot 10 and commit 11 (txn e1_t11)",
        "commit slots 12..12 are missing before commit 13 (txn e1_t13)",
        "src/1: offsets 50..54 were never committed, between the checkpoint at slot 10 and commit 13 (txn e1_t13)",
    ]
    wrong = ledger_checkpoint.checkpoint_row("p", 11, {tp(0): 125, tp(1): 50}, epoch=1, coordinator="c1")
    assert audit(sound, start=start, checkpoints=[wrong]) == [
        "src/0: the checkpoint at slot 11 says the committed end is 125, the chain says 120"
    ]
    ahead = ledger_checkpoint.checkpoint_row("p", 14, {tp(0): 120, tp(1): 60}, epoch=1, coordinator="c1")
    assert audit(sound, start=start, checkpoints=[ahead]) == [
        "the checkpoint at slot 14 is past the last commit, slot 12"
    ]
