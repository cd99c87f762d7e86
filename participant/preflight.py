"""Participant job step 1: what every task needs, checked before Spark starts a task.

``preflight(cfg)`` returns the config as learnt from ClickHouse (a ``Distributed`` target: its local
table on its cluster's shards, ``protocol.tables.distributed``) and the source partitions, or raises what no task could get past:

- ``ConfigError``: a ``[kafka.properties]`` value the Kafka client refuses;
- ``SetupError``: a source topic missing, the control topic missing or not of exactly one
  partition, the target table missing or unfit (``participant.shard_stagers.check_target``), ClickHouse
  refusing the user or the database (a non-retryable ``ClickHouseError``);
- ``OutageError``: the broker or ClickHouse unreachable for ``participant.outage_timeout_s``, each
  failed attempt one log line, retried with back-off (``participant.outage``).

The launcher (``chtxn participant``) runs it before spark-submit, and the driver again before its
SparkContext, so a job started with spark-submit by hand gets the same checks. The tasks check
again when they start (``participant.runner``): what the driver could not see (a table dropped
since) ends the job the same way, through ``participant.job_errors``.

``Watch`` is the driver's view while its tasks run: each check of the broker and of ClickHouse that
fails is one log line, and one failing for ``participant.outage_timeout_s`` raises ``OutageError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from clients import target_table
from clients.clickhouse import as_clickhouse_error, is_clickhouse_failure, make_client, shard_client
from clients.kafka import KafkaClientFactory, check_control_topic, partitions_of
from participant.outage import Outage, ride_out
from protocol import shards
from protocol.config.parse import PipelineConfig
from protocol.errors import ConfigError
from protocol.messages import TopicPartition


def preflight(
    cfg: PipelineConfig, *, stop: threading.Event | None = None, clock: Callable[[], float] = time.monotonic
) -> tuple[PipelineConfig, list[TopicPartition]] | None:
    """``cfg`` as learnt from ClickHouse (a Distributed target: its local table on its cluster's shards,
    ``clients.target_table.learn_shards``) and the source partitions, once every check passed; None when
    ``stop`` was set meanwhile."""
    admin = kafka_admin(cfg)
    timeout_s = cfg.participant.outage_timeout_s

    def kafka() -> list[TopicPartition]:
        bootstrap = cfg.kafka.bootstrap_servers
        partitions = partitions_of(admin, cfg.source_topics, bootstrap=bootstrap)
        check_control_topic(admin, cfg.control_topic, bootstrap=bootstrap)
        return partitions

    partitions = ride_out(kafka, timeout_s=timeout_s, stop=stop, clock=clock)
    if partitions is None:
        return None
    learnt = ride_out(lambda: check_clickhouse(cfg), timeout_s=timeout_s, stop=stop)
    return None if learnt is None else (learnt, partitions)


def kafka_admin(cfg: PipelineConfig) -> Any:  # an AdminClient
    """The admin client, or ``ConfigError`` when librdkafka refuses ``[kafka.properties]``."""
    try:
        return KafkaClientFactory(cfg).admin()
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
            raise ConfigError(
                f"the Kafka client refused its configuration: {error.str()}; check [kafka.properties]"
            ) from None
        raise


def check_clickhouse(given: PipelineConfig) -> PipelineConfig:
    """``given`` as learnt from ClickHouse, once every target table exists and the participants can fill it
    (``participant.shard_stagers.check_target``), on every shard."""
    from participant.shard_stagers import check_target
    from participant.stager import Stager

    cfg = target_table.learnt(given)

    for i, section in enumerate(cfg.shard_sections):  # on every shard of ``clickhouse.shards``
        client = shard_client(i, section) if cfg.clickhouse.shards else make_client(section)
        try:
            stager = Stager(client=client, section=cfg.clickhouse, dead_letters=None, attempts=1)
            for table in cfg.tables:
                check_target(stager, cfg, table, shard=shards.where(i, section.url) if cfg.clickhouse.shards else "")
        finally:
            client.close()
    return cfg


class Watch:
    """The driver's checks of the broker and of ClickHouse while its tasks run."""

    def __init__(self, cfg: PipelineConfig, admin: Any) -> None:
        self.cfg, self.admin = cfg, admin
        self.kafka = Outage(cfg.participant.outage_timeout_s)
        self.clickhouse = Outage(cfg.participant.outage_timeout_s)
        self._client: Any = None

    def partitions(self, now: float) -> list[TopicPartition] | None:
        """The source partitions, or None while the broker is away (``OutageError`` past the timeout)."""
        from participant.outage import is_outage

        try:
            found = partitions_of(self.admin, self.cfg.source_topics, bootstrap=self.cfg.kafka.bootstrap_servers)
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.kafka.failed(exc, now)
            return None
        self.kafka.ok()
        return found

    def clickhouse_answers(self, now: float) -> bool:
        """``SELECT 1`` on ClickHouse; False while it is away (``OutageError`` past the timeout)."""
        try:
            if self._client is None:
                self._client = make_client(self.cfg.clickhouse)
            self._client.command("SELECT 1")
        except Exception as exc:
            if not is_clickhouse_failure(exc):
                raise
            self.close()
            error = as_clickhouse_error(exc, f"a query to ClickHouse at {self._where()}")
            if not error.retryable:
                raise error from None
            self.clickhouse.failed(error, now)
            return False
        self.clickhouse.ok()
        return True

    def _where(self) -> str:
        from protocol import secrets

        return secrets.mask_url(self.cfg.clickhouse.url)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a client whose server is gone
                pass
