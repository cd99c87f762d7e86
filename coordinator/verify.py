"""The exactly-once oracle of DESIGN.md section 8, used by tests, the demo and ``chtxn verify --deep``.

With the metadata columns ``_topic``, ``_partition``, ``_offset`` in the target, for every
partition the target holds each offset of every committed range exactly once (less the offsets
sent to the dead-letter topic), and nothing outside those ranges.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import msgspec
from confluent_kafka import Consumer, TopicPartition as KafkaTP

from clients import kafka as kafka_clients

from protocol.ledger import LedgerRow
from protocol.messages import TopicPartition


class PartitionCheck(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    committed_from: int
    committed_to: int  # next offset to read after the last commit
    expected_rows: int
    rows: int
    distinct_offsets: int
    duplicates: int
    outside: int  # rows outside the committed ranges, or at a dead-lettered offset
    dead_letters: int
    ok: bool


class DeepReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    partitions: tuple[PartitionCheck, ...]
    anomalies: tuple[str, ...]  # ledger chain anomalies and per-partition failures, for people
    rows_in_target: int


def committed_ranges(commits: list[LedgerRow]) -> dict[TopicPartition, list[tuple[int, int]]]:
    ranges: dict[TopicPartition, list[tuple[int, int]]] = {}
    for row in commits:
        for r in row.ranges:
            if r.end > r.start:
                ranges.setdefault(r.tp, []).append((r.start, r.end))
    return ranges


def verify_deep(client: Any, database: str, target: str, commits: list[LedgerRow],
                dead_letters: dict[TopicPartition, set[int]] | None = None,
                chain_anomalies: list[str] | None = None, topics: Collection[str] | None = None) -> DeepReport:
    """Check the target against the committed ranges (``commits``: the resolved commit chain).

    ``topics``: the pipeline's source topics; rows of other topics in a shared target belong to
    other pipelines and are not checked (None: check every row).
    """
    dead_letters = dead_letters or {}
    anomalies = list(chain_anomalies or [])
    table = f"`{database}`.`{target}`"
    stats = {
        (t, int(p)): (int(n), int(u), int(lo), int(hi))
        for t, p, n, u, lo, hi in client.query(
            f"SELECT _topic, _partition, count(), uniqExact(_offset), min(_offset), max(_offset) FROM {table} "
            "GROUP BY _topic, _partition"
        ).result_rows
    }
    ranges = committed_ranges(commits)
    if topics is not None:
        stats = {k: v for k, v in stats.items() if k[0] in topics}
        ranges = {tp: r for tp, r in ranges.items() if tp.topic in topics}
    checks = []
    for tp in sorted(set(ranges) | {TopicPartition(topic=t, partition=p) for t, p in stats}):
        spans = sorted(ranges.get(tp, []))
        covered: set[int] = set()
        for start, end in spans:
            covered.update(range(start, end))
        dlq = {o for o in dead_letters.get(tp, set()) if o in covered}
        rows, distinct, _, _ = stats.get((tp.topic, tp.partition), (0, 0, 0, 0))
        lo = spans[0][0] if spans else 0
        hi = spans[-1][1] if spans else 0
        outside = 0
        if rows:
            inside_sql = " OR ".join(f"(_offset >= {s} AND _offset < {e})" for s, e in spans) or "0"
            outside = int(client.command(
                f"SELECT count() FROM {table} WHERE _topic = {{t:String}} AND _partition = {{p:Int32}} AND NOT ({inside_sql})",
                parameters={"t": tp.topic, "p": tp.partition},
            ))
        if rows and dlq:  # a dead-lettered offset must not also be in the target
            outside += int(client.command(
                f"SELECT count() FROM {table} WHERE _topic = {{t:String}} AND _partition = {{p:Int32}} "
                "AND has({o:Array(Int64)}, _offset)",
                parameters={"t": tp.topic, "p": tp.partition, "o": sorted(dlq)},
            ))
        expected = len(covered) - len(dlq)
        duplicates = rows - distinct
        ok = duplicates == 0 and outside == 0 and distinct == expected and rows == expected
        if not ok:
            anomalies.append(
                f"{tp.topic}-{tp.partition}: committed [{lo}, {hi}) expects {expected} rows "
                f"({len(dlq)} dead-lettered); target has {rows} rows, {distinct} distinct offsets, "
                f"{duplicates} duplicates, {outside} outside the committed ranges"
            )
        checks.append(PartitionCheck(
            topic=tp.topic, partition=tp.partition, committed_from=lo, committed_to=hi, expected_rows=expected,
            rows=rows, distinct_offsets=distinct, duplicates=duplicates, outside=outside, dead_letters=len(dlq), ok=ok,
        ))
    total = sum(c.rows for c in checks)
    return DeepReport(ok=not anomalies, partitions=tuple(checks), anomalies=tuple(anomalies), rows_in_target=total)


def dead_letter_offsets(cfg: Any, timeout_s: float = 30.0) -> dict[TopicPartition, set[int]]:
    """Source offsets this pipeline sent to its dead-letter topic (read from its headers, to the end)."""
    consumer = Consumer(kafka_clients.consumer_conf(cfg, **{"group.id": f"{cfg.name}.chtxn-verify", "auto.offset.reset": "earliest"}))
    try:
        metadata = kafka_clients.cluster_metadata(consumer, bootstrap=cfg.kafka.bootstrap_servers).topics.get(cfg.dead_letter_topic)
        if metadata is None:
            return {}
        ends = {}
        for p in metadata.partitions:
            low, high = consumer.get_watermark_offsets(KafkaTP(cfg.dead_letter_topic, p), timeout=timeout_s)
            if high > low:
                ends[p] = high
        consumer.assign([KafkaTP(cfg.dead_letter_topic, p, 0) for p in ends])
        found: dict[TopicPartition, set[int]] = {}
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for record in consumer.consume(1000, 0.5):
                if record.error() is not None:
                    continue
                if record.offset() + 1 >= ends.get(record.partition(), 0):
                    ends.pop(record.partition(), None)
                headers = {k: v.decode() for k, v in (record.headers() or [])}
                if headers.get("chtxn.pipeline") != cfg.name or "chtxn.offset" not in headers:
                    continue
                tp = TopicPartition(topic=headers["chtxn.topic"], partition=int(headers["chtxn.partition"]))
                found.setdefault(tp, set()).add(int(headers["chtxn.offset"]))
        return found
    finally:
        consumer.close()
