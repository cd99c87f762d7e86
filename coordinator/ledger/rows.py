"""Ledger rows the leader writes, built from the state machine's ``Txn`` (times made wall-clock)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from protocol import naming, shards
from protocol.coordinator.events import Txn
from protocol.ledger import range_tables
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.messages import TopicPartition


def ledger_row(leader: Any, txn: Txn, event: LedgerEvent, *, commit_seq: int = 0, reason: str = "") -> LedgerRow:
    """The ``event`` row of ``txn``; ``leader`` gives pipeline, epoch, coordinator, routes and clock.
    Each range names the table its records were staged into (``protocol.ledger.range_tables``)."""
    shift = time.time() - leader.clock()  # monotonic -> unix seconds

    def wall(t: float) -> float:
        return t + shift if t else 0.0

    tables = txn_tables(leader.cfg.name, txn.id, txn.stage_table)
    table_of = range_tables.tables_at_commit(leader.cfg.routes, {tp.topic for tp in txn.start}, tables)
    ranges = tuple(
        PartitionRange(
            topic=tp.topic,
            partition=tp.partition,
            start=start,
            end=txn.statuses[tp].end_offset if tp in txn.statuses else start,
            rows=txn.statuses[tp].rows if tp in txn.statuses else 0,
            table=table_of[tp.topic],
        )
        for tp, start in sorted(txn.start.items())
    )
    now = time.time()
    return LedgerRow(
        pipeline=leader.cfg.name,
        txn=txn.id,
        event=event,
        epoch=leader.epoch,
        commit_seq=commit_seq,
        coordinator=leader.coordinator,
        claim_id=uuid.uuid4().hex if event is LedgerEvent.COMMITTED else "",
        target=",".join(tables),
        stage_table=txn.stage_table,
        ranges=ranges,
        total_rows=txn.rows,
        total_bytes=sum(ws.bytes for ws in txn.statuses.values()),
        dead_letters=sum(ws.dead_letters for ws in txn.statuses.values()),
        started_at=wall(txn.started_at),
        ended_at=wall(txn.ended_at),
        committed_at=now if event in (LedgerEvent.COMMITTED, LedgerEvent.PUBLISHED) else 0.0,
        published_at=now if event is LedgerEvent.PUBLISHED else 0.0,
        reason=reason,
        shards=shard_addresses(leader.cfg, txn.shards) if event is LedgerEvent.COMMITTED else (),
    )


def shard_addresses(cfg: Any, indexes: tuple[int, ...] | None = None) -> tuple[str, ...]:
    """``host:port`` of the shards ``indexes`` (0-based) of ``clickhouse.shards``, of every shard when
    None; () when the ClickHouse is not sharded."""
    urls = cfg.clickhouse.shards
    return tuple(shards.address(url) for i, url in enumerate(urls) if indexes is None or i in indexes)


def shard_indexes(cfg: Any, addresses: tuple[str, ...]) -> tuple[int, ...] | None:
    """The 0-based shards of ``clickhouse.shards`` at ``addresses`` (a COMMITTED row's ``shards``); None
    (every shard) for a row that names none: an unsharded txn, or one with no stage table."""
    if not addresses:
        return None
    return tuple(i for i, url in enumerate(cfg.clickhouse.shards) if shards.address(url) in addresses)


def published_from(committed: LedgerRow, *, epoch: int, coordinator: str) -> LedgerRow:
    """The PUBLISHED row of a COMMITTED txn rolled forward by a later leader."""
    return msgspec.structs.replace(
        committed,
        event=LedgerEvent.PUBLISHED,
        epoch=epoch,
        coordinator=coordinator,
        claim_id="",
        published_at=time.time(),
        event_time=0.0,
    )


def published_from_summary(summary: Any, *, pipeline: str, epoch: int, coordinator: str) -> LedgerRow:
    """The PUBLISHED row of a committed txn known only by its ledger summary."""
    return LedgerRow(
        pipeline=pipeline,
        txn=summary.txn,
        event=LedgerEvent.PUBLISHED,
        epoch=epoch,
        commit_seq=summary.commit_seq,
        coordinator=coordinator,
        target=summary.target,
        stage_table=summary.stage_table,
        ranges=summary.ranges,
        total_rows=summary.total_rows,
        committed_at=summary.committed_at,
        published_at=time.time(),
    )


def orphan_aborted(
    txn: str, stage_table: str, *, pipeline: str, target: str, epoch: int, coordinator: str
) -> LedgerRow:
    return LedgerRow(
        pipeline=pipeline,
        txn=txn,
        event=LedgerEvent.ABORTED,
        epoch=epoch,
        coordinator=coordinator,
        target=target,
        stage_table=stage_table,
        reason="orphan stage table dropped at take-over",
    )


def gap(
    tp: TopicPartition, head: int, low: int, *, pipeline: str, target: str, epoch: int, coordinator: str
) -> LedgerRow:
    """Offsets ``[head, low)`` of ``tp`` were gone (retention) before they were committed."""
    return LedgerRow(
        pipeline=pipeline,
        txn="",
        event=LedgerEvent.GAP,
        epoch=epoch,
        coordinator=coordinator,
        target=target,
        ranges=(PartitionRange(topic=tp.topic, partition=tp.partition, start=head, end=low),),
        reason=f"offsets {head}..{low - 1} of {tp.topic}-{tp.partition} gone before they were committed",
    )


def txn_tables(pipeline: str, txn: str, stages: str) -> list[str]:
    """The target tables ``stages`` (``txn``'s ``naming.txn_stages``) stage into, in their order."""
    return [t for name in naming.split_stages(stages) if (t := naming.table_of_stage(name, pipeline, txn))]


def targets_of(row: LedgerRow) -> list[str]:
    """The target tables of a txn's row: one, or those of a txn across ``[[route]]`` tables, which
    its ``target`` column lists separated by commas."""
    return [t for t in row.target.split(",") if t]
