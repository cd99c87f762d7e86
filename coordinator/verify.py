"""The exactly-once oracle (docs/architecture.md §11), used by tests, the demo and ``chtxn verify --deep``.

With the metadata columns ``_topic``, ``_partition``, ``_offset`` in a target table, each offset of
every committed range the ledger sent to that table is there exactly as often as committed ranges
cover it (once; twice after a rewinding reset), less those its txn dead-lettered, and no row of the
pipeline's topics is anywhere else (``protocol.verify.check``, which counts in ClickHouse). The
tables checked are today's and every table the retained ledger sent rows to; what the evidence
left cannot judge is reported as expired, never as a pass or a failure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import msgspec

from clients import kafka as kafka_clients
from coordinator.dead_letters.view import DeadLetterReader, offsets_of
from protocol import shards as shard_rules, topic_patterns
from protocol.dead_letters import letters as letters_table
from protocol.errors import SetupError
from protocol.ledger import range_tables
from protocol.ledger.resets import is_reset
from protocol.ledger.rows import LedgerRow
from protocol.ledger.sql import ALL_SLOTS
from protocol.ledger.view import audit
from protocol.messages import TopicPartition
from protocol.verify import check as deep_check
from protocol.verify.report import DeepReport, Offender, PartitionCheck, amended, merged, partition_check, table_report

__all__ = [
    "DeepReport",
    "PartitionCheck",
    "check_table",
    "dead_letter_offsets",
    "merged",
    "own_topics",
    "verify_deep",
    "verify_pipeline",
]


class _Sources(msgspec.Struct, frozen=True, kw_only=True):
    """The SQL of the committed ranges, the dead letters and each partition's first offset checked
    (``floors``), with their parameters; ``floor_of`` holds the floors for people ('topic/partition')."""

    ranges: str
    letters: str
    floors: str
    parameters: dict[str, Any]
    floor_of: dict[str, int] = {}


def own_topics(cfg: Any, commits: list[LedgerRow]) -> set[str]:
    """The topics whose rows in the target are this pipeline's to check: its source topics and every
    topic its commits name. Another pipeline's rows in a shared target are its own to check (two
    pipelines reading one topic into one table store its records twice, by design)."""
    return set(topic_patterns.names(cfg.source_topics)) | {r.topic for row in commits for r in row.ranges}


def verify_pipeline(client: Any, cfg: Any, ledger: Any) -> dict[str, DeepReport]:
    """``chtxn verify --deep``: a report per table (today's tables, then every other table the retained
    ledger sent rows to), judged by the ledger's history; the chain's anomalies go with the first."""
    start, commits, checkpoints = ledger.retained_chain()
    chain = audit(commits, ledger.gaps(), ledger.lost(), start=start, checkpoints=checkpoints)  # LedgerHistory.audit
    database = cfg.clickhouse.database
    topics = own_topics(cfg, commits) | {r.topic for r in (start.ranges if start else ())}
    today = range_tables.routed_today(cfg.routes, sorted(topics))
    ranges = deep_check.ledger_ranges_sql(database)
    parameters: dict[str, Any] = {
        "pipeline": cfg.name,
        "after": start.commit_seq if start else 0,
        "through": ALL_SLOTS["through"],
        **range_tables.route_parameters(today),
    }
    if int(client.command(f"EXISTS TABLE {letters_table.qualified(database)}")):
        letters = deep_check.ledger_letters_sql(database, ranges)
    else:
        letters = deep_check.given_letters_sql([])
    sources = _Sources(
        ranges=ranges,
        letters=letters,
        floors=deep_check.ledger_floors_sql(database),
        parameters=parameters,
        floor_of={f"{r.topic}/{r.partition}": r.end for r in (start.ranges if start else ())},
    )
    sent = {t: (int(n), int(rows)) for t, n, rows in _rows(client, deep_check.range_tables_sql(ranges), parameters)}
    found = {txn: int(n) for txn, n in _rows(client, deep_check.letters_per_txn_sql(letters), parameters)}
    gone = {c.txn: c.dead_letters - found.get(c.txn, 0) for c in commits if not is_reset(c)}
    gone = {txn: n for txn, n in gone.items() if n > 0}
    skips = sum(_not_records(c) for c in commits if c.txn in gone)
    expired = _unattributed(*sent.pop("", (0, 0)))
    reports: dict[str, DeepReport] = {}
    for i, table in enumerate(dict.fromkeys([*cfg.tables, *sent])):
        missing = _missing_table(client, database, table)
        reports[table] = (
            _failed_table(table, missing, sent.get(table, (0, 0)))
            if missing
            else check_table(
                client,
                database,
                table,
                sources,
                chain if i == 0 else [],
                topics=topics,
                target=_over_shards(cfg, table),
            )
        )
    return _with_letter_bound(_with_notes(reports, expired), sum(gone.values()), skips)


def check_table(
    client: Any,
    database: str,
    table: str,
    sources: _Sources,
    chain_anomalies: Sequence[str],
    *,
    topics: Collection[str] | None,
    target: str = "",
) -> DeepReport:
    """Count every offset of ``table`` against the committed ranges of ``sources`` (``protocol.verify.check``).
    ``topics``: whose rows are checked (None: every row). ``target``: the SQL of the rows to count, when
    not ``table`` on ``client``'s server (the union of the shards, ``_over_shards``)."""
    target = target or f"`{database}`.`{table}`"
    parameters = {
        **sources.parameters,
        "table": table,
        "topics": sorted(topics or ()),
        "all_topics": int(topics is None),
        "limit": deep_check.OFFENDERS_SHOWN,
    }
    checks = [
        partition_check(row)
        for row in _rows(
            client, deep_check.partitions_sql(sources.ranges, sources.letters, sources.floors, target), parameters
        )
    ]
    offenders: tuple[Offender, ...] = ()
    if not all(c.ok for c in checks):  # a second pass only to name what differs
        offenders = _offenders(
            client, deep_check.offenders_sql(sources.ranges, sources.letters, sources.floors, target), parameters
        )
    floors = sources.floor_of
    expired = [
        f"{c.topic}-{c.partition}: {c.expired} rows below offset {floors.get(f'{c.topic}/{c.partition}', 0)}, "
        "whose commits expired from the ledger (coordinator.ledger_retention_days): not checked"
        for c in checks
        if c.expired
    ]
    expired += [
        f"{c.topic}-{c.partition}: {c.unsure} committed rows missing in txns whose dead letters expired from "
        "chtxn_dead_letters: maybe letters, maybe lost"
        for c in checks
        if c.unsure
    ]
    return table_report(checks, chain=chain_anomalies, expired=expired, offenders=offenders)


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
    """``check_table`` of ``target`` against ``commits`` (the resolved commit chain) given in Python, for
    tests and the demo: the ranges that name ``target``, and those naming no table whose topic is in
    ``topics``. ``dead_letters``: offsets expected in no table. ``topics``: the pipeline's topics in the
    target (None: every row). ``checked_from``: per partition, the first offset to check."""
    mine = _joined(
        (r.topic, r.partition, r.start, r.end, r.rows)
        for row in commits
        if not is_reset(row)
        for r in row.ranges
        if r.end > r.start and (r.table == target or (not r.table and (topics is None or r.topic in topics)))
    )
    letters = sorted((tp.topic, tp.partition, o) for tp, offsets in (dead_letters or {}).items() for o in offsets)
    floors = sorted((tp.topic, tp.partition, o) for tp, o in (checked_from or {}).items())
    sources = _Sources(
        ranges=deep_check.given_ranges_sql(  # a name each: a range's skips are counted per range
            [(f"r{i}", t, p, lo, hi, n, target) for i, (t, p, lo, hi, n) in enumerate(mine)]
        ),
        letters=deep_check.given_letters_sql(letters),
        floors=deep_check.given_floors_sql(floors),
        parameters={},
        floor_of={f"{t}/{p}": o for t, p, o in floors},
    )
    return check_table(client, database, target, sources, chain_anomalies or [], topics=topics)


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


