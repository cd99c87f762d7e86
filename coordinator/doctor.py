"""Gathers what ``chtxn doctor`` judges (``protocol.doctor.facts``) from the live ClickHouse server and
Kafka broker of one pipeline.

It reads only, but for two probes that leave nothing behind: the KeeperMap probe
(``coordinator.keeper_probe``), run when ``ledger.commit_point = "keeper"`` and also when the target
is replicated (so that the advice to switch to it is known to work), and one Kafka transaction that
is aborted. The probes use names of their own (``<pipeline>.chtxn-doctor``), so a running pipeline is
never fenced or disturbed. A sharded ClickHouse (``clickhouse.shards``) is read on the ledger's server
and on every shard (``for_shards``), the KeeperMap probe on the ledger's server only.

The profile's settings are the ones the server reported when the client connected
(``Client.server_settings``), before chtxn's own per-request settings (``async_insert = 0``, ...),
which would otherwise show in ``system.settings``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from confluent_kafka import KafkaError, KafkaException, TopicPartition as KafkaTP

from clients import kafka as kafka_clients
from clients.clickhouse import as_clickhouse_error, is_clickhouse_failure, make_client
from clients.target_table import read_target
from coordinator import keeper_probe
from coordinator.stage.tables import STAGE_DEDUP_WINDOW
from protocol.config.parse import PipelineConfig
from protocol.doctor.facts import (
    MERGE_TREE_READ,
    SETTINGS_READ,
    ClickHouseFacts,
    KafkaFacts,
    KeeperProbe,
    Replica,
    Setting,
    Table,
    replicated,
)
from protocol.errors import ClickHouseError, SetupError
from protocol.ledger import rows as ledger
from protocol.tables.shape import SHAPES_SQL, TABLE_ENGINE_SQL, shapes_of
from protocol.tables.target_rules import TargetFacts

#: Seconds one ClickHouse request of the doctor may take. A KeeperMap table created while Keeper is
#: down fails after about 30 s on ClickHouse 26.9 (its Keeper client's connection tries).
REQUEST_TIMEOUT_S = 90.0


def doctor_id(cfg: PipelineConfig) -> str:
    """The ``transactional.id`` and group id of the doctor's Kafka probe."""
    return f"{cfg.name}.chtxn-doctor"


def for_shards(cfg: PipelineConfig) -> list[PipelineConfig]:
    """``cfg`` once per shard of ``clickhouse.shards``, in shard order, each that shard's server alone;
    [] when the ClickHouse is not sharded."""
    if not cfg.clickhouse.shards:
        return []
    return [msgspec.structs.replace(cfg, clickhouse=section) for section in cfg.shard_sections]


def clickhouse_facts(cfg: PipelineConfig, *, keeper: bool = True) -> ClickHouseFacts:
    """What the server says; ``error`` set (and nothing else) when it cannot be read. ``keeper`` False:
    no KeeperMap probe (a shard's server, where no commit point is claimed)."""
    section = msgspec.structs.replace(
        cfg.clickhouse, send_receive_timeout_s=min(cfg.clickhouse.send_receive_timeout_s, REQUEST_TIMEOUT_S)
    )
    try:
        client = make_client(section)
    except ClickHouseError as exc:
        return ClickHouseFacts(error=str(exc), error_code=exc.code)
    try:
        return _read(cfg, client, keeper=keeper)
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        error = as_clickhouse_error(exc, "read the server's tables and settings")
        return ClickHouseFacts(error=str(error), error_code=error.code)
    finally:
        client.close()


def _read(cfg: PipelineConfig, client: Any, *, keeper: bool) -> ClickHouseFacts:
    db, name = cfg.clickhouse.database, cfg.clickhouse.target_table

    def rows(sql: str, **parameters: Any) -> list[tuple]:
        return [tuple(r) for r in client.query(sql, parameters=parameters).result_rows]

    profile = getattr(client, "server_settings", {})
    settings = {
        s: Setting(value=str(profile[s].value), readonly=bool(int(profile[s].readonly or 0)))
        for s in SETTINGS_READ
        if s in profile
    }
    found = read_target(client, db, name)
    target = None if found is None else _target(rows, found, db, name)
    replicas: tuple[Replica, ...] = ()
    if target is not None and replicated(target.engine):
        replicas = tuple(
            Replica(
                is_readonly=bool(r[0]),
                is_session_expired=bool(r[1]),
                queue_size=int(r[2]),
                absolute_delay=int(r[3]),
            )
            for r in rows(
                "SELECT is_readonly, is_session_expired, queue_size, absolute_delay FROM system.replicas "
                "WHERE database = {db:String} AND table = {t:String}",
                db=db,
                t=name,
            )
        )
    probe = cfg.ledger.commit_point == "keeper" or bool(cfg.clickhouse.cluster)
    probe = keeper and (probe or (target is not None and replicated(target.engine)))
    found_facts = ClickHouseFacts(
        version=str(rows("SELECT version()")[0][0]),
        settings=settings,
        merge_tree=dict(
            rows(
                "SELECT name, value FROM system.merge_tree_settings WHERE name IN {names:Array(String)}",
                names=list(MERGE_TREE_READ),
            )
        ),
        macros=dict(rows("SELECT macro, substitution FROM system.macros")),
        target=target,
        replicas=replicas,
        views=found.views if found else (),
        view_tables=found.view_tables if found else (),
        ledger=_table(rows, db, ledger.TABLE),
        stage_window=STAGE_DEDUP_WINDOW,
        keeper=_keeper_probe(cfg) if probe else None,
    )
    key_type, key_error = _key_type(cfg, client, target is not None)
    return msgspec.structs.replace(found_facts, key_type=key_type, key_error=key_error)


