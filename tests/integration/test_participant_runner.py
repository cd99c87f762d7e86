"""The participant task runner against the real broker and ClickHouse, with the test as coordinator.

The test sends START / END / ACK-COMMIT / ABORT on the control topic and reads back WRITE-STATUS
and heartbeats; the runner stages real records into real stage tables and dead-letters bad ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition as KafkaTP

from clients import failpoints
from coordinator.stage.tables import StageTables
from participant.runner import TaskRunner
from protocol import codec, naming
from protocol.dead_letters import letters as dead_letter_table
from protocol.errors import SetupError
from protocol.messages import (
    Abort,
    AckCommit,
    ControlMessage,
    EndCommit,
    Heartbeat,
    PartitionOffset,
    StartCommit,
    TopicPartition,
    WriteStatus,
)
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import StoppableThread, task
from tests.pipelines import TARGET_DDL, Pipeline, make_pipeline

WAIT_S = 60.0


class TestCoordinator:
    """Plays the coordinator: sends control messages, collects what participants send."""

    __test__ = False

    def __init__(self, pipeline: Pipeline) -> None:
        cfg = pipeline.cfg
        self.cfg, self.pipeline = cfg, pipeline
        self.producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
        self.consumer = Consumer({"bootstrap.servers": cfg.kafka.bootstrap_servers, "group.id": unique_name("tc")})
        self.consumer.assign([KafkaTP(cfg.control_topic, 0, 0)])
        self.received: list[ControlMessage] = []
        self.times: list[float] = []  # broker timestamps (s) of ``received``
        self.stages = StageTables(
            pipeline.client(), database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name
        )

    def send(self, message: ControlMessage) -> None:
        self.producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=codec.encode(message))
        assert self.producer.flush(10) == 0

    def start(self, txn: str, offsets: dict[TopicPartition, int], epoch: int = 1) -> str:
        table = naming.stage_table(self.cfg.clickhouse.target_table, self.cfg.name, txn)
        self.stages.create(table)
        self.send(
            StartCommit(
                pipeline=self.cfg.name,
                epoch=epoch,
                txn=txn,
                sender="test",
                stage_table=table,
                offsets=tuple(
                    PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in offsets.items()
                ),
            )
        )
        return table

    def end(self, txn: str, epoch: int = 1) -> None:
        self.send(EndCommit(pipeline=self.cfg.name, epoch=epoch, txn=txn, sender="test"))

    def collect(self) -> list[ControlMessage]:
        for msg in self.consumer.consume(num_messages=500, timeout=0.05):
            if msg.error() is None and (decoded := codec.decode(msg.value())) is not None:
                self.received.append(decoded)
                self.times.append(msg.timestamp()[1] / 1000)
        return self.received

    def statuses(self, txn: str) -> dict[TopicPartition, WriteStatus]:
        return {m.tp: m for m in self.collect() if isinstance(m, WriteStatus) and m.txn == txn}

    def wait_statuses(self, txn: str, count: int) -> dict[TopicPartition, WriteStatus]:
        return wait_until(
            lambda: len(self.statuses(txn)) == count and self.statuses(txn), WAIT_S, f"WRITE-STATUS of {txn}"
        )

    def heartbeats(self) -> list[Heartbeat]:
        return [m for m in self.collect() if isinstance(m, Heartbeat)]

    def wait_read(self, txn: str, positions: dict[TopicPartition, int]) -> None:
        """Until a heartbeat for ``txn`` shows every partition read up to ``positions``."""

        def reached() -> bool:
            beats = [h for h in self.heartbeats() if h.txn == txn]
            if not beats:
                return False
            seen = {p.tp: p.position for p in beats[-1].partitions}
            return all(seen.get(tp, -1) >= o for tp, o in positions.items())

        wait_until(reached, WAIT_S, f"the participant to read {txn} up to {positions}")

    def close(self) -> None:
        self.consumer.close()


#: A target whose inserts take about 0.4 s per row (chunks of 3 rows: 1.2 s an insert).
SLOW_TARGET_DDL = TARGET_DDL.replace("_offset Int64", "_offset Int64,\n    slow UInt8 MATERIALIZED sleepEachRow(0.4)")


@pytest.fixture
def pipeline(stack, tmp_path: Path, request: pytest.FixtureRequest) -> Pipeline:
    """Parametrize with a target DDL, or with extra settings (a dict)."""
    param = getattr(request, "param", TARGET_DDL)
    target_ddl, settings = (TARGET_DDL, param) if isinstance(param, dict) else (param, {})
    return make_pipeline(
        stack,
        tmp_path,
        unique_name("pr"),
        partitions=2,
        settings={"participant.chunk_rows": 3, **settings},
        target_ddl=target_ddl,
    )


@pytest.fixture
def coordinator(pipeline: Pipeline) -> Iterator[TestCoordinator]:
    tc = TestCoordinator(pipeline)
    yield tc
    tc.close()


@pytest.fixture
def start_runner(pipeline: Pipeline, coordinator: TestCoordinator) -> Iterator:
    runners: list[StoppableThread] = []

    def start(participant_id: str = "task-0") -> StoppableThread:
        runner = task(pipeline, pipeline.partitions, participant_id)
        runners.append(runner)
        # listening once it heartbeats: it assigns the control topic before its first heartbeat
        wait_until(
            lambda: any(h.sender == participant_id for h in coordinator.heartbeats()), WAIT_S, "a first heartbeat"
        )
        return runner

    yield start
    for runner in runners:
        runner.stop()


def produce(pipeline: Pipeline, partition: int, values: list[bytes | None]) -> None:
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
    for i, value in enumerate(values):
        producer.produce(pipeline.topic, value=value, key=b"k%d" % i, partition=partition)
    assert producer.flush(10) == 0


def good(i: int) -> bytes:
    return json.dumps({"id": i, "user": f"u{i}", "amount": i / 2}).encode()


def staged_offsets(pipeline: Pipeline, table: str) -> dict[int, list[int]]:
    rows = (
        pipeline.client()
        .query(f"SELECT _partition, _offset, _topic, id FROM `{pipeline.cfg.name}`.`{table}` ORDER BY ALL")
        .result_rows
    )
    assert {r[2] for r in rows} <= {pipeline.topic}
    result: dict[int, list[int]] = {}
    for partition, offset, _, _ in rows:
        result.setdefault(partition, []).append(offset)
    return result


def stored_letters(pipeline: Pipeline) -> list[dead_letter_table.DeadLetter]:
    """The letters participants stored in ``chtxn_dead_letters`` (published only once their txn commits)."""
    rows = (
        pipeline.client()
        .query(
            f"SELECT {dead_letter_table.SELECT_COLUMNS} FROM {dead_letter_table.qualified(pipeline.cfg.name)} ORDER BY offset",
            query_formats={"String": "bytes"},
        )
        .result_rows
    )
    return [dead_letter_table.from_result_row(r) for r in rows]


def dead_letter_topic_end(pipeline: Pipeline) -> int:
    consumer = Consumer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "group.id": unique_name("dlq")})
    try:
        return consumer.get_watermark_offsets(KafkaTP(pipeline.cfg.dead_letter_topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def test_a_txn_stages_exactly_what_it_reports_and_dead_letters_bad_records(pipeline, coordinator, start_runner):
    tp0, tp1 = pipeline.partitions
    produce(pipeline, 0, [good(i) for i in range(7)])
    bad = [b'{"id": 101, "user": "broken', b'{"id": "not a number", "user": "x", "amount": 1}', None, b"[1, 2]", b"{"]
    p1_values = [good(100), bad[0], good(102), bad[1], bad[2], bad[3], good(106), bad[4]]
    produce(pipeline, 1, p1_values)
    start_runner()

    table = coordinator.start("e1_t1", {tp0: 0, tp1: 0})
    coordinator.wait_read("e1_t1", {tp0: 7, tp1: 8})
    coordinator.end("e1_t1")
    statuses = coordinator.wait_statuses("e1_t1", 2)

    s0, s1 = statuses[tp0], statuses[tp1]
    assert (s0.start_offset, s0.end_offset, s0.rows, s0.chunks, s0.dead_letters, s0.errors) == (0, 7, 7, 3, 0, ())
    assert (s1.start_offset, s1.end_offset, s1.rows, s1.chunks, s1.dead_letters, s1.errors) == (0, 8, 3, 3, 5, ())
    assert s0.bytes == sum(len(good(i)) for i in range(7))
    assert staged_offsets(pipeline, table) == {0: list(range(7)), 1: [0, 2, 6]}
    assert coordinator.stages.count(table) == s0.rows + s1.rows

    letters = stored_letters(pipeline)
    assert sorted((x.key, x.value) for x in letters) == [(b"k%d" % o, p1_values[o]) for o in (1, 3, 4, 5, 7)], (
        "dead letters keep the original key and value"
    )
    for x in letters:
        assert (x.pipeline, x.txn, x.topic, x.partition) == (pipeline.cfg.name, "e1_t1", pipeline.topic, 1)
        assert x.error, "a dead letter says why"
        assert x.timestamp_ms > 0, "a dead letter keeps the record's timestamp"
    by_offset = {x.offset: x for x in letters}
    assert by_offset[1].error.startswith("malformed JSON")
    assert by_offset[3].error_code != 0, "the type mismatch was found by ClickHouse"
    assert by_offset[4].error.startswith("tombstone: null value")
    assert by_offset[5].error.startswith("not a JSON object")
    assert by_offset[7].error.startswith("not a JSON object")
    assert dead_letter_topic_end(pipeline) == 0, "participants never produce letters: the leader publishes them"

    beat = coordinator.heartbeats()[-1]
    assert beat.sender == "task-0" and {p.tp for p in beat.partitions} == {tp0, tp1}

    # ACK-COMMIT: the end offsets go to the consumer group (for lag tools)
    coordinator.send(
        AckCommit(
            pipeline=pipeline.cfg.name,
            epoch=1,
            txn="e1_t1",
            sender="test",
            offsets=(
                PartitionOffset(topic=pipeline.topic, partition=0, offset=7),
                PartitionOffset(topic=pipeline.topic, partition=1, offset=8),
            ),
        )
    )
    group = Consumer(
        {
            "bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers,
            "group.id": naming.consumer_group(pipeline.cfg.name),
        }
    )
    try:

        def committed() -> list[int]:
            return [
                tp.offset for tp in group.committed([KafkaTP(pipeline.topic, 0), KafkaTP(pipeline.topic, 1)], timeout=5)
            ]

        wait_until(lambda: committed() == [7, 8], WAIT_S, "offsets committed to the consumer group")
    finally:
        group.close()


def test_pipelined_start_continues_and_a_start_after_abort_seeks_back(pipeline, coordinator, start_runner):
    tp0, tp1 = pipeline.partitions
    produce(pipeline, 0, [good(i) for i in range(4)])
    start_runner()

    coordinator.start("e1_t1", {tp0: 0, tp1: 0})
    coordinator.wait_read("e1_t1", {tp0: 4})
    coordinator.end("e1_t1")
    first = coordinator.wait_statuses("e1_t1", 2)
    assert (first[tp0].end_offset, first[tp1].end_offset) == (4, 0)

    # pipelined: START before the ACK of e1_t1, from its end offsets: no gap, no overlap
    t2 = coordinator.start("e1_t2", {tp0: 4, tp1: 0})
    produce(pipeline, 0, [good(i) for i in range(4, 9)])
    produce(pipeline, 1, [good(i) for i in range(2)])
    coordinator.wait_read("e1_t2", {tp0: 9, tp1: 2})
    coordinator.end("e1_t2")
    second = coordinator.wait_statuses("e1_t2", 2)
    assert [(s.start_offset, s.end_offset, s.rows) for s in (second[tp0], second[tp1])] == [(4, 9, 5), (0, 2, 2)]
    assert staged_offsets(pipeline, t2) == {0: [4, 5, 6, 7, 8], 1: [0, 1]}

    # e1_t3 reads on, is aborted; e1_t4 starts where e1_t3 did: the participant seeks back
    coordinator.start("e1_t3", {tp0: 9, tp1: 2})
    produce(pipeline, 0, [good(i) for i in range(9, 12)])
    coordinator.wait_read("e1_t3", {tp0: 12})
    coordinator.send(Abort(pipeline=pipeline.cfg.name, epoch=1, txn="e1_t3", sender="test", reason="test"))
    t4 = coordinator.start("e1_t4", {tp0: 9, tp1: 2})
    coordinator.wait_read("e1_t4", {tp0: 12})
    coordinator.end("e1_t4")
    fourth = coordinator.wait_statuses("e1_t4", 2)
    assert [(s.start_offset, s.end_offset, s.rows) for s in (fourth[tp0], fourth[tp1])] == [(9, 12, 3), (2, 2, 0)]
    assert staged_offsets(pipeline, t4) == {0: [9, 10, 11]}
    assert coordinator.statuses("e1_t3") == {}, "an aborted txn is never reported"


def test_a_participant_started_mid_txn_waits_for_the_next_start(pipeline, coordinator, start_runner):
    tp0, tp1 = pipeline.partitions
    produce(pipeline, 0, [good(i) for i in range(3)])
    coordinator.start("e1_t1", {tp0: 0, tp1: 0})  # before the participant runs
    start_runner()
    coordinator.end("e1_t1")
    coordinator.start("e1_t2", {tp0: 0, tp1: 0})
    coordinator.wait_read("e1_t2", {tp0: 3})
    coordinator.end("e1_t2")
    statuses = coordinator.wait_statuses("e1_t2", 2)
    assert statuses[tp0].rows == 3
    # control messages are ordered: a WRITE-STATUS for e1_t1 would have come before e1_t2's
    assert coordinator.statuses("e1_t1") == {}
    # a stale epoch is ignored
    coordinator.start("e0_t9", {tp0: 0, tp1: 0}, epoch=0)
    coordinator.end("e0_t9", epoch=0)
    coordinator.start("e1_t3", {tp0: 3, tp1: 0})
    coordinator.end("e1_t3")
    coordinator.wait_statuses("e1_t3", 2)
    assert coordinator.statuses("e0_t9") == {}


@pytest.mark.parametrize("pipeline", [SLOW_TARGET_DDL], indirect=True)
def test_heartbeats_keep_flowing_while_an_insert_is_slow(pipeline, coordinator, start_runner):
    tp0, tp1 = pipeline.partitions
    produce(pipeline, 0, [good(i) for i in range(2)])
    start_runner()
    coordinator.start("e1_t1", {tp0: 0, tp1: 0})
    coordinator.wait_read("e1_t1", {tp0: 2})
    coordinator.end("e1_t1")  # the open chunk of 2 rows is inserted now, slowly
    coordinator.wait_statuses("e1_t1", 2)

    kinds = [(type(m).__name__, getattr(m, "txn", ""), t) for m, t in zip(coordinator.received, coordinator.times)]
    end_at = next(t for kind, txn, t in kinds if kind == "EndCommit")
    status_at = max(t for kind, txn, t in kinds if kind == "WriteStatus")
    beats = [t for kind, _, t in kinds if kind == "Heartbeat"]
    during = [t for t in beats if end_at < t < status_at]
    assert len(during) >= 2, (
        f"heartbeats while the last chunk was inserted: {during} (END {end_at}, WRITE-STATUS {status_at})"
    )
    timeout = pipeline.cfg.heartbeat_timeout_s
    gaps = [b - a for a, b in pairwise(beats)]
    assert max(gaps) < timeout, f"a heartbeat gap of {max(gaps):.2f} s would declare the participant dead"


@pytest.mark.parametrize("pipeline", [{"participant.poll_batch": 1}], indirect=True)
def test_reading_waits_while_one_chunk_per_partition_read_is_inserted(pipeline, coordinator, start_runner):
    tp0, _ = pipeline.partitions
    produce(pipeline, 0, [good(i) for i in range(10)])
    held = failpoints.arm("stage.before-insert", "pause")
    try:
        start_runner()
        coordinator.start("e1_t1", {tp0: 0})  # one partition read: the backlog is one chunk, 3 rows
        coordinator.wait_read("e1_t1", {tp0: 3})
        assert held.reached.wait(WAIT_S), "the first chunk's insert began"
        seen = len(coordinator.heartbeats())
        wait_until(lambda: len(coordinator.heartbeats()) >= seen + 5, WAIT_S, "five heartbeats with the insert held")
        positions = {p.position for h in coordinator.heartbeats()[seen:] for p in h.partitions if p.tp == tp0}
        assert positions == {3}, "no record is read past one chunk while it waits to be inserted"
    finally:
        failpoints.disarm()
    coordinator.wait_read("e1_t1", {tp0: 10})
    coordinator.end("e1_t1")
    assert coordinator.wait_statuses("e1_t1", 1)[tp0].rows == 10


def test_a_target_the_participant_cannot_fill_is_refused_at_start(pipeline):
    cfg = pipeline.cfg
    parquet = msgspec.structs.replace(cfg, clickhouse=msgspec.structs.replace(cfg.clickhouse, input_format="Parquet"))
    with pytest.raises(SetupError, match=r"metadata columns .*input_format is 'Parquet', which chtxn does not load"):
        TaskRunner(parquet, pipeline.partitions).run()
    missing = msgspec.structs.replace(cfg, clickhouse=msgspec.structs.replace(cfg.clickhouse, target_table="nope"))
    with pytest.raises(SetupError, match=r"target table .*\.nope does not exist"):
        TaskRunner(missing, pipeline.partitions).run()
