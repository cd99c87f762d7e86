"""The exactly-once oracle (docs/architecture.md §11), used by tests, the demo and ``chtxn verify --deep``.

With the metadata columns ``_topic``, ``_partition``, ``_offset`` in the target, for every
partition the target holds each offset of every committed range exactly once (less the offsets
sent to the dead-letter topic), and nothing outside those ranges. An offset an operator's reset
rewound (``chtxn reset``) is committed again by later txns: it is expected once per commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

import msgspec

from clients import kafka as kafka_clients
from coordinator.dead_letter_view import DeadLetterReader, offsets_of
from protocol import routing, topic_patterns
from protocol.errors import SetupError
from protocol.ledger import LedgerRow
from protocol.ledger_resets import is_reset
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
    replayed: int = 0  # rows committed a second time (or more) after an offset reset rewound the partition


class DeepReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    partitions: tuple[PartitionCheck, ...]
    anomalies: tuple[str, ...]  # ledger chain anomalies and per-partition failures, for people
    rows_in_target: int


def committed_ranges(commits: list[LedgerRow]) -> dict[TopicPartition, list[tuple[int, int]]]:
    """Per partition, the offset ranges committed with their rows (offset resets hold none)."""
    ranges: dict[TopicPartition, list[tuple[int, int]]] = {}
    for row in commits:
        if is_reset(row):
            continue
        for r in row.ranges:
            if r.end > r.start:
                ranges.setdefault(r.tp, []).append((r.start, r.end))
    return ranges


def own_topics(cfg: Any, commits: list[LedgerRow]) -> set[str]:
    """The topics whose rows in the target are this pipeline's to check: its source topics and every
    topic its commits name. Another pipeline's rows in a shared target are its own to check (two
    pipelines reading one topic into one table store its records twice, by design)."""
    return set(topic_patterns.names(cfg.source_topics)) | {r.topic for row in commits for r in row.ranges}


def verify_tables(
    client: Any,
    cfg: Any,
    commits: list[LedgerRow],
    dead_letters: dict[TopicPartition, set[int]] | None = None,
    chain_anomalies: list[str] | None = None,
    checked_from: dict[TopicPartition, int] | None = None,
) -> dict[str, DeepReport]:
    """``verify_deep`` of every target table of the pipeline, each against the commits of the topics
    its route sends there (``protocol.routing``); the chain's anomalies go with the first table's."""
    topics = own_topics(cfg, commits)
    routed = routing.table_map(sorted(topics), cfg.routes)
    reports = {}
    for i, table in enumerate(cfg.tables):
        mine = {t for t, to in routed.items() if to == table}
        reports[table] = verify_deep(
            client,
            cfg.clickhouse.database,
            table,
            commits,
            dead_letters,
            chain_anomalies if i == 0 else None,
            topics=mine,
            checked_from=checked_from,
        )
    return reports


def merged(reports: dict[str, DeepReport]) -> DeepReport:
    """One report of several tables' (the anomalies of each named by its table when there are several)."""
    if len(reports) == 1:
        return next(iter(reports.values()))
    return DeepReport(
        ok=all(r.ok for r in reports.values()),
        partitions=tuple(c for r in reports.values() for c in r.partitions),
        anomalies=tuple(f"{t}: {a}" for t, r in reports.items() for a in r.anomalies),
        rows_in_target=sum(r.rows_in_target for r in reports.values()),
    )


