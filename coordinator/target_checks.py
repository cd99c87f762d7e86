"""The checks a target table must pass before a pipeline may publish into it (take-over step 1).

Refused, with what to do: a missing target or one outside the MergeTree family (a ``Distributed``
target is refused naming the local table to use instead, docs/clusters.md); ``move`` into a
target with materialized views (they fire on INSERT only, never on a partition move); and
``insert-select`` into a target, or a view's table, that would store a repeated publish twice
(no deduplication window).
"""

from __future__ import annotations

from typing import Any, Literal

from protocol.errors import SetupError
from protocol.replicated_ddl import distributed_local_table
from protocol.table_shape import TABLE_ENGINE_SQL, deduplicates


def check_target(client: Any, *, database: str, target: str, publish_mode: Literal["move", "insert-select"]) -> None:
    """Refuse what cannot work: a missing target, ``move`` into a table with views, and
    ``insert-select`` into a target (or a view's table) that would store a repeated publish twice.
    ``client`` is a clickhouse-connect client."""
    rows = client.query(TABLE_ENGINE_SQL, parameters={"db": database, "t": target}).result_rows
    if not rows:
        raise SetupError(
            f"target table {database}.{target} does not exist: create it (with optional "
            "_topic String, _partition Int32, _offset Int64 columns for exactly-once checks), then restart"
        )
    engine, engine_full = rows[0]
    if engine == "Distributed":
        raise SetupError(distributed_refusal(database, target, engine_full))
    if "MergeTree" not in engine:
        raise SetupError(f"target table {database}.{target} has engine {engine}; chtxn needs a MergeTree-family table")
    views = dependent_views(client, database=database, target=target)
    if views and publish_mode == "move":
        raise SetupError(
            f"target table {database}.{target} has dependent materialized views ({', '.join(views)}), "
            'which do not fire on ALTER TABLE ... MOVE PARTITION: set transaction.publish_mode = "insert-select"'
        )
    if publish_mode == "insert-select" and not deduplicates(engine, engine_full):
        raise SetupError(
            f"publish_mode insert-select needs deduplication on {database}.{target} so that a repeated "
            f"publish stores rows once: ALTER TABLE {database}.{target} MODIFY SETTING "
            "non_replicated_deduplication_window = 1000"
        )
    unsafe = _view_tables_without_dedup(client, views) if publish_mode == "insert-select" else []
    if unsafe:
        view, table = unsafe[0]
        raise SetupError(
            f"materialized view {view} on {database}.{target} writes to {table}, which does not "
            "deduplicate, so a repeated publish would count its rows twice there: ALTER TABLE "
            f"{table} MODIFY SETTING non_replicated_deduplication_window = 1000"
        )


def distributed_refusal(database: str, target: str, engine_full: str) -> str:
    """Why a ``Distributed`` target is refused, and the local table to name instead."""
    cluster, local_db, local = distributed_local_table(engine_full, database)
    database_fix = f' and clickhouse.database = "{local_db}"' if local_db != database else ""
    return (
        f"target table {database}.{target} is a Distributed table over {local_db}.{local} on cluster {cluster}; "
        "chtxn publishes by moving partitions between tables of one server, which a Distributed table has not: "
        f'set clickhouse.target_table = "{local}"{database_fix} to load the local table of the shard '
        "clickhouse.url reaches (loading every shard is not supported yet: docs/clusters.md, A Distributed target)"
    )


def dependent_views(client: Any, *, database: str, target: str) -> list[str]:
    """Materialized views that read from the target (``db.view``), which fire on INSERT only."""
    rows = client.query(
        "SELECT dependencies_database, dependencies_table FROM system.tables "
        "WHERE database = {db:String} AND name = {t:String}",
        parameters={"db": database, "t": target},
    ).result_rows
    return sorted(f"{db}.{name}" for dbs, names in rows for db, name in zip(dbs, names))


def _view_tables_without_dedup(client: Any, views: list[str]) -> list[tuple[str, str]]:
    """(view, its table) for each view whose table would store a repeated publish twice.

    Newer ClickHouse servers (26.x at least) pass a block deduplicated in the target on to the
    views, where only the view's own table can drop it again. Servers whose ``system.tables``
    has no ``target_table`` column are not checked.
    """
    if not views or not int(
        client.command(
            "SELECT count() FROM system.columns WHERE database = 'system' AND table = 'tables' AND name = 'target_table'"
        )
    ):
        return []
    rows = client.query(
        "SELECT concat(v.database, '.', v.name), concat(t.database, '.', t.name), t.engine, t.engine_full "
        "FROM system.tables AS v INNER JOIN system.tables AS t "
        "ON t.database = v.target_database AND t.name = v.target_table "
        "WHERE concat(v.database, '.', v.name) IN {views:Array(String)}",
        parameters={"views": views},
    ).result_rows
    return [
        (view, table)
        for view, table, engine, full in sorted(rows)
        if "MergeTree" in engine and not deduplicates(engine, full)
    ]
