"""``chtxn doctor``'s verdicts on tables: the target (engine family, replication, macros, views, the
metadata columns) and the deduplication windows of the ledger, the stage tables and the target. Pure;
``protocol.doctor.rules`` puts them in the report's order. What the coordinator, the participant and
``chtxn init`` refuse of the target (``protocol.tables.target_rules``) fails the row it concerns, with the
message they print as its fix.

A replicated table's deduplication window is a number of blocks and a number of seconds
(``replicated_deduplication_window``, ``..._seconds``; ClickHouse Cloud's SharedMergeTree keeps the
same settings); a plain MergeTree table's is ``non_replicated_deduplication_window``, 0 (none) by
default. A window a table does not set itself is the server's default (``system.merge_tree_settings``).
"""

from __future__ import annotations

from protocol.checks import Check
from protocol.config.parse import PipelineConfig
from protocol.doctor.facts import (
    ClickHouseFacts,
    Table,
    engine_args,
    macros_used,
    replicated,
    setting_in,
)
from protocol.framing import METADATA_COLUMNS
from protocol.ledger import rows as ledger
from protocol.tables.target_rules import CheckName, Refusal, TargetFacts, refusals

#: What chtxn sets on a replicated stage table (``coordinator.stage.tables.STAGE_DEDUP_WINDOW_S``).
STAGE_WINDOW_S = 7 * 86400

#: A replica this far behind (queue entries, seconds) is reported: commit step 5 counts rows on it.
LAG_QUEUE, LAG_SECONDS = 100, 300


def on_cluster(cfg: PipelineConfig, ch: ClickHouseFacts) -> bool:
    """The target is replicated (or shared), or chtxn is told the server is one of a cluster."""
    return bool(cfg.clickhouse.cluster) or (ch.target is not None and replicated(ch.target.engine))


def target_name(cfg: PipelineConfig) -> str:
    return f"{cfg.clickhouse.database}.{cfg.clickhouse.target_table}"


def refusal(cfg: PipelineConfig, ch: ClickHouseFacts, check: CheckName) -> Refusal | None:
    """The target's refusal (``protocol.tables.target_rules``) that fails the doctor's row ``check``, if any."""
    t = ch.target
    facts = None
    if t is not None:
        facts = TargetFacts(
            engine=t.engine, engine_full=t.engine_full, columns=t.columns, views=ch.views, view_tables=ch.view_tables
        )
    return next((r for r in refusals(cfg, cfg.clickhouse.target_table, facts) if r.check == check), None)


def target_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    name, target = target_name(cfg), ch.target
    refused = refusal(cfg, ch, "target table")
    if target is None:
        return Check(
            name="target table", status="fail", found=f"{name} does not exist", fix=refused.message if refused else ""
        )
    found = f"{name}: {target.engine}"
    if refused is not None:
        if target.engine == "Distributed":
            args = engine_args(target.engine_full, target.engine)
            database = (
                args[1] if len(args) > 1 and args[1] not in ("", "currentDatabase()") else cfg.clickhouse.database
            )
            local = f"{database}.{args[2]}" if len(args) > 2 else "its local table"
            found += f" over {local} (cluster {args[0] if args else '?'})"
        else:
            found += ", not of the MergeTree family"
        return Check(name="target table", status="fail", found=found, fix=refused.message)
    if target.engine.startswith("Shared"):
        return Check(name="target table", status="ok", found=f"{found} (ClickHouse Cloud, replicated)")
    return Check(name="target table", status="ok", found=found + (" (replicated)" if replicated(target.engine) else ""))


def replication_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    assert ch.target is not None
    name = target_name(cfg)
    if not replicated(ch.target.engine):
        return Check(name="replication", status="ok", found=f"{name} is not replicated: one server")
    if not ch.replicas:
        if ch.target.engine.startswith("Shared"):
            return Check(name="replication", status="ok", found="SharedMergeTree: ClickHouse Cloud replicates it")
        return Check(
            name="replication",
            status="fail",
            found=f"no row of {name} in system.replicas",
            fix="check the table on this server (SYSTEM RESTART REPLICA) and its Keeper path",
        )
    r = ch.replicas[0]
    found = f"read-only {int(r.is_readonly)}, session expired {int(r.is_session_expired)}, "
    found += f"queue {r.queue_size}, {r.absolute_delay} s behind"
    if r.is_readonly or r.is_session_expired:
        fix = (
            f"the replica takes no inserts: check <zookeeper> in the server config, then SYSTEM RESTART REPLICA {name}"
        )
        return Check(name="replication", status="fail", found=found, fix=fix)
    if r.queue_size > LAG_QUEUE or r.absolute_delay > LAG_SECONDS:
        fix = f"let it catch up (SYSTEM SYNC REPLICA {name}); chtxn counts staged rows on the replica it asks"
        return Check(name="replication", status="warn", found=found, fix=fix)
    return Check(name="replication", status="ok", found=found)


