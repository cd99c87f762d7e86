"""The one judgement of a target table: what ``chtxn init``, ``chtxn doctor``, the coordinator (at
start and take-over step 1) and the participant (job step 1, and each task at start) refuse, each
with the same message. Pure: ``clients.target_table`` reads the facts from the server.

Refused, in this order, each saying what to do:

1. a missing target;
2. a ``Distributed`` target (naming the local table to load instead, docs/clusters.md);
3. an engine outside the MergeTree family (``Memory``, ``Log``, ...): chtxn stages into clones of
   the target and moves or copies their partitions in;
4. metadata columns (``_topic``, ``_partition``, ``_offset``) with an input format the
   participants cannot fill them from;
5. ``move`` into a target with materialized views (they fire on INSERT only, never on a move);
6. ``insert-select`` into a target without a deduplication window, or whose views write to a
   table without one (a repeated publish would be stored twice).

A refusal names the ``chtxn doctor`` check it fails (``Refusal.check``), so the doctor shows each
one on its own row with the very message the other three print.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal
from urllib.parse import urlsplit

import msgspec

from protocol.config.parse import PipelineConfig
from protocol.framing import format_problem
from protocol.shards import key_problem
from protocol.tables.replicated_ddl import distributed_local_table, parse_engine
from protocol.tables.shape import deduplicates

#: The doctor's rows a refusal can fail.
CheckName = Literal["target table", "metadata columns", "materialized views", "dedup: target"]


class ViewTable(msgspec.Struct, frozen=True, kw_only=True):
    """A materialized view on the target and the table it writes to."""

    view: str  # db.name
    table: str  # db.name
    engine: str
    engine_full: str


class ClusterShard(msgspec.Struct, frozen=True, kw_only=True):
    """A shard's first replica in ``system.clusters``: its host, port (the native protocol's on a
    server, unless the cluster names HTTP ports), whether it is the server asked, and its weight."""

    host: str
    port: int
    local: bool = False
    weight: int = 1


class TargetFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the server says of an existing target table (``system.tables``, ``system.columns``)."""

    engine: str
    engine_full: str
    columns: tuple[str, ...] = ()  # names, in order
    views: tuple[str, ...] = ()  # materialized views reading from it, "db.view", sorted
    view_tables: tuple[ViewTable, ...] = ()  # their tables (read only when the server can say)
    #: A Distributed table's cluster, as this server's ``system.clusters`` defines it: the first replica
    #: of each shard, in shard order (empty when the server does not define it).
    cluster_shards: tuple[ClusterShard, ...] = ()


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why chtxn cannot load a target table, and what to do, as one line (``message``)."""

    check: CheckName
    message: str


def refusals(cfg: PipelineConfig, table: str, facts: TargetFacts | None) -> list[Refusal]:
    """Every reason ``table`` of ``cfg`` (``facts`` None: it does not exist) is refused, in the
    module docstring's order; [] when chtxn can load it."""
    name = f"{cfg.clickhouse.database}.{table}"
    if facts is None:
        fix = "fix the table of its [[route]]" if cfg.route else "fix clickhouse.target_table"
        return [
            Refusal(
                check="target table",
                message=f"target table {name} does not exist: create it (CREATE TABLE {name} (...) ENGINE = "
                "MergeTree ORDER BY ...; optional columns _topic LowCardinality(String), _partition Int32, "
                f"_offset Int64 let chtxn verify --deep check every offset) or {fix}",
            )
        ]
    engine = facts.engine
    if engine == "Distributed":
        return [Refusal(check="target table", message=distributed_refusal(cfg, table, facts))]
    if not engine.endswith("MergeTree"):
        return [
            Refusal(
                check="target table",
                message=f"target table {name} has engine {engine}, not of the MergeTree family, which chtxn "
                "needs: it stages into clones of the target and moves their partitions in; recreate it with "
                "a MergeTree-family engine (e.g. ENGINE = MergeTree ORDER BY ...)",
            )
        ]
    found: list[Refusal] = []
    if problem := format_problem(cfg.clickhouse.input_format, facts.columns, f"target table {name}"):
        found.append(Refusal(check="metadata columns", message=problem))
    mode = cfg.publish_mode_of(table)
    if facts.views and mode == "move":
        found.append(
            Refusal(
                check="materialized views",
                message=f"target table {name} has dependent materialized views ({', '.join(facts.views)}), "
                'which do not fire on ALTER TABLE ... MOVE PARTITION: set transaction.publish_mode = "insert-select"',
            )
        )
    if mode == "insert-select" and not deduplicates(engine, facts.engine_full):
        found.append(
            Refusal(
                check="dedup: target",
                message=f"publish_mode insert-select needs deduplication on {name} so that a repeated "
                f"publish stores rows once: ALTER TABLE {name} MODIFY SETTING non_replicated_deduplication_window "
                "= 1000",
            )
        )
    elif mode == "insert-select":
        unsafe = [v for v in facts.view_tables if "MergeTree" in v.engine and not deduplicates(v.engine, v.engine_full)]
        if unsafe:
            view, into = unsafe[0].view, unsafe[0].table
            found.append(
                Refusal(
                    check="materialized views",
                    message=f"materialized view {view} on {name} writes to {into}, which does not "
                    "deduplicate, so a repeated publish would count its rows twice there: ALTER TABLE "
                    f"{into} MODIFY SETTING non_replicated_deduplication_window = 1000",
                )
            )
    return found


