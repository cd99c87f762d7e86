"""Build a whole pipeline on the test stack: topics, a target table with metadata columns, config."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import clickhouse_connect
from confluent_kafka import Consumer, Producer, TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from clients import kafka as kafka_clients
from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from coordinator.verify import DeepReport, dead_letter_offsets, own_topics, verify_deep
from protocol import codec
from protocol.config.parse import PipelineConfig, parse_config
from protocol.messages import EndCommit, TopicPartition

TARGET_DDL = """
CREATE TABLE {db}.{table}
(
    id UInt64,
    user String,
    amount Float64,
    _topic LowCardinality(String),
    _partition Int32,
    _offset Int64
)
ENGINE = MergeTree
PARTITION BY _partition
ORDER BY (_topic, _partition, _offset)
"""


@dataclass
class Pipeline:
    cfg: PipelineConfig
    config_path: Path
    partitions: list[TopicPartition]
    #: The client of ``client()`` and the ``[clickhouse]`` section it was made for.
    _client: tuple[object, object] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def topic(self) -> str:
        return self.cfg.pipeline.topics[0]

    def client(self):  # a clickhouse-connect client
        """A client of the pipeline's ClickHouse, made once per ``[clickhouse]`` section and shared
        (clients are thread-safe). Making one costs queries of its own, and tests poll through this
        (``target_count``, ``ledger``) many times a second."""
        if self._client is None or self._client[0] is not self.cfg.clickhouse:
            self._client = (self.cfg.clickhouse, make_client(self.cfg.clickhouse))
        return self._client[1]

    def ledger(self) -> LedgerHistory:
        return LedgerHistory.of(self.cfg, self.client())

    def produce(self, count: int, *, start_id: int = 0, bad_every: int = 0, into: Sequence[int] = ()) -> int:
        """``count`` JSON events spread over the partitions (those numbered ``into`` only, when given) in
        turn; every ``bad_every``-th is malformed."""
        producer = Producer({"bootstrap.servers": self.cfg.kafka.bootstrap_servers, "linger.ms": 5})
        numbers = list(into) or [tp.partition for tp in self.partitions]
        for i in range(start_id, start_id + count):
            if bad_every and i % bad_every == bad_every - 1:
                value = b'{"id": %d, "user": "broken' % i  # malformed JSON
            else:
                value = json.dumps({"id": i, "user": f"u{i % 97}", "amount": i * 0.5}).encode()
            producer.produce(self.topic, value=value, key=str(i).encode(), partition=numbers[i % len(numbers)])
            if i % 10_000 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0, "not every test record was delivered"
        return count

    def control_records(self) -> list[tuple[float, object]]:
        """(broker timestamp in seconds, message) of every control record so far, in order;
        records that do not decode are left out."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.cfg.kafka.bootstrap_servers,
                "group.id": "control-read",
                "enable.auto.commit": False,
            }
        )
        try:
            _, high = consumer.get_watermark_offsets(KafkaTP(self.cfg.control_topic, 0), timeout=10)
            consumer.assign([KafkaTP(self.cfg.control_topic, 0, 0)])
            records, seen = [], 0
            while seen < high:
                batch = consumer.consume(1000, 5)
                assert batch, "the control topic ended early"
                for record in batch:
                    seen = record.offset() + 1
                    if (message := codec.decode(record.value())) is not None:
                        records.append((record.timestamp()[1] / 1000, message))
            return records
        finally:
            consumer.close()

    def target_count(self) -> int:
        db, table = self.cfg.clickhouse.database, self.cfg.clickhouse.target_table
        return int(self.client().command(f"SELECT count() FROM `{db}`.`{table}`"))

    def stage_tables(self) -> list[str]:
        db, table = self.cfg.clickhouse.database, self.cfg.clickhouse.target_table
        rows = (
            self.client()
            .query(
                "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, {p:String})",
                parameters={"db": db, "p": f"{table}__chtxn_{self.cfg.name}__"},
            )
            .result_rows
        )
        return [r[0] for r in rows]

    def dead_letter_offsets(self) -> dict[TopicPartition, set[int]]:
        """Source offsets named in the dead-letter topic's headers."""
        return dead_letter_offsets(self.cfg)

    def oracle(self, dead_letters: dict[TopicPartition, set[int]] | None = None) -> DeepReport:
        """docs/architecture.md §11: every committed offset exactly once in the target, nothing else."""
        ledger = self.ledger()
        commits = ledger.commits()
        return verify_deep(
            self.client(),
            self.cfg.clickhouse.database,
            self.cfg.clickhouse.target_table,
            commits,
            dead_letters,
            ledger.audit(),
            topics=own_topics(self.cfg, commits),
        )


