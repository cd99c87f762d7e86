"""``PipelineConfig``: one pipeline's whole config, the sections of ``pipeline.toml``
(``protocol.config.sections``) and what is derived from them (routes, tables, topic names). Pure,
frozen; ``protocol.config.parse`` parses, checks and loads it.
"""

from __future__ import annotations

import os
import socket
from typing import Literal

import msgspec

from protocol import shards
from protocol.config.sections import (
    ClickHouseSection,
    CoordinatorSection,
    KafkaSection,
    LedgerSection,
    ParticipantSection,
    PipelineSection,
    RouteSection,
    SchemaSection,
    TransactionSection,
)


class PipelineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pipeline: PipelineSection = PipelineSection()
    kafka: KafkaSection = KafkaSection()
    clickhouse: ClickHouseSection = ClickHouseSection()
    ledger: LedgerSection = LedgerSection()
    transaction: TransactionSection = TransactionSection()
    participant: ParticipantSection = ParticipantSection()
    schema: SchemaSection = SchemaSection()
    coordinator: CoordinatorSection = CoordinatorSection()
    route: tuple[RouteSection, ...] = ()  # ``[[route]]``: empty in the one-table form

    @property
    def name(self) -> str:
        return self.pipeline.name

    @property
    def routes(self) -> tuple[RouteSection, ...]:
        """Where each topic's records go: the ``[[route]]`` tables, or the one-table form
        (``pipeline.topics`` into ``clickhouse.target_table``) as one route."""
        return self.route or (RouteSection(topics=self.pipeline.topics, table=self.clickhouse.target_table),)

    def for_table(self, table: str) -> PipelineConfig:
        """This config in the one-table form for ``table`` (its routes' topics into it): for the checks
        made of one target table at a time (``chtxn doctor``)."""
        topics = tuple(dict.fromkeys(t for r in self.routes if r.table == table for t in r.topics))
        pipeline = msgspec.structs.replace(self.pipeline, topics=topics)
        clickhouse = msgspec.structs.replace(self.clickhouse, target_table=table)
        transaction = msgspec.structs.replace(self.transaction, publish_mode=self.publish_mode_of(table))
        return msgspec.structs.replace(
            self, pipeline=pipeline, clickhouse=clickhouse, transaction=transaction, route=()
        )

    def publish_mode_of(self, table: str) -> Literal["move", "insert-select"]:
        """How ``table``'s rows are published: its routes' ``publish_mode``, else ``transaction.publish_mode``."""
        return next((r.publish_mode for r in self.route if r.table == table and r.publish_mode), None) or (
            self.transaction.publish_mode
        )

    @property
    def source_topics(self) -> tuple[str, ...]:
        """Every topic name or ``re:`` pattern of the routes, each once, in order."""
        return tuple(dict.fromkeys(t for r in self.routes for t in r.topics))

    @property
    def tables(self) -> tuple[str, ...]:
        """Every target table of the routes, each once, in order."""
        return tuple(dict.fromkeys(r.table for r in self.routes))

    @property
    def shard_sections(self) -> tuple[ClickHouseSection, ...]:
        """The ``clickhouse`` section of each shard, in shard order (``clickhouse.shards``, each URL in
        ``url``): the one section itself when the ClickHouse is not sharded."""
        ch = self.clickhouse
        return tuple(msgspec.structs.replace(ch, url=url, shards=[]) for url in ch.shards) or (ch,)

    @property
    def chunk_scale(self) -> int:
        """How many times ``participant.chunk_rows`` a chunk may hold, and the START's cap is
        (``protocol.shards.chunk_scale``): the shard count placed by a sharding key, else 1."""
        return shards.chunk_scale(self.clickhouse.placement, len(self.clickhouse.shards))

    @property
    def placed_count(self) -> int:
        """The shards partitions are placed on (``protocol.shards.placed_count``), the same for the leader
        and the participants: 0 unless placed by partition over several shards."""
        return shards.placed_count(self.clickhouse.shards, self.clickhouse.placement)

    @property
    def control_topic(self) -> str:
        return self.pipeline.control_topic or f"{self.pipeline.name}.chtxn-control"

    @property
    def dead_letter_topic(self) -> str:
        return self.pipeline.dead_letter_topic or f"{self.pipeline.name}.chtxn-dlq"

    @property
    def keeper_path(self) -> str:
        return self.ledger.keeper_path or f"/chtxn/{self.clickhouse.database}"

    @property
    def coordinator_id(self) -> str:
        return self.coordinator.id or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def heartbeat_timeout_s(self) -> float:
        return self.transaction.heartbeat_interval_s * self.transaction.heartbeat_misses
