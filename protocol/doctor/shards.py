"""``chtxn doctor`` over a sharded ClickHouse (``clickhouse.shards``). Pure; ``coordinator.doctor`` reads
the facts of the ledger's server and of every shard as it reads one server's.

- Each check of a server chtxn stages on (its version and profile, the target table, its
  replication, windows, views, metadata columns) is made on every shard and folded: one row where
  the shards agree (``all 3 shards: ...``), else a row for each verdict, naming its shards
  (``protocol.shards.where``). A shard that does not answer is a failing ``clickhouse`` row of its own.
- The checks of the ledger, the commit point, Keeper and the quorum (``LEDGER_CHECKS``) are made once,
  on the server of ``clickhouse.url``, which holds the one commit point of every shard.
- ``shard tables``: the target is alike on every shard, compared with the first shard that has it.
  Columns and types must be (a source partition's records are parsed by the table of the shard it
  is placed on, and a ``Distributed`` table reads the shards as one table); the sorting and
  partition keys differing only warns (loading and publishing stay within one shard).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from protocol import chcodes, shards as shard_rules
from protocol.checks import Check, Verdict
from protocol.config.parse import PipelineConfig
from protocol.doctor.facts import ClickHouseFacts, Table
from protocol.doctor.rules import clickhouse_checks
from protocol.doctor.tables import target_name

#: The checks of the ledger's server alone; every other ClickHouse check is made on each shard.
LEDGER_CHECKS = frozenset({"dedup: ledger", "commit point", "keeper", "quorum"})


def sharded_checks(cfg: PipelineConfig, ledger: ClickHouseFacts, shards: Sequence[ClickHouseFacts]) -> list[Check]:
    """Every ClickHouse check of a sharded pipeline: ``ledger`` is what the server of ``clickhouse.url``
    said, ``shards`` what each of ``clickhouse.shards`` said, in shard order."""
    urls = cfg.clickhouse.shards
    found = fold(urls, [on_shard(cfg, facts) for facts in shards])
    mine = LEDGER_CHECKS
    if shard_rules.address(cfg.clickhouse.url) not in {shard_rules.address(u) for u in urls}:
        mine = mine | {"server version", "async_insert"}  # the ledger's server is none of the shards
    at = f"the ledger's server ({shard_rules.address(cfg.clickhouse.url)})"
    ledger_rows = [c for c in clickhouse_checks(cfg, ledger) if c.name in mine or ledger.error]
    found += [_named(c, at) for c in ledger_rows]
    return [*found, alike_check(cfg, shards)]


def on_shard(cfg: PipelineConfig, facts: ClickHouseFacts) -> list[Check]:
    """The checks of one shard's server: all but ``LEDGER_CHECKS``; one ``clickhouse`` row when it did not answer."""
    if facts.error:
        fix = chcodes.CREDENTIALS_FIX if facts.error_code in chcodes.CREDENTIALS else "start the server, or fix its URL"
        return [Check(name="clickhouse", status="fail", found=facts.error, fix=f"{fix} in clickhouse.shards")]
    key = [] if (found := key_check(cfg, facts)) is None else [found]
    return [c for c in clickhouse_checks(cfg, facts) if c.name not in LEDGER_CHECKS] + key


def key_check(cfg: PipelineConfig, facts: ClickHouseFacts) -> Check | None:
    """``sharding key``, placed by one: the key is an integer over the shard's target, as a Distributed
    table needs (``protocol.shards``: its value modulo the total weight picks the shard)."""
    ch = cfg.clickhouse
    if ch.placement != "sharding-key" or facts.target is None:
        return None
    key, table = ch.sharding_key, target_name(cfg)
    fix = (
        "set clickhouse.sharding_key (or the Distributed table's key) to an integer expression of the target's "
        "columns, e.g. cityHash64(customer_id)"
    )
    if facts.key_error:
        return Check(name="sharding key", status="fail", found=f"{key} over {table}: {facts.key_error}", fix=fix)
    if not re.fullmatch(r"U?Int(8|16|32|64)", facts.key_type):
        return Check(name="sharding key", status="fail", found=f"{key} over {table} is {facts.key_type}", fix=fix)
    weights = ch.shard_weights or [1] * len(ch.shards)
    found = f"{key} over {table} is {facts.key_type}: each row on the shard of its value modulo {sum(weights)}"
    return Check(name="sharding key", status="ok", found=found + f" (weights {', '.join(map(str, weights))})")


