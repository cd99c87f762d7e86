"""A pipeline of several tables (``[[route]]``) for tests: a topic and a table per route, the oracle per table."""

from __future__ import annotations

import json
from pathlib import Path

import clickhouse_connect
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from clients import kafka as kafka_clients
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from coordinator.verify import DeepReport, verify_deep
from protocol import routing
from protocol.config.parse import parse_config
from protocol.messages import TopicPartition
from tests.pipelines import TARGET_DDL, Pipeline


def make_routed_pipeline(
    stack,
    tmp_path: Path,
    name: str,
    *,
    tables: int = 3,
    partitions: int = 2,
    pattern_table: str = "",
    insert_select: tuple[str, ...] = (),
    extra: str = "",
    idle_interval_s: float | None = None,
) -> Pipeline:
    """A fresh pipeline routing topic ``<name>_t<i>`` into table ``t<i>`` of its own database; with
    ``pattern_table``, also every topic matching ``<name>_late_.*`` into that table (none exists yet);
    the tables in ``insert_select`` are published by insert-select (their routes say so, and they
    deduplicate), the others by move; ``extra``: more TOML sections (e.g. ``[schema]``); ``idle_interval_s``: ``transaction.idle_interval_s``
    (None: its default)."""

    def mode(table: str) -> str:
        return 'publish_mode = "insert-select"\n' if table in insert_select else ""

    routes = "".join(f'\n[[route]]\ntopics = ["{name}_t{i}"]\ntable = "t{i}"\n{mode(f"t{i}")}' for i in range(tables))
    if pattern_table:
        routes += f'\n[[route]]\ntopics = ["re:{name}_late_.*"]\ntable = "{pattern_table}"\n'
    text = (
        f'[pipeline]\nname = "{name}"\n\n[kafka]\nbootstrap_servers = "{stack.kafka_bootstrap}"\n\n'
        f'[clickhouse]\nurl = "{stack.clickhouse_url}"\ndatabase = "{name}"\n\n'
        "[transaction]\ninterval_s = 0.5\nwrite_status_timeout_s = 10.0\nheartbeat_interval_s = 0.2\n"
        "heartbeat_misses = 10\n"
        + ("" if idle_interval_s is None else f"idle_interval_s = {idle_interval_s}\n")
        + extra
        + routes
    )
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    cfg = parse_config(text, source=str(path))
    topics = [f"{name}_t{i}" for i in range(tables)]
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    kafka_clients.create_topics(
        admin, {**dict.fromkeys(topics, partitions), cfg.control_topic: 1, cfg.dead_letter_topic: 1}
    )
    host, port = stack.clickhouse_url.removeprefix("http://").rstrip("/").split(":")
    client = clickhouse_connect.get_client(host=host, port=int(port))
    client.command(f"CREATE DATABASE IF NOT EXISTS `{name}`")
    for table in cfg.tables:
        dedup = "\nSETTINGS non_replicated_deduplication_window = 1000" if table in insert_select else ""
        client.command(TARGET_DDL.rstrip().format(db=f"`{name}`", table=f"`{table}`") + dedup)
    LedgerStore.of(cfg, client).ensure_tables()
    tps = [TopicPartition(topic=t, partition=p) for t in topics for p in range(partitions)]
    return Pipeline(cfg, path, tps)


def produce_to(pipeline: Pipeline, topic: str, count: int, *, start_id: int = 0) -> int:
    """``count`` JSON events on ``topic``, spread over its partitions by key."""
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "linger.ms": 5})
    parts = sorted(tp.partition for tp in pipeline.partitions if tp.topic == topic)
    for i in range(start_id, start_id + count):
        value = json.dumps({"id": i, "user": f"u{i % 97}", "amount": i * 0.5}).encode()
        producer.produce(topic, value=value, key=str(i).encode(), partition=parts[i % len(parts)])
    assert producer.flush(30) == 0, "not every test record was delivered"
    return count


def table_count(pipeline: Pipeline, table: str) -> int:
    return int(pipeline.client().command(f"SELECT count() FROM `{pipeline.cfg.clickhouse.database}`.`{table}`"))


def stage_tables_left(pipeline: Pipeline) -> list[str]:
    """Stage tables of the pipeline in any of its tables."""
    rows = pipeline.client().query(
        "SELECT name FROM system.tables WHERE database = {db:String} AND position(name, {m:String}) > 0",
        parameters={"db": pipeline.cfg.clickhouse.database, "m": f"__chtxn_{pipeline.cfg.name}__"},
    )
    return [r[0] for r in rows.result_rows]


def oracle_per_table(pipeline: Pipeline) -> dict[str, DeepReport]:
    """docs/architecture.md §11 in each table: every offset of the topics routed to it, committed once."""
    ledger = LedgerHistory.of(pipeline.cfg, pipeline.client())
    commits, audit = ledger.commits(), ledger.audit()
    topics = {tp.topic for tp in pipeline.partitions} | {r.topic for c in commits for r in c.ranges}
    by_table = routing.table_map(sorted(topics), pipeline.cfg.routes)
    return {
        table: verify_deep(
            pipeline.client(),
            pipeline.cfg.clickhouse.database,
            table,
            commits,
            None,
            audit,
            topics={t for t, routed in by_table.items() if routed == table},
        )
        for table in pipeline.cfg.tables
    }


def assert_exactly_once_per_table(pipeline: Pipeline, produced: dict[str, int]) -> None:
    """The oracle holds in every table, each holding exactly the records of its topics (``produced``: by table)."""
    for table, report in oracle_per_table(pipeline).items():
        assert report.ok, (table, report.anomalies)
        assert report.rows_in_target == produced[table], (table, report.rows_in_target, produced[table])
