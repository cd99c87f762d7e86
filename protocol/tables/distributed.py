"""A ``Distributed`` target: the sharded pipeline it stands for, learnt from the server at start.

A pipeline whose ``clickhouse.target_table`` (or a ``[[route]]``'s table) is a ``Distributed`` table
runs as if its config named the Distributed table's local table and listed its cluster's shards:

- each such target becomes the local table its engine names (``Distributed('cluster', 'db',
  'local'[, key])``), in ``clickhouse.database``;
- ``clickhouse.shards``, when empty, becomes one URL per shard of the cluster, as the server asked
  (``clickhouse.url``'s) defines it in ``system.clusters``: the first replica of each shard, in
  shard order, at the scheme of ``clickhouse.url`` (``cluster_urls``);
- placed by a sharding key (``clickhouse.placement = "sharding-key"``), an empty
  ``clickhouse.sharding_key`` becomes the Distributed table's, and empty ``clickhouse.shard_weights``
  the cluster's ``<weight>``s (when the shards came from the cluster too).

A local target with ``clickhouse.cluster`` naming a cluster of more than one shard (and
``clickhouse.shards`` empty) is loaded on every shard of that cluster the same way; a cluster of one
shard (replicas only) stays one server.

What the config says wins over what is learnt (an explicit ``clickhouse.shards`` is the list for a
server without ``system.clusters``). Pure: ``clients.target_table.learn_shards`` reads the facts.
The coordinator learns at each start of its loop, the participant job's driver once before its
tasks (which run with the driver's config), each command once: a cluster edited meanwhile is a
config change as any other (docs/clusters.md, "A configuration change is safe for the offsets").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from protocol.checks import Check
from protocol.config.parse import PipelineConfig, validate
from protocol.errors import ConfigError, SetupError
from protocol.shards import key_problem
from protocol.tables.replicated_ddl import distributed_local_table, parse_engine
from protocol.tables.target_rules import ClusterShard, TargetFacts, cluster_urls

#: Where to read on: every refusal ends with it.
_SEE = "(docs/clusters.md, A Distributed target)"


def learn_shards(
    cfg: PipelineConfig, targets: Mapping[str, TargetFacts | None], cluster: Sequence[ClusterShard] = ()
) -> PipelineConfig:
    """``cfg`` with its Distributed targets (``targets``: each target table's facts, None when missing)
    replaced by their local tables, on the shards of their cluster. With none, the shards of
    ``clickhouse.cluster`` (``cluster``: as the server defines it) when it has more than one and
    ``clickhouse.shards`` is empty; else ``cfg`` itself. ``SetupError`` names what cannot be learnt and
    what to set instead."""
    ch = cfg.clickhouse
    found = {t: f for t, f in targets.items() if f is not None and f.engine == "Distributed"}
    if not found:
        if ch.cluster and not ch.shards and len(cluster) > 1:  # a local target on every shard of its cluster
            return _sharded(cfg, {}, cluster_urls(cfg, cluster), ch.sharding_key, _weights(cfg, cluster))
        return _placeable(cfg)
    behind = {t: distributed_local_table(f.engine_full, ch.database) for t, f in found.items()}
    clusters = sorted({cluster for cluster, _, _ in behind.values()})
    if len(clusters) > 1:
        raise SetupError(
            f"the Distributed target tables {', '.join(sorted(found))} are on clusters {', '.join(clusters)}; "
            f"a pipeline loads one cluster: route them in one pipeline per cluster {_SEE}"
        )
    for table, (_, db, local) in behind.items():
        if db not in (ch.database, "currentDatabase()"):
            raise SetupError(
                f"target table {ch.database}.{table} is a Distributed table over {db}.{local}, and chtxn stages, "
                f'publishes and keeps its ledger in clickhouse.database = "{ch.database}": point '
                f'clickhouse.target_table at a Distributed table in {db}, with clickhouse.database = "{db}" {_SEE}'
            )
    local_of = {t: local for t, (_, _, local) in behind.items()}
    if len(set(local_of.values())) < len(local_of):
        raise SetupError(
            f"the Distributed target tables {', '.join(sorted(found))} share a local table; route their topics "
            f"to one of them {_SEE}"
        )
    first = found[next(iter(found))]
    shards = list(ch.shards) or cluster_urls(cfg, first.cluster_shards)
    if not shards:
        raise SetupError(
            f"target table {ch.database}.{next(iter(found))} is a Distributed table on cluster {clusters[0]}, which "
            f"the server at clickhouse.url does not define in system.clusters: list one server of every shard "
            f"in clickhouse.shards {_SEE}"
        )
    key = ch.sharding_key
    if ch.placement == "sharding-key" and not key:
        keys = {t: _key_of(found[t].engine_full) for t in found}
        if len(set(keys.values())) > 1 or not all(keys.values()):
            named = ", ".join(f"{t}: {k or 'none'}" for t, k in sorted(keys.items()))
            raise SetupError(
                f'clickhouse.placement = "sharding-key" and the Distributed target tables do not name one '
                f"sharding key ({named}): set clickhouse.sharding_key {_SEE}"
            )
        key = next(iter(keys.values()))
        if problem := key_problem(key):
            raise SetupError(
                f"the Distributed target's sharding key {key} cannot place rows exactly once: {problem}; set "
                f'clickhouse.sharding_key, or clickhouse.placement = "partition" {_SEE}'
            )
    return _sharded(cfg, local_of, shards, key, _weights(cfg, first.cluster_shards))


def _weights(cfg: PipelineConfig, cluster: Sequence[ClusterShard]) -> list[int]:
    """``clickhouse.shard_weights``, else the ``cluster``'s when rows are placed by key over its shards
    (none: all 1)."""
    ch = cfg.clickhouse
    if ch.shard_weights or ch.shards or ch.placement != "sharding-key":
        return list(ch.shard_weights)
    learnt = [s.weight for s in cluster]
    return learnt if len(set(learnt)) > 1 else []


def _sharded(
    cfg: PipelineConfig, local_of: Mapping[str, str], shards: list[str], key: str, weights: list[int]
) -> PipelineConfig:
    """``cfg`` loading ``local_of``'s local tables in place of their Distributed tables, on ``shards``."""
    clickhouse = msgspec.structs.replace(
        cfg.clickhouse,
        target_table=local_of.get(cfg.clickhouse.target_table, cfg.clickhouse.target_table),
        shards=shards,
        sharding_key=key,
        shard_weights=weights,
    )
    routes = tuple(msgspec.structs.replace(r, table=local_of.get(r.table, r.table)) for r in cfg.route)
    learnt = msgspec.structs.replace(cfg, clickhouse=clickhouse, route=routes)
    try:
        validate(learnt)
    except ConfigError as exc:  # what the server said: the operator fixes the cluster or the config, no retry mends it
        raise SetupError(f"the shards learnt from the server do not make a config: {exc} {_SEE}") from None
    return _placeable(learnt)


def _placeable(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` when it says where every row goes; placed by a key, the shards, the key and one weight
    per shard must be known once learnt (``protocol.config.parse`` lets them come from the target)."""
    ch = cfg.clickhouse
    if ch.placement != "sharding-key":
        return cfg
    if not ch.shards:
        raise SetupError(
            'clickhouse.placement = "sharding-key" places rows on shards, and there are none: list one server '
            "of every shard in clickhouse.shards, or point clickhouse.target_table at the Distributed table "
            f"over them {_SEE}"
        )
    if problem := key_problem(ch.sharding_key):
        raise SetupError(f"{problem} (or a Distributed target table with one) {_SEE}")
    if ch.shard_weights and len(ch.shard_weights) != len(ch.shards):
        raise SetupError(
            f"clickhouse.shard_weights = {ch.shard_weights} gives {len(ch.shard_weights)} weights for "
            f"{len(ch.shards)} shards: one weight per shard, in shard order {_SEE}"
        )
    return cfg


def learnt_check(given: PipelineConfig, learnt: PipelineConfig | None, problem: str = "") -> Check | None:
    """The doctor's ``learnt shards`` row: what was learnt of ``given``'s Distributed targets or cluster
    (``learnt``), or why nothing could be (``problem``, with ``learnt`` None); None when nothing was."""
    if problem:
        found = f"the target tables {', '.join(given.tables)} cannot be loaded shard by shard"
        return Check(name="learnt shards", status="fail", found=found, fix=problem)
    if learnt is None or learnt is given:
        return None
    ch, was = learnt.clickhouse, given.clickhouse
    renamed = [f"{a} -> {b}" for a, b in zip(given.tables, learnt.tables) if a != b]
    tables = ", ".join(renamed or learnt.tables)
    source = "clickhouse.shards" if was.shards else "its cluster" if renamed else f"cluster {was.cluster}"
    source += "" if was.shards else " in system.clusters"
    placed = (
        f"by the sharding key {ch.sharding_key}" + (f" with weights {ch.shard_weights}" if ch.shard_weights else "")
        if ch.placement == "sharding-key"
        else "by source partition"
    )
    return Check(
        name="learnt shards",
        status="ok",
        found=f"loading {tables} on {len(ch.shards)} shards from {source} ({', '.join(ch.shards)}), placed {placed}",
    )


def _key_of(engine_full: str) -> str:
    """The sharding key of a Distributed engine, "" when it has none."""
    args = parse_engine(engine_full).args
    return args[3].strip() if len(args) > 3 else ""
