"""Ledger rows the tests write by hand: partition ranges, COMMITTED rows, a txn's commit point
claimed as the leader claims it, and a committed txn's dead letters published."""

from __future__ import annotations

from coordinator.dead_letters.publisher import DeadLetterPublisher, ensure_table
from coordinator.ledger.store import LedgerStore
from participant.bad_records import Letter
from participant.dead_letters import DeadLetterSink
from protocol.chunking import ChunkBuilder
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
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


def publish_letters(pipeline: Pipeline, letters: list[Letter]) -> None:
    """Store ``letters`` as dead letters of txn ``e1_t1`` (one chunk of their records), commit that txn
    in slot 1 and publish them to the dead-letter topic, as a leader does."""
    cfg = pipeline.cfg
    ensure_table(pipeline.client(), cfg.clickhouse.database)
    builder = ChunkBuilder(
        pipeline=cfg.name,
        txn="e1_t1",
        topic=pipeline.topic,
        partition=0,
        start_offset=0,
        chunk_rows=100,
        chunk_bytes=1 << 20,
    )
    builder.add([letter.record for letter in letters])
    DeadLetterSink(pipeline.client(), database=cfg.clickhouse.database, pipeline=cfg.name).write(
        builder.flush(), letters
    )
    commit(pipeline, "e1_t1", 1, 0, 10)
    publisher = DeadLetterPublisher(cfg, pipeline.client(), pipeline.ledger(), epoch=1)
    try:
        assert publisher.publish("e1_t1", 1) == len(letters)
    finally:
        publisher.close()
