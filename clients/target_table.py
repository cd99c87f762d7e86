"""The one target check of ``chtxn init``, ``chtxn doctor``, the coordinator and the participant:
reads what ``protocol.tables.target_rules`` judges of a target table from the server, and refuses what it
refuses (``check_target``), with the same message wherever it runs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from clients.clickhouse import as_clickhouse_error, is_clickhouse_failure, make_client
from protocol.config.parse import PipelineConfig
from protocol.errors import SetupError
from protocol.tables import distributed
from protocol.tables.replicated_ddl import distributed_local_table
from protocol.tables.shape import columns_sql
from protocol.tables.target_rules import ClusterShard, Refusal, TargetFacts, ViewTable, refusals

#: ``engine``, ``engine_full`` and the tables that depend on table ``{t}`` of database ``{db}``.
_TARGET_SQL = (
    "SELECT engine, engine_full, dependencies_database, dependencies_table FROM system.tables "
    "WHERE database = {db:String} AND name = {t:String}"
)


#: The first replica of each shard of cluster ``{cluster}``, in shard order.
_CLUSTER_SQL = (
    "SELECT host_name, port, is_local, shard_weight FROM system.clusters "
    "WHERE cluster = {cluster:String} AND replica_num = 1 "
    "ORDER BY shard_num"
)


def learn_shards(client: Any, cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with its Distributed target tables (or the local ones on ``clickhouse.cluster``) loaded shard by
    shard (``protocol.tables.distributed``), as the server ``client`` reaches (``clickhouse.url``'s) defines
    them; ``cfg`` when there is nothing to learn."""
    ch = cfg.clickhouse
    cluster = _cluster_of(client, ch.cluster) if ch.cluster and not ch.shards else ()
    return distributed.learn_shards(cfg, {t: read_target(client, ch.database, t) for t in cfg.tables}, cluster)


def learnt(cfg: PipelineConfig, *, timeout_s: float | None = None) -> PipelineConfig:
    """``learn_shards`` on a client of ``clickhouse.url`` of its own (each request within ``timeout_s``, else
    ``clickhouse``'s timeouts): ``ClickHouseError`` when the server does not answer, ``SetupError`` when what
    it says cannot be loaded."""
    ch = cfg.clickhouse
    if timeout_s is not None:
        ch = msgspec.structs.replace(ch, connect_timeout_s=timeout_s, send_receive_timeout_s=timeout_s)
    try:
        client = make_client(ch)
        try:
            return learn_shards(client, cfg)
        finally:
            client.close()
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        raise as_clickhouse_error(exc, f"reading the target tables {', '.join(cfg.tables)}") from exc


def check_target(client: Any, cfg: PipelineConfig, table: str, *, shard: str = "") -> None:
    """Raise ``SetupError`` with the first refusal of ``table`` (``protocol.tables.target_rules``); return
    when chtxn can load it. ``client`` is a clickhouse-connect client; ClickHouse errors pass
    through unchanged (the caller retries them). ``shard`` names the shard ``client`` reaches, in the
    refusal (``protocol.shards.where``), "" for a ClickHouse that is not sharded."""
    found = target_refusals(client, cfg, table)
    if found:
        raise SetupError(f"on {shard}: {found[0].message}" if shard else found[0].message)


def target_refusals(client: Any, cfg: PipelineConfig, table: str) -> list[Refusal]:
    """Every refusal of ``table`` of ``cfg``, [] when chtxn can load it."""
    return refusals(cfg, table, read_target(client, cfg.clickhouse.database, table))


def read_target(client: Any, database: str, table: str) -> TargetFacts | None:
    """What the server says of ``database.table``; None when it does not exist."""
    rows = client.query(_TARGET_SQL, parameters={"db": database, "t": table}).result_rows
    if not rows:
        return None
    engine, engine_full, dbs, names = rows[0]
    views = tuple(sorted(f"{db}.{name}" for db, name in zip(dbs, names)))
    columns = client.query(columns_sql(), parameters={"db": database, "t": table}).result_rows
    return TargetFacts(
        engine=engine,
        engine_full=engine_full,
        columns=tuple(r[0] for r in columns),
        views=views,
        view_tables=_view_tables(client, views),
        cluster_shards=_cluster_shards(client, engine_full) if engine == "Distributed" else (),
    )


def _cluster_shards(client: Any, engine_full: str) -> tuple[ClusterShard, ...]:
    """The first replica of each shard of a Distributed table's cluster, as this server's
    ``system.clusters`` defines it; () when it does not."""
    return _cluster_of(client, distributed_local_table(engine_full, "")[0])


def _cluster_of(client: Any, cluster: str) -> tuple[ClusterShard, ...]:
    """The first replica of each shard of ``cluster`` in ``system.clusters``; () when it is not defined."""
    rows = client.query(_CLUSTER_SQL, parameters={"cluster": cluster}).result_rows
    return tuple(
        ClusterShard(host=str(host), port=int(port), local=bool(local), weight=int(weight))
        for host, port, local, weight in rows
    )


def _view_tables(client: Any, views: tuple[str, ...]) -> tuple[ViewTable, ...]:
    """The table each view writes to. Newer ClickHouse servers (26.x at least) pass a block
    deduplicated in the target on to the views, where only the view's own table can drop it again.
    Servers whose ``system.tables`` has no ``target_table`` column are not asked (none found)."""
    if not views or not int(
        client.command(
            "SELECT count() FROM system.columns WHERE database = 'system' AND table = 'tables' AND name = 'target_table'"
        )
    ):
        return ()
    rows = client.query(
        "SELECT concat(v.database, '.', v.name), concat(t.database, '.', t.name), t.engine, t.engine_full "
        "FROM system.tables AS v INNER JOIN system.tables AS t "
        "ON t.database = v.target_database AND t.name = v.target_table "
        "WHERE concat(v.database, '.', v.name) IN {views:Array(String)}",
        parameters={"views": list(views)},
    ).result_rows
    return tuple(ViewTable(view=v, table=t, engine=e, engine_full=f) for v, t, e, f in sorted(rows))
