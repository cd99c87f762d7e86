"""The I/O shell of one participant task: polls Kafka, feeds the state machine, carries out actions.

One task holds several source partitions and runs, until stopped:

- one control consumer: partition 0 of the control topic, no group, from the high watermark at
  start-up (a restarted task takes no part in a txn under way and waits for the next START),
  read in offset order with no record left out (``clients.control_reader``);
- one data consumer: its partitions by ``assign`` (no group membership), committing to the group
  ``naming.consumer_group(pipeline)`` only after ACK-COMMIT, ``read_committed``, and
  ``auto.offset.reset=error`` (an out-of-range START offset fails the txn instead of skipping),
  with partition EOF events: where a partition ends, past transaction markers (``ReadToEnd``);
- one producer, for control messages only (dead letters go to ClickHouse with their chunk:
  ``participant.dead_letters``);
- a small pool of insert workers (``Stager``), so consumption and heartbeats go on while chunks
  are inserted. When the rows cut into chunks and not yet staged reach the insert backlog
  (``participant.insert_backlog_rows``; by default one chunk per partition being read, at the
  txn's chunk size), data polling waits (back-pressure). That bound is also what is left to
  insert at an END.

Every heartbeat carries the task's figures since ``run`` started (``participant.tally``): records
polled, chunks staged, inserts and their time, retries. The loop never blocks on ClickHouse; it
blocks at most ``POLL_S`` in a Kafka poll. Construction does no I/O and the object stays picklable
(Spark ships it to executors); clients are made in ``run``.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from confluent_kafka import KafkaError, Message, TopicPartition as KafkaTP

from clients import failpoints
from clients.clickhouse import make_client
from clients.control_reader import ControlReader
from clients.kafka import KafkaClientFactory, check_control_topic
from participant.dead_letters import DeadLetterSink
from participant.outage import ride_out
from participant.shard_stagers import ShardStagers
from participant.tally import Tally
from protocol import naming
from protocol.chunking import RecordLike
from protocol.codec import encode
from protocol.config.parse import PipelineConfig
from protocol.messages import TopicPartition, WriteStatus
from protocol.participant.events import (
    Action,
    ChunkStaged,
    CommitOffsets,
    DropTxn,
    Event,
    PartitionFailed,
    Pause,
    Polled,
    ReadToEnd,
    Received,
    Resume,
    Seek,
    Send,
    StageChunk,
    Tick,
)
from protocol.participant.state import ParticipantState

log = logging.getLogger(__name__)

#: Longest wait in one Kafka poll: bounds how late a control message, an insert outcome or a
#: heartbeat is acted on (an END waits for it twice: to be seen, and for its last insert).
POLL_S = 0.01


class TaskRunner:
    """The participant of one task: ``partitions`` of the pipeline in ``cfg``."""

    def __init__(
        self,
        cfg: PipelineConfig,
        partitions: Sequence[TopicPartition],
        *,
        participant_id: str = "",
        workers: int = 2,
        clock: Callable[[], float] = time.monotonic,
        job: str = "",
    ) -> None:
        if not partitions:
            raise ValueError("a participant task needs at least one partition")
        self.cfg, self.partitions = cfg, tuple(sorted(partitions))
        self.participant_id = participant_id
        self.job = job  # the participant job's id: a LEAVE naming it makes this task leave
        self.workers, self.clock = workers, clock
        self.backlog_rows = cfg.participant.insert_backlog_rows  # 0: ParticipantState.insert_backlog_rows
        self.kafka = KafkaClientFactory(cfg)  # plain data: the runner stays picklable

    def run(self, stop: threading.Event | None = None) -> None:
        """Take part in txns until ``stop`` is set (Spark: until the task is killed), or until this
        task has left after a LEAVE of its job (participant step 6)."""
        stop = stop or threading.Event()
        tally = Tally()  # one for the whole run: a loop started again after an outage counts on
        loop = ride_out(lambda: self._started(tally), timeout_s=self.cfg.participant.outage_timeout_s, stop=stop)
        if loop is None:  # stopped while ClickHouse or the broker was away
            return
        try:
            while not stop.is_set() and not loop.machine.left(loop.clock()):
                loop.once()
        finally:
            loop.close()

    def _started(self, tally: Tally) -> _Loop:
        """Clients made and the task's checks passed. ClickHouse or the broker away is retried by
        ``run`` (``participant.outage``), one log line per attempt; a ``SetupError`` is raised at once."""
        loop = _Loop(self, tally)
        try:
            loop.start()
        except BaseException:
            loop.close()
            raise
        return loop


class _Loop:
    """The clients and the machine of one ``TaskRunner.run``."""

    def __init__(self, runner: TaskRunner, tally: Tally) -> None:
        cfg = runner.cfg
        self.cfg, self.clock, self.backlog_rows = cfg, runner.clock, runner.backlog_rows
        self.tally = tally
        first = runner.partitions[0]
        self.sender = runner.participant_id or f"{socket.gethostname()}-{os.getpid()}-{first.topic}-{first.partition}"
        self.machine = ParticipantState(
            pipeline=cfg.name,
            sender=self.sender,
            partitions=runner.partitions,
            chunk_rows=cfg.participant.chunk_rows * cfg.chunk_scale,  # by a sharding key, split over the shards
            chunk_bytes=cfg.participant.chunk_bytes,
            heartbeat_interval_s=cfg.transaction.heartbeat_interval_s,
            size_trigger_rows=cfg.transaction.size_trigger_rows,
            shard_count=cfg.placed_count,
            job=runner.job,
            figures=tally.figures,
        )
        self.client = make_client(cfg.clickhouse)  # first: it is what fails when ClickHouse is down
        kafka = runner.kafka
        self.producer = kafka.producer(**{"linger.ms": 2})
        self.control = ControlReader(
            kafka.consumer(
                **{
                    "group.id": naming.participant_control_group(cfg.name),
                    "enable.partition.eof": False,
                    "fetch.wait.max.ms": cfg.kafka.control_fetch_wait_ms,
                }
            ),
            cfg.control_topic,
            who=self.sender,
            clock=self.clock,
        )
        self.data = kafka.consumer(
            **{
                "isolation.level": "read_committed",
                "auto.offset.reset": "error",
                "enable.partition.eof": True,  # where a partition ends, past markers: ``ReadToEnd``
            }
        )
        dead_letters = DeadLetterSink(
            self.client,
            database=cfg.clickhouse.database,
            pipeline=cfg.name,
            attempts=cfg.participant.insert_retries,
        )
        self.stagers = ShardStagers(cfg, self.client, dead_letters=dead_letters, tally=tally)
        self.pool = ThreadPoolExecutor(max_workers=runner.workers, thread_name_prefix="chtxn-stage")
        self.results: queue.SimpleQueue[tuple[int, ChunkStaged | None]] = queue.SimpleQueue()  # (rows, outcome)
        self.in_flight_rows = 0  # rows of chunks submitted and not yet taken from ``results``
        self.dropped: deque[str] = deque(maxlen=64)
        self.assigned: set[tuple[str, int]] = set()

    def start(self) -> None:
        """Check what the task needs, then listen to the control topic from its end."""
        cfg = self.cfg
        self.stagers.check_targets()
        check_control_topic(self.control.consumer, cfg.control_topic, bootstrap=cfg.kafka.bootstrap_servers)
        _, high = self.control.consumer.get_watermark_offsets(KafkaTP(cfg.control_topic, 0), timeout=10)
        self.control.assign(high)
        held = [f"{p.tp.topic}/{p.tp.partition}" for p in self.machine.parts.values()]
        log.info("participant %s listening from control offset %d", self.sender, high, extra={"partitions": held})

    def once(self) -> None:
        """One turn: control messages, insert outcomes, heartbeat, one data poll."""
        busy = self.machine.consuming and self._room()
        for message in self.control.read(64, timeout=0 if busy else POLL_S):
            self._feed(Received(message))
        while True:
            try:
                rows, result = self.results.get_nowait()
            except queue.Empty:
                break
            self.in_flight_rows -= rows
            if result is not None:
                self._feed(result)
        if self.machine.heartbeat_due(self.clock()):
            self._feed(Tick(self._log_ends()))
        if self.machine.consuming and self._room():
            self._poll_data()
        self.producer.poll(0)

    def _room(self) -> bool:
        """Whether the rows cut into chunks and not yet staged leave room to read on."""
        return self.in_flight_rows < (self.backlog_rows or self.machine.insert_backlog_rows)

    def _poll_data(self) -> None:
        batch = self.data.consume(num_messages=self.cfg.participant.poll_batch, timeout=POLL_S)
        records = [m for m in batch if m.error() is None]
        ends: list[ReadToEnd] = []
        if len(records) < len(batch):
            for m in batch:
                if (error := m.error()) is None:
                    continue
                topic, partition, offset = m.topic(), m.partition(), m.offset()
                if error.code() == KafkaError._PARTITION_EOF and None not in (topic, partition, offset):
                    ends.append(ReadToEnd(cast("str", topic), cast("int", partition), cast("int", offset)))
                else:
                    self._on_data_error(m, error)
        if records:  # without an error, a record has its topic, partition and offset:
            self.tally.read(len(records))
            self._feed(Polled(cast("list[RecordLike]", records)))
        for end in ends:  # after the records: an end only moves a txn's range forward, past them
            self._feed(end)

    def _on_data_error(self, m: Message, error: KafkaError) -> None:
        topic, partition = m.topic(), m.partition()
        if (
            topic is not None
            and partition is not None
            and (topic, partition) in self.machine.parts
            and not error.retriable()
        ):
            self._feed(PartitionFailed(topic, partition, f"cannot read {topic}/{partition}: {error.str()}"))
        else:
            log.warning("data consumer: %s", error.str(), extra={"topic": topic, "partition": partition})

    def _feed(self, event: Event) -> None:
        for action in self.machine.handle(event, self.clock()):
            self._do(action)

    # ---- actions --------------------------------------------------------------------------

    def _do(self, a: Action) -> None:
        if isinstance(a, StageChunk):
            self.in_flight_rows += a.chunk.rows
            self.pool.submit(self._stage, a)
        elif isinstance(a, Send):
            if isinstance(a.message, WriteStatus):
                failpoints.hit("participant.before-write-status", self.sender)
            self.producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=encode(a.message))
        elif isinstance(a, Seek):
            self._seek(a)
        elif isinstance(a, Pause):
            self.data.pause([KafkaTP(tp.topic, tp.partition) for tp in a.partitions])
        elif isinstance(a, Resume):
            self.data.resume([KafkaTP(tp.topic, tp.partition) for tp in a.partitions])
        elif isinstance(a, DropTxn):
            self.dropped.append(a.txn)
        elif isinstance(a, CommitOffsets):
            try:
                self.data.commit(
                    offsets=[KafkaTP(o.topic, o.partition, o.offset) for o in a.offsets], asynchronous=True
                )
            except Exception as exc:  # lag reporting only: never worth failing the task
                log.warning("cannot commit offsets to the consumer group: %s", exc)
        else:
            raise TypeError(f"not a participant action: {a!r}")

    def _seek(self, a: Seek) -> None:
        """Re-assign at the offset: unlike ``seek``, this works before the first fetch, and it
        drops whatever was fetched for the partition before."""
        if (a.topic, a.partition) in self.assigned:
            self.data.incremental_unassign([KafkaTP(a.topic, a.partition)])
        self.data.incremental_assign([KafkaTP(a.topic, a.partition, a.offset)])
        self.data.resume([KafkaTP(a.topic, a.partition)])  # a pause outlives a re-assignment
        self.assigned.add((a.topic, a.partition))

    def _stage(self, a: StageChunk) -> None:  # on a worker thread; always posts one result
        chunk = a.chunk
        if chunk.txn in self.dropped:
            self.results.put((chunk.rows, None))
            return
        try:
            failpoints.hit("stage.before-insert", self.sender)
            result = self.stagers.of(chunk).stage(a.stage_table, chunk)
            failpoints.hit("stage.after-insert", self.sender)
            if not result.error:
                self.tally.staged()
        except Exception as exc:  # a bug: report it so the txn aborts instead of hanging
            log.exception("staging chunk %s crashed", chunk.token)
            result = ChunkStaged(
                txn=chunk.txn,
                topic=chunk.topic,
                partition=chunk.partition,
                chunk_no=chunk.chunk_no,
                error=f"staging crashed: {type(exc).__name__}: {exc}",
            )
        self.results.put((chunk.rows, result))

    def _log_ends(self) -> dict[TopicPartition, int]:
        ends: dict[TopicPartition, int] = {}
        for topic, partition in self.assigned:
            try:
                _, high = self.data.get_watermark_offsets(KafkaTP(topic, partition), cached=True)
            except Exception:
                continue
            if high is not None and high >= 0:
                ends[TopicPartition(topic=topic, partition=partition)] = high
        return ends

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for closing in (
            self.control.close,
            self.data.close,
            lambda: self.producer.flush(5),
            self.client.close,
            self.stagers.close,
        ):
            try:
                closing()
            except Exception as exc:
                log.warning("closing the participant: %s", exc)