def macros_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    assert ch.target is not None
    if not on_cluster(cfg, ch):
        return Check(name="macros", status="ok", found="not needed: the target is not replicated")
    found = ", ".join(f"{k} = {v}" for k, v in sorted(ch.macros.items())) or "none defined"
    used = macros_used(ch.target.engine_full, ch.target.engine)
    missing = sorted((used | {"shard", "replica"}) - set(ch.macros))
    if not missing:
        return Check(name="macros", status="ok", found=found)
    fix = f"define {', '.join(missing)} in <macros> of the server config"
    if needed := [m for m in missing if m in used]:
        named = ", ".join(f"{{{m}}}" for m in needed)
        return Check(name="macros", status="fail", found=f"{found}; the target's engine names {named}", fix=fix)
    named = ", ".join(f"{{{m}}}" for m in missing)
    return Check(name="macros", status="warn", found=f"{found}; tables created ON CLUSTER use {named}", fix=fix)


def window(table: Table, defaults: dict[str, str]) -> tuple[int, str]:
    """Blocks a table remembers for deduplication, and how that reads (its own setting, or the default)."""

    def value(setting: str) -> tuple[int, str]:
        own = setting_in(table.engine_full, setting)
        if own is not None:
            return own, f"{setting} = {own}"
        default = int(defaults.get(setting, "0") or 0)
        return default, f"{setting} = {default} (server default)"

    if not replicated(table.engine):
        return value("non_replicated_deduplication_window")
    blocks, text = value("replicated_deduplication_window")
    return blocks, f"{text}, {value('replicated_deduplication_window_seconds')[1]}"


def ledger_window_check(ch: ClickHouseFacts) -> Check:
    if ch.ledger is None:
        return Check(
            name="dedup: ledger",
            status="warn",
            found=f"{ledger.TABLE} does not exist yet",
            fix=f"run chtxn init: it creates it with a window of {ledger.DEDUP_WINDOW} blocks",
        )
    blocks, text = window(ch.ledger, ch.merge_tree)
    found = f"{ledger.TABLE}: {ch.ledger.engine}, {text}"
    if blocks == 0:
        setting = (
            "replicated_deduplication_window" if replicated(ch.ledger.engine) else "non_replicated_deduplication_window"
        )
        fix = f"ALTER TABLE {ledger.TABLE} MODIFY SETTING {setting} = {ledger.DEDUP_WINDOW}"
        return Check(
            name="dedup: ledger", status="fail", found=found + ": a retried ledger insert is stored twice", fix=fix
        )
    return Check(name="dedup: ledger", status="ok", found=found)


def stage_window_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    assert ch.target is not None
    if not replicated(ch.target.engine):
        found = f"chtxn sets non_replicated_deduplication_window = {ch.stage_window} on each stage table"
        return Check(name="dedup: stage tables", status="ok", found=found)
    found = (
        f"chtxn creates each stage table with replicated_deduplication_window = {ch.stage_window} and "
        f"replicated_deduplication_window_seconds = {STAGE_WINDOW_S}"
    )
    return Check(name="dedup: stage tables", status="ok", found=found)


def publish_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    """``move`` into a replicated target: ClickHouse moves a partition between replicated tables in two
    Keeper steps (``StorageReplicatedMergeTree::movePartitionToTable``), not one; a server dying
    between them leaves the rows in both tables, and a retried publish stores them twice."""
    assert ch.target is not None
    mode = cfg.transaction.publish_mode
    if not replicated(ch.target.engine) or mode == "insert-select":
        return Check(name="publish", status="ok", found=f"publish_mode = {mode}")
    return Check(
        name="publish",
        status="fail",
        found="publish_mode = move into a replicated target: a replicated MOVE PARTITION is two Keeper steps, "
        "and a server dying between them leaves the rows in both tables",
        fix='set transaction.publish_mode = "insert-select" (the target\'s deduplication window stores a '
        "repeated publish once)",
    )


def target_window_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    assert ch.target is not None
    _, text = window(ch.target, ch.merge_tree)
    if cfg.transaction.publish_mode == "move":
        return Check(name="dedup: target", status="ok", found=f"{text}; not needed with publish_mode = move")
    if refused := refusal(cfg, ch, "dedup: target"):
        return Check(name="dedup: target", status="fail", found=f"{text}; insert-select needs one", fix=refused.message)
    return Check(name="dedup: target", status="ok", found=f"{text}; a repeated insert-select publish is stored once")


def views_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    mode = cfg.transaction.publish_mode
    if not ch.views:
        return Check(name="materialized views", status="ok", found="none on the target")
    found = f"{len(ch.views)} on the target ({', '.join(ch.views)}), publish_mode = {mode}"
    if refused := refusal(cfg, ch, "materialized views"):
        return Check(name="materialized views", status="fail", found=found, fix=refused.message)
    return Check(name="materialized views", status="ok", found=found + ": insert-select fires them, once")


def metadata_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    assert ch.target is not None
    if refused := refusal(cfg, ch, "metadata columns"):
        present = [c for c in METADATA_COLUMNS if c in ch.target.columns]
        found = f"{', '.join(present)} with clickhouse.input_format = {cfg.clickhouse.input_format}"
        return Check(name="metadata columns", status="fail", found=found, fix=refused.message)
    missing = [c for c in METADATA_COLUMNS if c not in ch.target.columns]
    if not missing:
        return Check(name="metadata columns", status="ok", found=f"{', '.join(METADATA_COLUMNS)}: verify --deep works")
    return Check(
        name="metadata columns",
        status="warn",
        found=f"{target_name(cfg)} has no {', '.join(missing)}: chtxn verify --deep cannot check it row by row",
        fix="add _topic LowCardinality(String), _partition Int32, _offset Int64 (rows ingested before have none)",
    )
