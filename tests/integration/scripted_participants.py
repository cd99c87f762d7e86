"""Test code playing the participants: the real control topic, real staged inserts, real Kafka reads.

``ScriptedParticipants`` answers START/END like a participant would, but in plain,
single-threaded test code whose behaviour the test steers (withhold a WRITE-STATUS, stop
heartbeating, report a wrong row count, answer every epoch). It reads the source records from
the START offsets up to the high watermark seen at END, so every row it stages is a real record.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import clickhouse_connect
from confluent_kafka import OFFSET_END, Consumer, KafkaError, Producer, TopicPartition as KafkaTP

from protocol import codec, naming
from protocol.config.parse import PipelineConfig
from protocol.messages import (
    Abort,
    EndCommit,
    Heartbeat,
    PartitionPosition,
    StartCommit,
    TopicPartition,
    WriteStatus,
)


@dataclass
class Knobs:
    """What the test changes while the participants run."""

    withhold_status: set[TopicPartition] = field(default_factory=set)  # never send WRITE-STATUS
    silent: bool = False  # no heartbeats at all
    extra_reported_rows: int = 0  # report more rows than staged (a row-count mismatch)
    obey_all_epochs: bool = False  # answer every leader, not only the highest epoch


class ScriptedParticipants:
    def __init__(self, cfg: PipelineConfig, partitions: list[TopicPartition], *, sender: str = "scripted") -> None:
        self.cfg = cfg
        self.partitions = partitions
        self.sender = sender
        self.knobs = Knobs()
        self.statuses: list[WriteStatus] = []
        self.starts: list[StartCommit] = []
        self.aborts: list[Abort] = []
        self.withheld: list[tuple[str, TopicPartition]] = []  # (txn, partition) of each WRITE-STATUS not sent
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scripted-participants", daemon=True)
        self._epoch = 0
        self._open: dict[str, StartCommit] = {}

    def __enter__(self) -> ScriptedParticipants:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error

    # ---- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc

    def _loop(self) -> None:
        base = {"bootstrap.servers": self.cfg.kafka.bootstrap_servers}
        control = Consumer({**base, "group.id": f"{self.sender}-control", "enable.auto.commit": False})
        control.assign([KafkaTP(self.cfg.control_topic, 0, OFFSET_END)])
        producer = Producer({**base, "linger.ms": 0})
        self._data = Consumer(
            {**base, "group.id": f"{self.sender}-data", "enable.auto.commit": False, "enable.partition.eof": True}
        )
        ch = self.cfg.clickhouse
        url = ch.url.removeprefix("http://").rstrip("/")
        host, port = url.split(":")
        self._ch = clickhouse_connect.get_client(host=host, port=int(port), database=ch.database)
        beats = threading.Thread(target=self._heartbeats, name="scripted-heartbeats", daemon=True)
        beats.start()
        try:
            while not self._stop.is_set():
                for record in control.consume(100, 0.05):
                    if record.error() is None:
                        message = codec.decode(record.value())
                        if message is not None:
                            self._on(message, producer)
        finally:
            control.close()
            self._data.close()

    def _heartbeats(self) -> None:
        """Heartbeats on their own thread, as a real participant sends them, even while staging."""
        producer = Producer({"bootstrap.servers": self.cfg.kafka.bootstrap_servers, "linger.ms": 0})
        while not self._stop.wait(self.cfg.transaction.heartbeat_interval_s):
            if self.knobs.silent:
                continue
            self._send(
                producer,
                Heartbeat(
                    pipeline=self.cfg.name,
                    epoch=self._epoch,
                    txn="",
                    sender=self.sender,
                    partitions=tuple(
                        PartitionPosition(topic=tp.topic, partition=tp.partition, position=0, log_end=-1)
                        for tp in self.partitions
                    ),
                ),
            )

    def _on(self, message: object, producer: Producer) -> None:
        epoch = getattr(message, "epoch", 0)
        if isinstance(message, (StartCommit, EndCommit, Abort)):
            if epoch < self._epoch and not self.knobs.obey_all_epochs:
                return
            self._epoch = max(self._epoch, epoch)
        if isinstance(message, StartCommit):
            self.starts.append(message)
            self._open[message.txn] = message
        elif isinstance(message, Abort):
            self.aborts.append(message)
            self._open.pop(message.txn, None)
        elif isinstance(message, EndCommit) and message.txn in self._open:
            start = self._open.pop(message.txn)
            for offset in start.offsets:
                tp = offset.tp
                if tp not in self.partitions:
                    continue
                if tp in self.knobs.withhold_status:
                    self.withheld.append((message.txn, tp))
                    continue
                status = self._stage(start, tp, offset.offset)
                self.statuses.append(status)
                self._send(producer, status)

    def _stage(self, start: StartCommit, tp: TopicPartition, begin: int) -> WriteStatus:
        """Stage every record from ``begin`` to the end of the partition; nothing when the START gives
        the partition's table (``[[route]]``) or shard no stage table."""
        lines = self._read(tp, begin) if start.stage_table_for(tp) else []
        high = begin + len(lines)
        errors: tuple[str, ...] = ()
        if lines:
            token = naming.chunk_token(self.cfg.name, start.txn, tp.topic, tp.partition, 0, begin, begin + len(lines))
            try:
                self._ch.raw_insert(
                    start.stage_table_for(tp),
                    insert_block=b"\n".join(lines),
                    fmt="JSONEachRow",
                    settings={"insert_deduplication_token": token, "async_insert": 0},
                )
            except (
                Exception
            ) as exc:  # e.g. the stage table of a txn a new leader dropped: report, as a participant does
                errors = (f"{type(exc).__name__}: {exc}",)
        return WriteStatus(
            pipeline=self.cfg.name,
            epoch=start.epoch,
            txn=start.txn,
            sender=self.sender,
            topic=tp.topic,
            partition=tp.partition,
            start_offset=begin,
            end_offset=max(high, begin),
            rows=len(lines) + self.knobs.extra_reported_rows,
            chunks=1 if lines else 0,
            errors=errors,
        )

    def _read(self, tp: TopicPartition, begin: int) -> list[bytes]:
        """Every record of ``tp`` from ``begin`` to the end (partition EOF, not ListOffsets: Tansu's
        ListOffsets(latest) lags behind the real end), as JSON lines with the metadata columns."""
        lines: list[bytes] = []
        self._data.assign([KafkaTP(tp.topic, tp.partition, begin)])
        at_end = False
        while not at_end:
            for record in self._data.consume(1000, 1.0):
                error = record.error()
                if error is not None:
                    at_end = at_end or (
                        error.code() == KafkaError._PARTITION_EOF and record.partition() == tp.partition
                    )
                    continue
                if (
                    record.topic() == tp.topic
                    and record.partition() == tp.partition
                    and record.offset() == begin + len(lines)
                ):
                    lines.append(
                        b'{"_topic":"%s","_partition":%d,"_offset":%d,'
                        % (tp.topic.encode(), tp.partition, record.offset())
                        + record.value()[1:]
                    )
        self._data.unassign()
        return lines

    def _send(self, producer: Producer, message: object) -> None:
        producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=codec.encode(message))
        producer.flush(10)
