"""A participant task's stagers on a sharded ClickHouse (``clickhouse.shards``): one ``Stager`` per
shard, each on its shard's server, and the shard a chunk goes to (``protocol.shards.shard_of``);
with ``clickhouse.placement = "sharding-key"`` that shard's server places each row
(``protocol.shards.ShardRouter``).
The dead letters of every shard go to the ledger's server (``clickhouse.url``). Unsharded, one
stager on the task's own client."""

from __future__ import annotations

from typing import Any

from clients import target_table
from clients.clickhouse import shard_client
from participant.dead_letters import DeadLetterSink
from participant.stager import Stager
from participant.tally import Tally
from protocol import shards
from protocol.chunking import Chunk
from protocol.config.parse import PipelineConfig


class ShardStagers:
    """The stager of every shard, in shard order; ``client`` is the task's client of ``clickhouse.url``.
    Connecting to each shard queries it once (``clients.clickhouse.make_client``)."""

    def __init__(self, cfg: PipelineConfig, client: Any, *, dead_letters: DeadLetterSink, tally: Tally) -> None:
        self.cfg = cfg
        sections = enumerate(cfg.shard_sections)
        self.clients = [shard_client(i, s) for i, s in sections] if cfg.clickhouse.shards else [client]
        self._own = [c for c in self.clients if c is not client]
        ch = cfg.clickhouse
        router = (
            shards.ShardRouter(
                ch.shards, ch.sharding_key, ch.shard_weights, login=shards.url_login(ch.user, ch.password)
            )
            if ch.placement == "sharding-key"
            else None
        )
        self.stagers = [
            Stager(
                client=one,
                section=cfg.clickhouse,
                attempts=cfg.participant.insert_retries,
                dead_letters=dead_letters,
                tally=tally,
                schema=cfg.schema,
                pipeline=cfg.name,
                router=router,
            )
            for one in self.clients
        ]

    def of(self, chunk: Chunk) -> Stager:
        """The stager of the shard ``chunk``'s partition is placed on (by a sharding key: the shard whose
        server sends every shard its rows of the chunk)."""
        return self.stagers[shards.shard_of(chunk.topic, chunk.partition, len(self.stagers))]

    def check_targets(self) -> None:
        """``participant.shard_stagers.check_target`` of every target table on every shard, naming the shard."""
        sharded = bool(self.cfg.clickhouse.shards)
        for table in self.cfg.tables:
            for i, stager in enumerate(self.stagers):
                where = shards.where(i, self.cfg.shard_sections[i].url) if sharded else ""
                check_target(stager, self.cfg, table, shard=where)

    def close(self) -> None:
        """Close the shards' clients (not the task's own)."""
        for own in self._own:
            own.close()


def check_target(stager: Stager, cfg: PipelineConfig, table: str, *, shard: str = "") -> None:
    """``SetupError`` when no task could work with the target ``table``: the check the coordinator,
    ``chtxn init`` and ``chtxn doctor`` make too (``clients.target_table``), its ClickHouse
    calls retried as the stager's are. ``shard`` names the stager's shard, "" when not sharded."""
    what = f"check the target table {stager.section.database}.{table}"
    stager._retrying(what)(target_table.check_target, stager.client, cfg, table, shard=shard)