def cluster_urls(cfg: PipelineConfig, shards: Sequence[ClusterShard]) -> list[str]:
    """The URL of each shard, at ``clickhouse.url``'s scheme. ``system.clusters`` gives the native
    protocol's ports, and chtxn speaks HTTP: each shard at ``clickhouse.url``'s port, unless the
    server's own row has that port (the cluster then names HTTP ports, as the embedded stack's does)."""
    url = urlsplit(cfg.clickhouse.url)
    port = url.port or (8443 if url.scheme == "https" else 8123)
    http = any(s.local and s.port == port for s in shards)
    return [f"{url.scheme}://{s.host}:{s.port if http else port}" for s in shards]


def distributed_refusal(cfg: PipelineConfig, table: str, facts: TargetFacts) -> str:
    """Why a ``Distributed`` target is refused, and the local table and the shards to name instead: the
    shards of its cluster when this server defines it, each at the scheme and port of ``clickhouse.url``
    (``system.clusters`` gives the native protocol's ports, and chtxn speaks HTTP)."""
    database = cfg.clickhouse.database
    cluster, local_db, local = distributed_local_table(facts.engine_full, database)
    local_db = database if local_db == "currentDatabase()" else local_db
    database_fix = f' and clickhouse.database = "{local_db}"' if local_db != database else ""
    args = parse_engine(facts.engine_full).args
    key = args[3].strip() if len(args) > 3 else ""
    placed = (
        f'; to place rows as it does, clickhouse.placement = "sharding-key" and clickhouse.sharding_key = "{key}"'
        if key and not key_problem(key)
        else ""
    )
    listed = f"list one server of every shard of cluster {cluster} in clickhouse.shards"
    if facts.cluster_shards:
        urls = ", ".join(f'"{u}"' for u in cluster_urls(cfg, facts.cluster_shards))
        listed = f"set clickhouse.shards = [{urls}] (cluster {cluster})"
        weights = [s.weight for s in facts.cluster_shards]
        if placed and len(set(weights)) > 1:
            placed += f" and clickhouse.shard_weights = {weights}"
    return (
        f"target table {database}.{table} is a Distributed table over {local_db}.{local} on cluster {cluster}; "
        "chtxn publishes by moving partitions between tables of one server, which a Distributed table has not: "
        f'set clickhouse.target_table = "{local}"{database_fix}, and {listed} to load them all{placed} '
        "(docs/clusters.md, A sharded cluster)"
    )