def fold(urls: Sequence[str], shards: Sequence[list[Check]]) -> list[Check]:
    """The checks of every shard (at ``urls``, in shard order) as rows: per check name, one row for each
    verdict (status, found, fix), naming the shards that gave it (one with its address: ``where``);
    ``clickhouse`` rows first."""
    names = list(dict.fromkeys(c.name for checks in shards for c in checks))
    names.sort(key=lambda name: name != "clickhouse")  # stable: the others keep their order
    rows = []
    for name in names:
        verdicts: dict[Check, list[int]] = {}
        for i, checks in enumerate(shards):
            for c in checks:
                if c.name == name:
                    verdicts.setdefault(c, []).append(i)
        for check, indexes in verdicts.items():
            if len(indexes) == 1:
                said = shard_rules.where(indexes[0], urls[indexes[0]])
            else:
                every = len(indexes) == len(shards)
                said = f"all {len(shards)} shards" if every else ", ".join(shard_rules.label(i) for i in indexes)
            rows.append(_named(check, said))
    return rows


def _named(check: Check, where: str) -> Check:
    return Check(name=check.name, status=check.status, found=f"{where}: {check.found}", fix=check.fix)


def alike_check(cfg: PipelineConfig, shards: Sequence[ClickHouseFacts]) -> Check:
    """``shard tables``: the target's columns and types, sorting key and partition key on every shard
    that has it, against the first that has it; the first difference found is named."""
    name, table = "shard tables", target_name(cfg)
    urls = cfg.clickhouse.shards
    found = [(i, facts.target) for i, facts in enumerate(shards) if facts.target is not None]
    if len(found) < 2:
        status: Verdict = "ok" if len(urls) == 1 else "warn"
        return Check(
            name=name, status=status, found=f"{table} read on {len(found)} of {len(urls)} shards: none compared"
        )
    (first, theirs), rest = found[0], found[1:]
    said = [(i, d) for i, mine in rest if (d := difference(mine, theirs, shard_rules.label(first))) is not None]
    if not said:
        unread = f" ({len(urls) - len(found)} not read)" if len(found) < len(urls) else ""
        alike = "the same columns and types, sorting key and partition key"
        return Check(name=name, status="ok", found=f"{table}: {alike} on {len(found)} shards{unread}")
    i, (status, text) = min(said, key=lambda d: d[1][0] != "fail")  # the first failing shard, else the first
    why = (
        "a source partition's records are parsed by the table of the shard it is placed on, and a Distributed "
        "table reads the shards as one table"
        if status == "fail"
        else "loading and publishing stay within each shard, but a Distributed table reads the shards as one table"
    )
    more = f" ({len(said) - 1} more shard(s) differ)" if len(said) > 1 else ""
    return Check(
        name=name,
        status=status,
        found=f"{shard_rules.where(i, urls[i])}: {text}{more}",
        fix=f"ALTER TABLE {table} on {shard_rules.label(i)} (or on the others) until the shards are alike: {why}",
    )


def difference(mine: Table, theirs: Table, them: str) -> tuple[Verdict, str] | None:
    """The first way ``mine`` differs from ``theirs`` (the table of shard ``them``), with its verdict;
    None when they are alike. Columns are compared by name: their order does not matter."""
    kinds, their_kinds = dict(zip(mine.columns, mine.types)), dict(zip(theirs.columns, theirs.types))
    for column, kind in their_kinds.items():
        if column not in kinds:
            return "fail", f"no column {column}, which {them} has"
        if kinds[column] != kind:
            return "fail", f"column {column} is {kinds[column]}, {them} has {kind}"
    for column in kinds:
        if column not in their_kinds:
            return "fail", f"column {column}, which {them} has not"
    for key, ours, other in (
        ("sorting key", mine.sorting_key, theirs.sorting_key),
        ("partition key", mine.partition_key, theirs.partition_key),
    ):
        if ours != other:
            return "warn", f"{key} {ours or 'none'}, {them} has {other or 'none'}"
    return None
