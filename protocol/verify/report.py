"""The report of ``chtxn verify --deep`` (``coordinator.verify``): per partition, per table and over
all tables, with its outcome (``protocol.verify.check``: OK, FAILED, or EXPIRED when nothing wrong
was found but some evidence is gone) and the reason in words. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from protocol.verify import check as deep_check


class Offender(msgspec.Struct, frozen=True, kw_only=True):
    """An offset whose rows in the table differ from what was committed there."""

    topic: str
    partition: int
    offset: int
    expected: int  # rows committed at it (0: none, or dead-lettered)
    rows: int
    kind: str  # protocol.verify.check: duplicate, outside, missing


class PartitionCheck(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    committed_from: int
    committed_to: int  # next offset to read after the last commit
    expected_rows: int  # distinct offsets expected (rows read again after a reset are ``replayed``)
    rows: int
    distinct_offsets: int
    duplicates: int  # rows beyond what was committed at offsets committed to the table
    outside: int  # rows where nothing was committed to the table, or at a dead-lettered offset
    dead_letters: int
    ok: bool
    replayed: int = 0  # rows committed a second time (or more) after an offset reset rewound the partition
    missing: int = 0  # rows committed to the table and not in it
    unsure: int = 0  # rows missing where a dead letter's record has expired: maybe letters, maybe lost
    expired: int = 0  # rows below the retained ledger's first commit: not checked
    skipped: int = 0  # offsets with no row that hold no record, as their ranges' counts allow (markers)


class DeepReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool  # no failure found (``outcome`` is OK or EXPIRED)
    partitions: tuple[PartitionCheck, ...]
    anomalies: tuple[str, ...]  # ledger chain anomalies and per-partition failures, for people
    rows_in_target: int
    outcome: str = deep_check.PASSED  # OK, FAILED or EXPIRED (protocol.verify.check)
    reason: str = ""  # the outcome in a sentence
    expired: tuple[str, ...] = ()  # evidence that has expired, for people
    offenders: tuple[Offender, ...] = ()  # the first offsets that differ (deep_check.OFFENDERS_SHOWN)


def merged(reports: dict[str, DeepReport]) -> DeepReport:
    """One report of several tables' (the anomalies of each named by its table when there are several)."""
    if len(reports) == 1:
        return next(iter(reports.values()))
    failed = [t for t, r in reports.items() if r.outcome == deep_check.FAILED]
    expired = [t for t, r in reports.items() if r.outcome == deep_check.EXPIRED]
    return DeepReport(
        ok=all(r.ok for r in reports.values()),
        partitions=tuple(c for r in reports.values() for c in r.partitions),
        anomalies=tuple(f"{t}: {a}" for t, r in reports.items() for a in r.anomalies),
        rows_in_target=sum(r.rows_in_target for r in reports.values()),
        outcome=deep_check.outcome(bool(failed), bool(expired)),
        reason="; ".join(f"{t}: {reports[t].reason}" for t in failed or expired) or "every table as committed",
        expired=tuple(f"{t}: {x}" for t, r in reports.items() for x in r.expired),
        offenders=tuple(o for r in reports.values() for o in r.offenders),
    )


def partition_check(row: Sequence[Any]) -> PartitionCheck:
    t, p, lo, hi, expected, rows, distinct, dup, outside, missing, unsure, replayed, dlq, expired, bad, skip = row
    return PartitionCheck(
        topic=t,
        partition=int(p),
        committed_from=int(lo),
        committed_to=int(hi),
        expected_rows=int(expected),
        rows=int(rows),
        distinct_offsets=int(distinct),
        duplicates=int(dup),
        outside=int(outside),
        dead_letters=int(dlq),
        ok=int(bad) == 0,
        replayed=int(replayed),
        missing=int(missing),
        unsure=int(unsure),
        expired=int(expired),
        skipped=int(skip),
    )


def _anomaly(c: PartitionCheck) -> str:
    again = f", {c.replayed} more read again after offset resets" if c.replayed else ""
    skipped = f", {c.skipped} offsets holding no record" if c.skipped else ""
    return (
        f"{c.topic}-{c.partition}: committed [{c.committed_from}, {c.committed_to}) expects {c.expected_rows} rows"
        f"{again} ({c.dead_letters} dead-lettered{skipped}); target has {c.rows} rows, {c.distinct_offsets} distinct offsets, "
        f"{c.duplicates} duplicates, {c.missing} missing, {c.outside} outside the committed ranges"
    )


def _offenders_text(offenders: Sequence[Offender]) -> str:
    return ", ".join(
        f"{o.topic}-{o.partition}@{o.offset} {o.kind} ({o.rows} rows, {o.expected} committed)" for o in offenders
    )


def table_report(
    checks: Sequence[PartitionCheck],
    *,
    chain: Sequence[str] = (),
    expired: Sequence[str] = (),
    offenders: Sequence[Offender] = (),
) -> DeepReport:
    """The report of one table from its partitions' checks, the ledger chain's anomalies (``chain``),
    the evidence that has expired and the first offsets that differ."""
    anomalies = [*chain, *(_anomaly(c) for c in checks if not c.ok)]
    anomalies += [f"first offsets that differ: {_offenders_text(offenders)}"] if offenders else []
    return _report(checks, anomalies, expired, offenders)


def amended(report: DeepReport, *, anomalies: Sequence[str] = (), expired: Sequence[str] = ()) -> DeepReport:
    """``report`` with more anomalies or expired evidence, and its outcome and reason judged again."""
    return _report(report.partitions, [*report.anomalies, *anomalies], [*report.expired, *expired], report.offenders)


def _report(
    checks: Sequence[PartitionCheck],
    anomalies: Sequence[str],
    expired: Sequence[str],
    offenders: Sequence[Offender] = (),
) -> DeepReport:
    outcome = deep_check.outcome(bool(anomalies), bool(expired))
    replayed = sum(c.replayed for c in checks)
    again = f" ({replayed} of them read again after offset resets, as the resets asked)" if replayed else ""
    reason = {
        deep_check.FAILED: f"{len(anomalies)} anomalies",
        deep_check.EXPIRED: f"nothing wrong in what could be checked; evidence expired: {'; '.join(expired)}",
        deep_check.PASSED: f"every committed offset as often as committed, nothing else{again}",
    }[outcome]
    return DeepReport(
        ok=not anomalies,
        partitions=tuple(checks),
        anomalies=tuple(anomalies),
        rows_in_target=sum(c.rows for c in checks),
        outcome=outcome,
        reason=reason,
        expired=tuple(expired),
        offenders=tuple(offenders),
    )
