"""A participant task's stagers on a sharded ClickHouse (``clickhouse.shards``): one ``Stager`` per
shard, each on its shard's server, and the shard a chunk goes to (``protocol.shards.shard_of``).
The dead letters of every shard go to the ledger's server (``clickhouse.url``). Unsharded, one
stager on the task's own client."""

from __future__ import annotations

from typing import Any

from clients.clickhouse import make_client
from participant.dead_letters import DeadLetterSink
from participant.stager import Stager, check_target
from participant.tally import Tally
from protocol import shards
from protocol.chunking import Chunk
from protocol.config.parse import PipelineConfig


class ShardStagers:
    """The stager of every shard, in shard order; ``client`` is the task's client of ``clickhouse.url``.
    Connecting to each shard queries it once (``clients.clickhouse.make_client``)."""

    def __init__(self, cfg: PipelineConfig, client: Any, *, dead_letters: DeadLetterSink, tally: Tally) -> None:
        self.cfg = cfg
        self.clients = [make_client(s) for s in cfg.shard_sections] if cfg.clickhouse.shards else [client]
        self._own = [c for c in self.clients if c is not client]
        self.stagers = [
            Stager(
                client=shard_client,
                section=cfg.clickhouse,
                attempts=cfg.participant.insert_retries,
                dead_letters=dead_letters,
                tally=tally,
                schema=cfg.schema,
                pipeline=cfg.name,
            )
            for shard_client in self.clients
        ]

    def of(self, chunk: Chunk) -> Stager:
        """The stager of the shard ``chunk``'s partition is placed on."""
        return self.stagers[shards.shard_of(chunk.topic, chunk.partition, len(self.stagers))]

    def check_targets(self) -> None:
        """``participant.stager.check_target`` of every target table on every shard, naming the shard."""
        sharded = bool(self.cfg.clickhouse.shards)
        for table in self.cfg.tables:
            for i, stager in enumerate(self.stagers):
                where = shards.where(i, self.cfg.shard_sections[i].url) if sharded else ""
                check_target(stager, self.cfg, table, shard=where)

    def close(self) -> None:
        """Close the shards' clients (not the task's own)."""
        for shard_client in self._own:
            shard_client.close()
