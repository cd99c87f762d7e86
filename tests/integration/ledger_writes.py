"""Ledger rows the tests write by hand: partition ranges, COMMITTED rows, and a txn's commit point
claimed as the leader claims it."""

from __future__ import annotations

from coordinator.ledger_store import LedgerStore
from protocol.ledger import LedgerEvent, LedgerRow, PartitionRange
from tests.pipelines import Pipeline


def rng(partition: int, start: int, end: int) -> PartitionRange:
    """Offsets [start, end) of partition ``partition`` of topic ``src``, one row each."""
    return PartitionRange(topic="src", partition=partition, start=start, end=end, rows=end - start)


def commit_row(
    store: LedgerStore, seq: int, txn: str, *ranges: PartitionRange, epoch: int = 1, who: str = "c1"
) -> LedgerRow:
    """The COMMITTED row of ``txn`` for slot ``seq`` of ``store``'s pipeline, not yet claimed."""
    return LedgerRow(
        pipeline=store.pipeline,
        txn=txn,
        event=LedgerEvent.COMMITTED,
        epoch=epoch,
        commit_seq=seq,
        coordinator=who,
        ranges=ranges,
        total_rows=sum(r.rows for r in ranges),
        stage_table=f"events__chtxn_p__{txn}",
    )


def commit(pipeline: Pipeline, txn: str, seq: int, start: int, end: int, partition: int = 0) -> None:
    """The leader's commit point for ``txn``: slot ``seq``, offsets [start, end) of one partition."""
    ranges = (PartitionRange(topic=pipeline.topic, partition=partition, start=start, end=end),)
    row = LedgerRow(
        pipeline=pipeline.cfg.name,
        txn=txn,
        event=LedgerEvent.COMMITTED,
        epoch=1,
        commit_seq=seq,
        coordinator="test",
        ranges=ranges,
    )
    assert pipeline.ledger().claim_commit(row)