def verify_deep(
    client: Any,
    database: str,
    target: str,
    commits: list[LedgerRow],
    dead_letters: dict[TopicPartition, set[int]] | None = None,
    chain_anomalies: list[str] | None = None,
    topics: Collection[str] | None = None,
    checked_from: dict[TopicPartition, int] | None = None,
) -> DeepReport:
    """Check the target against the committed ranges (``commits``: the resolved commit chain).

    ``topics``: the pipeline's source topics; rows of other topics in a shared target belong to
    other pipelines and are not checked (None: check every row). ``checked_from``: per partition,
    the first offset to check, when the ledger's first commits have expired (the offsets of the
    checkpoint the retained chain starts from); rows below it are not checked.
    """
    floored = sorted((checked_from or {}).items())
    floors = {"floor_keys": [f"{tp.topic}/{tp.partition}" for tp, _ in floored], "floors": [o for _, o in floored]}
    floor_sql = (
        "_offset >= arrayElement({floors:Array(Int64)}, "
        "indexOf({floor_keys:Array(String)}, concat(_topic, '/', toString(_partition))))"
    )
    dead_letters = dead_letters or {}
    anomalies = list(chain_anomalies or [])
    table = f"`{database}`.`{target}`"
    stats = {
        (t, int(p)): (int(n), int(u), int(lo), int(hi))
        for t, p, n, u, lo, hi in client.query(
            f"SELECT _topic, _partition, count(), uniqExact(_offset), min(_offset), max(_offset) FROM {table} "
            f"WHERE {floor_sql} GROUP BY _topic, _partition",
            parameters=floors,
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
        hi = max((end for _, end in spans), default=0)
        replayed = _replayed(spans, len(covered), dlq)
        outside = 0
        if rows:
            inside_sql = " OR ".join(f"(_offset >= {s} AND _offset < {e})" for s, e in spans) or "0"
            outside = int(
                client.command(
                    f"SELECT count() FROM {table} WHERE _topic = {{t:String}} AND _partition = {{p:Int32}} "
                    f"AND {floor_sql} AND NOT ({inside_sql})",
                    parameters={"t": tp.topic, "p": tp.partition, **floors},
                )
            )
        if rows and dlq:  # a dead-lettered offset must not also be in the target
            outside += int(
                client.command(
                    f"SELECT count() FROM {table} WHERE _topic = {{t:String}} AND _partition = {{p:Int32}} "
                    "AND has({o:Array(Int64)}, _offset)",
                    parameters={"t": tp.topic, "p": tp.partition, "o": sorted(dlq)},
                )
            )
        expected = len(covered) - len(dlq)
        duplicates = rows - distinct - replayed
        ok = duplicates == 0 and outside == 0 and distinct == expected and rows == expected + replayed
        if not ok:
            again = f", {replayed} more read again after offset resets" if replayed else ""
            anomalies.append(
                f"{tp.topic}-{tp.partition}: committed [{lo}, {hi}) expects {expected} rows{again} "
                f"({len(dlq)} dead-lettered); target has {rows} rows, {distinct} distinct offsets, "
                f"{duplicates} duplicates, {outside} outside the committed ranges"
            )
        checks.append(
            PartitionCheck(
                topic=tp.topic,
                partition=tp.partition,
                committed_from=lo,
                committed_to=hi,
                expected_rows=expected,
                rows=rows,
                distinct_offsets=distinct,
                duplicates=duplicates,
                outside=outside,
                dead_letters=len(dlq),
                ok=ok,
                replayed=replayed,
            )
        )
    total = sum(c.rows for c in checks)
    return DeepReport(ok=not anomalies, partitions=tuple(checks), anomalies=tuple(anomalies), rows_in_target=total)


def _replayed(spans: list[tuple[int, int]], distinct: int, dead_letters: set[int]) -> int:
    """Rows expected beyond one per offset: offsets that commits after a rewinding reset cover
    again (``distinct`` offsets are covered in all); a dead-lettered one is expected in none."""
    if sum(end - start for start, end in spans) == distinct:
        return 0
    times = Counter(o for start, end in spans for o in range(start, end))
    return sum(n - 1 for o, n in times.items() if o not in dead_letters)


def dead_letter_offsets(cfg: Any, timeout_s: float = 30.0) -> dict[TopicPartition, set[int]]:
    """Source offsets in this pipeline's dead-letter topic (its letters' headers), read ``read_committed``
    to the end; empty when the topic does not exist."""
    with DeadLetterReader(cfg, timeout_s=timeout_s) as reader:
        try:
            reader.partitions()
        except kafka_clients.BrokerUnreachable:
            raise
        except SetupError:
            return {}
        return offsets_of(reader.letters())
