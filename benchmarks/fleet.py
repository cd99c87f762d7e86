"""Many participant tasks simulated in one process, for ``benchmarks.partitions``.

``Fleet`` plays ``tasks`` participant tasks, each with its own sender id and its own share of the
partitions, on the real control topic: every task heartbeats every ``heartbeat_interval_s`` (the
beats of the tasks spread over the interval), and answers START, END and ABORT as
``participant.runner.TaskRunner`` does: START names the offsets to stage from; at END each task
stages what it holds of the txn and sends one WRITE-STATUS per partition.

- Idle: nothing is produced, so nothing is staged: a WRITE-STATUS of 0 rows at once.
- Busy (``read_data=True``): one consumer reads every partition continuously, as the tasks'
  data consumers would. At END each task inserts the records it read from each partition's START
  offset on (with ``_topic/_partition/_offset`` spliced in by the fleet: only the coordinator is measured) into the stage table,
  one ``JSONEachRow`` insert per task and stage table (``per_partition``: per partition, as real
  tasks' chunks), then reports. Real tasks insert most of it during the txn; same messages.

It is test code for measuring the coordinator, not a participant: no pausing, no retries, no
dead letters, no consumer-group commits. Its CPU is the benchmark driver's, never the
coordinator's (that runs in its own process).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import clickhouse_connect
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition as KafkaTP

from protocol import codec, naming
from protocol.config.parse import PipelineConfig
from protocol.messages import (
    Abort,
    AckCommit,
    ControlMessage,
    EndCommit,
    Heartbeat,
    PartitionPosition,
    StartCommit,
    TopicPartition,
    WriteStatus,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)

#: Insert workers: how many tasks stage at the same time (real tasks run in parallel).
STAGING_WORKERS = 4
#: Inserts one task makes at once, into the stage tables of several tables (a real task's ``Stager``
#: pool: ``participant.runner.TaskRunner``'s 2 workers).
INSERTS_PER_TASK = 2


@dataclass
class _Read:
    """What the data consumer holds of one partition: ``values[i]`` is the record at ``base + i``."""

    base: int = 0
    values: list[bytes] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.base + len(self.values)


@dataclass
class FleetCounts:
    """What the fleet did (for the report and for sanity checks)."""

    heartbeats: int = 0
    write_statuses: int = 0
    inserts: int = 0
    rows_staged: int = 0
    insert_errors: int = 0
    starts: int = 0
    ends: int = 0
    aborts: int = 0


def tasks_of(partitions: list[TopicPartition], tasks: int) -> list[list[TopicPartition]]:
    """Round-robin ``partitions`` over ``tasks`` groups (fewer when there are fewer partitions)."""
    n = max(1, min(tasks, len(partitions)))
    return [partitions[i::n] for i in range(n)]


class Fleet:
    """``with Fleet(cfg, groups, read_data=...)``: the tasks run until the block ends."""

    def __init__(
        self, cfg: PipelineConfig, groups: list[list[TopicPartition]], *, read_data: bool, per_partition: bool = False
    ) -> None:
        self.cfg, self.per_partition = cfg, per_partition
        self.groups = groups
        self.senders = [f"bench-task-{i:03d}" for i in range(len(groups))]
        self.read_data = read_data
        self.counts = FleetCounts()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._read: dict[TopicPartition, _Read] = {tp: _Read() for g in groups for tp in g}
        self._epoch = 0
        self._open: dict[str, StartCommit] = {}
        self._current = ""  # the txn between START and END ("" between txns)
        self._txn_base: dict[TopicPartition, int] = {}  # START offsets of the current txn
        self._local = threading.local()
        self._threads: list[threading.Thread] = []
        self._pool = ThreadPoolExecutor(max_workers=STAGING_WORKERS, thread_name_prefix="fleet-stage")
        self._inserts = ThreadPoolExecutor(
            max_workers=STAGING_WORKERS * INSERTS_PER_TASK, thread_name_prefix="fleet-insert"
        )
        base = {"bootstrap.servers": cfg.kafka.bootstrap_servers}
        self._producer = Producer({**base, "linger.ms": 2})

    def __enter__(self) -> Fleet:
        for target, name in ((self._control, "fleet-control"), (self._heartbeats, "fleet-heartbeats")) + (
            ((self._data, "fleet-data"),) if self.read_data else ()
        ):
            thread = threading.Thread(target=self._guard, args=(target,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._inserts.shutdown(wait=True, cancel_futures=True)
        self._producer.flush(10)

    def _guard(self, target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # surfaced by the benchmark (check())
            self.error = exc
            log.exception("fleet thread failed")

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the simulated participants failed: {self.error!r}") from self.error

    # ---- threads ----------------------------------------------------------------------------

    def _control(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.cfg.kafka.bootstrap_servers,
                "group.id": f"{self.cfg.name}.bench-fleet",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        consumer.assign([KafkaTP(self.cfg.control_topic, 0, OFFSET_END)])
        try:
            while not self._stop.is_set():
                for record in consumer.consume(500, 0.05):
                    if record.error() is None:
                        message = codec.decode(record.value())
                        if message is not None and message.pipeline == self.cfg.name:
                            self._on(message)
                self._producer.poll(0)
        finally:
            consumer.close()

    def _heartbeats(self) -> None:
        interval = self.cfg.transaction.heartbeat_interval_s
        step = interval / len(self.groups)
        next_at = time.monotonic()
        while not self._stop.is_set():
            for sender, group in zip(self.senders, self.groups):
                self._send(self._heartbeat(sender, group))
                self.counts.heartbeats += 1
                next_at += step
                if self._stop.wait(max(0.0, next_at - time.monotonic())):
                    return

    def _data(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.cfg.kafka.bootstrap_servers,
                "group.id": f"{self.cfg.name}.bench-fleet-data",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([KafkaTP(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in self._read])
        try:
            while not self._stop.is_set():
                batch = consumer.consume(5000, 0.05)
                with self._lock:
                    for record in batch:
                        if record.error() is not None:
                            continue
                        tp = TopicPartition(topic=record.topic(), partition=record.partition())  # type: ignore[arg-type]  # set: no error
                        read = self._read.get(tp)
                        if read is None:
                            continue
                        if not read.values:
                            read.base = record.offset()  # type: ignore[assignment]  # set: no error
                        if record.offset() == read.end:
                            read.values.append(record.value())  # type: ignore[arg-type]  # the benchmark writes no tombstones
        finally:
            consumer.close()

    # ---- the protocol -----------------------------------------------------------------------

    def _heartbeat(self, sender: str, group: list[TopicPartition]) -> Heartbeat:
        with self._lock:
            positions = tuple(
                PartitionPosition(
                    topic=tp.topic,
                    partition=tp.partition,
                    position=self._read[tp].end,
                    log_end=self._read[tp].end,
                    buffered_rows=max(0, self._read[tp].end - self._txn_base[tp]) if tp in self._txn_base else 0,
                )
                for tp in group
            )
            txn = self._current
        return Heartbeat(pipeline=self.cfg.name, epoch=self._epoch, txn=txn, sender=sender, partitions=positions)

    def _on(self, message: object) -> None:
        if isinstance(message, (StartCommit, EndCommit, Abort)):
            if message.epoch < self._epoch:
                return
            self._epoch = message.epoch
        if isinstance(message, StartCommit):
            self.counts.starts += 1
            self._open[message.txn] = message
            with self._lock:
                self._current = message.txn
                self._txn_base = {o.tp: o.offset for o in message.offsets}
        elif isinstance(message, Abort):
            self.counts.aborts += 1
            self._open.pop(message.txn, None)
        elif isinstance(message, EndCommit) and message.txn in self._open:
            self.counts.ends += 1
            start = self._open.pop(message.txn)
            with self._lock:
                self._current, self._txn_base = "", {}
            offsets = {o.tp: o.offset for o in start.offsets}
            holders = {(h.topic, h.partition): h.sender for h in start.holders}
            for sender, group in zip(self.senders, self.groups):
                mine = [tp for tp in group if tp in offsets and holders.get((tp.topic, tp.partition), sender) == sender]
                if mine:
                    self._pool.submit(self._guard, functools.partial(self._stage, start, sender, mine, offsets))
        elif isinstance(message, AckCommit):
            with self._lock:  # committed: the records before the ACK's offsets are never asked for again
                for o in message.offsets:
                    read = self._read.get(o.tp)
                    if read is not None and o.offset > read.base:
                        cut = min(o.offset - read.base, len(read.values))
                        del read.values[:cut]
                        read.base += cut

    def _stage(
        self, start: StartCommit, sender: str, group: list[TopicPartition], offsets: dict[TopicPartition, int]
    ) -> None:
        """One task at END: its partitions' records from START on, one insert per stage table (per partition
        too with ``per_partition``), as many at once as a task's pool; then WRITE-STATUSes."""
        lines: dict[tuple[str, str], list[bytes]] = {}
        ends: dict[TopicPartition, int] = {}
        with self._lock:
            for tp in group:
                read, begin = self._read[tp], offsets[tp]
                if not start.stage_table_for(tp):  # its table (or shard) has no stage table in this txn: held
                    ends[tp] = begin
                    continue
                if begin < read.base:  # not held any more (cannot happen while ACKs trim only below commits)
                    ends[tp] = begin
                    continue
                values = read.values[begin - read.base :]
                ends[tp] = begin + len(values)
                prefix = b'{"_topic":"%s","_partition":%d,"_offset":' % (tp.topic.encode(), tp.partition)
                key = (start.stage_table_for(tp), f"/{tp.topic}:{tp.partition}" if self.per_partition else "")
                lines.setdefault(key, []).extend(prefix + b"%d," % (begin + i) + v[1:] for i, v in enumerate(values))
        ends_key = ",".join(f"{tp.topic}:{tp.partition}:{offsets[tp]}-{ends[tp]}" for tp in group)
        token = naming.chunk_token(self.cfg.name, start.txn, group[0].topic, group[0].partition, 0, 0, 0)

        def insert(key: tuple[str, str], body: list[bytes]) -> str:
            """One stage table's insert (of one partition with ``per_partition``); the error, "" when none."""
            stage_table, suffix = key
            try:
                self._client().raw_insert(
                    stage_table,
                    insert_block=b"\n".join(body),
                    fmt="JSONEachRow",
                    settings={
                        "insert_deduplication_token": f"{token}/{stage_table}/{ends_key}{suffix}",
                        "async_insert": 0,
                    },
                )
            except Exception as exc:  # e.g. the stage table of an aborted txn: report, as a participant does
                with self._lock:
                    self.counts.insert_errors += 1
                return f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.counts.inserts += 1
                self.counts.rows_staged += len(body)
            return ""

        bodies = [(key, body) for key, body in lines.items() if body]
        if len(bodies) == 1:
            found = [insert(*bodies[0])]
        else:
            found = [f.result() for f in [self._inserts.submit(insert, t, b) for t, b in bodies]]
        errors: tuple[str, ...] = tuple(e for e in found if e)[:1]
        for tp in group:
            begin = offsets[tp]
            self._send(
                WriteStatus(
                    pipeline=self.cfg.name,
                    epoch=start.epoch,
                    txn=start.txn,
                    sender=sender,
                    topic=tp.topic,
                    partition=tp.partition,
                    start_offset=begin,
                    end_offset=ends[tp],
                    rows=ends[tp] - begin,
                    chunks=1 if ends[tp] > begin else 0,
                    bytes=0,
                    errors=errors,
                )
            )
            self.counts.write_statuses += 1

    # ---- clients ----------------------------------------------------------------------------

    def _client(self) -> Client:  # one per staging thread
        client = getattr(self._local, "client", None)
        if client is None:
            ch = self.cfg.clickhouse
            host, port = ch.url.removeprefix("http://").rstrip("/").split(":")
            client = self._local.client = clickhouse_connect.get_client(host=host, port=int(port), database=ch.database)
        return client

    def _send(self, message: ControlMessage) -> None:
        while True:
            try:
                self._producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=codec.encode(message))
                return
            except BufferError:
                self._producer.poll(0.01)