def _key_type(cfg: PipelineConfig, client: Any, target: bool) -> tuple[str, str]:
    """The type of ``clickhouse.sharding_key`` over the target and "", or "" and why the server could not
    evaluate it; ("", "") unless rows are placed by it."""
    ch = cfg.clickhouse
    if ch.placement != "sharding-key" or not ch.sharding_key or not target:
        return "", ""
    sql = f"DESCRIBE TABLE (SELECT {ch.sharding_key} AS key FROM `{ch.database}`.`{ch.target_table}`)"
    try:
        return str(client.query(sql).result_rows[0][1]), ""
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        return "", str(as_clickhouse_error(exc, f"evaluate {ch.sharding_key}"))


def _target(rows: Any, found: TargetFacts, db: str, name: str) -> Table:
    """The target as ``read_target`` found it, with its columns' types and its keys."""
    shape = shapes_of(rows(SHAPES_SQL, db=db, names=[name])).get(name)
    kinds = dict(shape.columns) if shape else {}
    return Table(
        engine=found.engine,
        engine_full=found.engine_full,
        columns=found.columns,
        types=tuple(kinds.get(c, "") for c in found.columns),
        sorting_key=shape.sorting if shape else "",
        partition_key=shape.partition if shape else "",
    )


def _keeper_probe(cfg: PipelineConfig) -> KeeperProbe:
    """The KeeperMap probe on a client of its own, whose requests give up after
    ``keeper_probe.STEP_TIMEOUT_S``: a server waiting on a dead Keeper answers the probe late."""
    section = msgspec.structs.replace(cfg.clickhouse, send_receive_timeout_s=keeper_probe.STEP_TIMEOUT_S)
    client = make_client(section)
    try:
        return keeper_probe.probe(client, cfg)
    finally:
        client.close()


def _table(rows: Any, db: str, name: str) -> Table | None:
    found = rows(TABLE_ENGINE_SQL, db=db, t=name)
    return Table(engine=found[0][0], engine_full=found[0][1]) if found else None


def kafka_facts(cfg: PipelineConfig, timeout_s: float = kafka_clients.DEFAULT_TIMEOUT_S) -> KafkaFacts:
    """What the broker says; ``error`` set (and nothing else) when no broker answered within ``timeout_s``."""
    factory = kafka_clients.KafkaClientFactory(cfg)
    admin = factory.admin()
    bootstrap = cfg.kafka.bootstrap_servers
    try:
        metadata = kafka_clients.cluster_metadata(admin, timeout_s, bootstrap)
    except kafka_clients.BrokerUnreachable as exc:
        return KafkaFacts(error=str(exc))
    topics = {t: len(m.partitions) for t, m in metadata.topics.items() if m.error is None and m.partitions}
    problem = ""
    if cfg.control_topic in topics:
        try:
            kafka_clients.check_control_topic(admin, cfg.control_topic, timeout_s, bootstrap)
        except SetupError as exc:
            problem = str(exc)
    started = time.monotonic()
    failure = _transaction(factory, cfg, timeout_s, offsets=cfg.dead_letter_topic in topics)
    return KafkaFacts(
        topics=topics,
        control_problem=problem,
        transactions=failure,
        transactions_s=round(time.monotonic() - started, 2),
    )


def _transaction(
    factory: kafka_clients.KafkaClientFactory, cfg: PipelineConfig, timeout_s: float, *, offsets: bool
) -> str:
    """What the dead-letter publisher does, aborted: ``init_transactions``, and with ``offsets`` a
    transactional offset commit on the dead-letter topic. "" when the broker allowed it, else why not."""
    producer = factory.producer(**{"transactional.id": doctor_id(cfg), "client.id": "chtxn-doctor"})
    consumer = factory.consumer(**{"group.id": doctor_id(cfg)}) if offsets else None
    try:
        producer.init_transactions(timeout_s)
        if consumer is not None:
            producer.begin_transaction()
            marker = [KafkaTP(cfg.dead_letter_topic, 0, 0)]
            producer.send_offsets_to_transaction(marker, consumer.consumer_group_metadata(), timeout_s)
            producer.abort_transaction(timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        return f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
    finally:
        if consumer is not None:
            consumer.close()
    return ""