def make_pipeline(
    stack, tmp_path: Path, name: str, *, partitions: int = 2, settings: dict | None = None, target_ddl: str = TARGET_DDL
) -> Pipeline:
    """A fresh pipeline: its own database, source topic, control and dead-letter topics, ledger."""
    settings = settings or {}
    sections: dict[str, dict] = {
        "pipeline": {"name": name, "topics": [f"{name}_events"]},
        "kafka": {"bootstrap_servers": stack.kafka_bootstrap},
        "clickhouse": {"url": stack.clickhouse_url, "database": name, "target_table": "events"},
        "transaction": {
            "interval_s": 0.5,
            "write_status_timeout_s": 10.0,
            "heartbeat_interval_s": 0.2,
            "heartbeat_misses": 10,
        },
        "participant": {"chunk_rows": 5000},
    }
    for key, value in settings.items():
        section, field = key.split(".", 1)
        sections.setdefault(section, {})[field] = value
    text = "\n".join(_toml_section(s, fields) for s, fields in sections.items())
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    cfg = parse_config(text, source=str(path))

    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    kafka_clients.create_topics(
        admin, {cfg.pipeline.topics[0]: partitions, cfg.control_topic: 1, cfg.dead_letter_topic: 1}
    )
    host, port = stack.clickhouse_url.removeprefix("http://").rstrip("/").split(":")
    client = clickhouse_connect.get_client(host=host, port=int(port))
    db = cfg.clickhouse.database  # the pipeline's name unless settings share another pipeline's
    client.command(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    if not int(client.command(f"EXISTS TABLE `{db}`.`events`")):
        client.command(target_ddl.format(db=f"`{db}`", table="`events`"))
    LedgerStore.of(cfg, client).ensure_tables()
    tps = [TopicPartition(topic=cfg.pipeline.topics[0], partition=p) for p in range(partitions)]
    return Pipeline(cfg, path, tps)


def _toml_section(name: str, fields: dict) -> str:
    lines = [f"[{name}]"]
    for key, value in fields.items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def control_messages(pipeline: Pipeline) -> list:
    """Every control message of the pipeline so far, in order."""
    return [message for _, message in pipeline.control_records()]


def chained_ends(pipeline: Pipeline) -> dict[str, str]:
    """``{txn k: txn k+1}`` for every END on the control topic that carried the next START."""
    return {m.txn: m.next.txn for m in control_messages(pipeline) if isinstance(m, EndCommit) and m.next is not None}


def all_offsets(counts: Iterable[tuple[TopicPartition, int]]) -> dict[TopicPartition, set[int]]:
    return {tp: set(range(n)) for tp, n in counts}


def assert_exactly_once(
    pipeline: Pipeline,
    rows: int,
    dead_letters: dict[TopicPartition, set[int]] | None = None,
    *,
    nothing_lost: bool = False,
) -> None:
    """The oracle holds and the target has ``rows`` rows of the pipeline; with ``nothing_lost``,
    no committed txn was recorded LOST either."""
    report = pipeline.oracle(dead_letters)
    assert report.ok, report.anomalies
    assert report.rows_in_target == rows
    if nothing_lost:
        assert pipeline.ledger().lost() == []