# ---- plumbing ---------------------------------------------------------------------------------


def _over_shards(cfg: Any, table: str) -> str:
    """The rows of ``table`` on every shard of ``clickhouse.shards``, counted on the ledger's server;
    "" when the ClickHouse is not sharded."""
    ch = cfg.clickhouse
    if not ch.shards:
        return ""
    login = shard_rules.url_login(ch.user, ch.password)
    return deep_check.sharded_target_sql(ch.database, table, ch.shards, here=ch.url, login=login)


def _rows(client: Any, sql: str, parameters: dict[str, Any]) -> list[tuple]:
    return list(client.query(sql, parameters=parameters).result_rows)


def _joined(ranges: Iterable[tuple[str, int, int, int, int]]) -> list[tuple[str, int, int, int, int]]:
    """(topic, partition, start, end, rows) with ranges that abut joined into one: they cover the same
    offsets the same number of times, and the SQL that carries them stays short."""
    joined: list[tuple[str, int, int, int, int]] = []
    for t, p, lo, hi, n in sorted(ranges):
        if joined and joined[-1][:2] == (t, p) and joined[-1][3] == lo:
            joined[-1] = (t, p, joined[-1][2], hi, joined[-1][4] + n)
        else:
            joined.append((t, p, lo, hi, n))
    return joined


