"""The shards of a sharded ClickHouse (``clickhouse.shards``) as ``chtxn status`` and ``chtxn txn show``
give them, from each shard's ``system.tables`` (``TABLES_SQL``): whether it answered, the rows of the
pipeline's target tables there and the txns whose stage tables it holds (``ShardStatus``), a txn's
stage tables on it and their rows (``ShardStage``), and the ``shards`` check. Pure: the CLI reads the
shards (``cli.shard_reads``).

Rows are ``system.tables.total_rows``: every writer's rows in a target (another pipeline's in a shared
table too), read from the parts without a scan.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from protocol import naming, shards as shard_rules
from protocol.checks import Check

#: (name, rows) of the tables ``{names}`` of database ``{db}`` and of those whose names hold ``{marker}``
#: (a pipeline's stage tables: ``naming.STAGE_MARKER`` and its name).
TABLES_SQL = (
    "SELECT name, ifNull(total_rows, 0) FROM system.tables WHERE database = {db:String} "
    "AND (name IN {names:Array(String)} OR position(name, {marker:String}) > 0)"
)


class ShardStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One shard in ``chtxn status``."""

    shard: str  # protocol.shards.label: "shard 2"
    address: str  # host:port of its server
    error: str = ""  # why it did not answer; "" when it did
    target_rows: int | None = None  # rows in the pipeline's target tables there; None when it did not answer
    staged_txns: tuple[str, ...] = ()  # the txns whose stage tables it holds, by name


class ShardStage(msgspec.Struct, frozen=True, kw_only=True):
    """One txn's stage tables on one shard, in ``chtxn txn show``."""

    shard: str
    address: str
    error: str = ""
    stage_tables: tuple[str, ...] = ()  # those of the txn's stage tables the shard holds now
    rows: int | None = None  # the rows they hold; None when the shard did not answer


def marker(pipeline: str) -> str:
    """What the name of every stage table of ``pipeline`` holds (``TABLES_SQL``'s ``{marker}``)."""
    return f"{naming.STAGE_MARKER}{pipeline}__"


#: What one shard answered: its ``TABLES_SQL`` rows (name, rows), or why it did not answer.
Answer = list[tuple[str, int]] | str


def shard_status(index: int, url: str, answer: Answer, *, tables: Sequence[str], pipeline: str) -> ShardStatus:
    """Shard ``index`` at ``url`` from its ``answer`` (``tables``: the pipeline's target tables)."""
    shard, address = shard_rules.label(index), shard_rules.address(url)
    if isinstance(answer, str):
        return ShardStatus(shard=shard, address=address, error=answer)
    rows = dict(answer)
    txns = {txn for name in rows for table in tables if (txn := naming.txn_of_stage_table(table, pipeline, name))}
    return ShardStatus(
        shard=shard,
        address=address,
        target_rows=sum(rows.get(t, 0) for t in tables),
        staged_txns=tuple(sorted(txns, key=naming.parse_txn_id)),
    )


def txn_stage(index: int, url: str, answer: Answer, *, stages: Sequence[str]) -> ShardStage:
    """Shard ``index`` at ``url``: which of a txn's stage tables ``stages`` its ``answer`` holds, and their rows."""
    shard, address = shard_rules.label(index), shard_rules.address(url)
    if isinstance(answer, str):
        return ShardStage(shard=shard, address=address, error=answer)
    rows = dict(answer)
    present = tuple(name for name in stages if name in rows)
    return ShardStage(shard=shard, address=address, stage_tables=present, rows=sum(rows[name] for name in present))


def shards_check(shards: Sequence[ShardStatus]) -> Check:
    """``shards``: every shard answered. A txn stages and publishes on every shard, so one that does
    not answer holds the pipeline up."""
    silent = [s for s in shards if s.error]
    if not silent:
        return Check(name="shards", status="ok", found=f"all {len(shards)} shards answered")
    found = "; ".join(f"{s.shard} ({s.address}): {s.error}" for s in silent)
    return Check(
        name="shards",
        status="fail",
        found=found,
        fix="start it, or fix its URL in clickhouse.shards: every txn stages and publishes on every shard, so "
        "commits and publishes wait for it (chtxn doctor checks each shard)",
    )