def _offenders(client: Any, sql: str, parameters: dict[str, Any]) -> tuple[Offender, ...]:
    return tuple(
        Offender(topic=t, partition=int(p), offset=int(o), expected=int(e), rows=int(n), kind=k)
        for t, p, o, e, n, k in _rows(client, sql, parameters)
    )


def _missing_table(client: Any, database: str, table: str) -> str:
    """Why ``table`` cannot be checked ("" when it can): it does not exist, or lacks the metadata columns."""
    names = {
        r[0]
        for r in _rows(
            client,
            "SELECT name FROM system.columns WHERE database = {d:String} AND table = {t:String}",
            {"d": database, "t": table},
        )
    }
    if not names:
        return f"table {database}.{table} does not exist"
    lacking = [c for c in ("_topic", "_partition", "_offset") if c not in names]
    return f"table {database}.{table} has no {', '.join(lacking)}" if lacking else ""


def _failed_table(table: str, why: str, sent: tuple[int, int]) -> DeepReport:
    ranges, rows = sent
    return table_report([], chain=[f"the ledger committed {ranges} ranges ({rows} rows) to {table}, but {why}"])


def _unattributed(ranges: int, rows: int) -> list[str]:
    if not ranges:
        return []
    return [
        f"{ranges} committed ranges ({rows} rows) written by an earlier chtxn name no table that today's routes "
        "can place: not checked"
    ]


def _with_notes(reports: dict[str, DeepReport], notes: list[str]) -> dict[str, DeepReport]:
    """Pipeline-wide expired evidence, carried by the first table's report."""
    if not notes or not reports:
        return reports
    first = next(iter(reports))
    return {**reports, first: amended(reports[first], expired=notes)}


def _not_records(commit: LedgerRow) -> int:
    """Offsets of ``commit``'s ranges that hold no record (transaction markers, aborted records): its
    offsets, less its rows, less its dead letters."""
    return max(0, sum(r.end - r.start - r.rows for r in commit.ranges) - commit.dead_letters)


def _with_letter_bound(reports: dict[str, DeepReport], letters_gone: int, skips: int = 0) -> dict[str, DeepReport]:
    """More rows missing where letters expired than letters are gone, and offsets of their txns that
    hold no record (``skips``): some of them are lost."""
    unsure = sum(c.unsure for r in reports.values() for c in r.partitions)
    if unsure <= letters_gone + skips:
        return reports
    first = next(iter(reports))
    why = f"{unsure} committed rows are missing where dead letters expired, but only {letters_gone} letters are gone"
    why += f" (and {skips} offsets of those txns hold no record)" if skips else ""
    return {**reports, first: amended(reports[first], anomalies=[why])}
