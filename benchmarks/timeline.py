"""Where a txn's time goes, read back from the control topic after a pipeline run.

Every control message carries its producer's timestamp (CreateTime, ms), so the topic is a
timeline of the protocol. Per data txn (one with rows in its WRITE-STATUS set):

- ``consume``: START -> END, participants reading and staging (a START carried by the previous
  txn's END starts at that END);
- ``flush``: END -> last WRITE-STATUS, participants inserting their open and in-flight chunks
  (while reading the next txn when its START came with the END);
- ``turnaround``: END -> next START, when no txn is being read: the flush, the coordinator's
  count and claim, and the START, when the END went alone; 0 for a chained START;
- ``to_ack``: last WRITE-STATUS -> ACK-COMMIT.

Participants read during ``consume`` only, so consume / (consume + turnaround) is the share of
the time they can read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import msgspec
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition as KafkaTP

from protocol.codec import decode
from protocol.config.parse import PipelineConfig
from protocol.messages import AckCommit, EndCommit, StartCommit, WriteStatus


@dataclass
class TxnTimes:
    """Times (unix seconds) of one txn's control messages; 0.0 where none was seen."""

    start: float = 0.0
    end: float = 0.0
    write_statuses: list[float] = field(default_factory=list)
    ack: float = 0.0
    rows: int = 0
    chunks: int = 0
    next_start: float = 0.0


@dataclass
class Phases:
    """Medians in ms over the data txns, and the number of txns they come from."""

    txns: int
    consume_ms: float
    flush_ms: float
    turnaround_ms: float
    to_ack_ms: float
    chunks_per_txn: float

    @property
    def reading_share(self) -> float:
        cycle = self.consume_ms + self.turnaround_ms
        return self.consume_ms / cycle if cycle else 0.0


def read(cfg: PipelineConfig, dump: Path | None = None, timeout_s: float = 30.0) -> dict[str, TxnTimes]:
    """Every txn's times from the control topic, read from its start to its end.

    With ``dump``, every message also goes there as one JSON line: ``{"ts": unix seconds, "msg": {...}}``.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": cfg.kafka.bootstrap_servers,
            "group.id": f"{cfg.name}.bench-timeline",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([KafkaTP(cfg.control_topic, 0, OFFSET_BEGINNING)])
    txns: dict[str, TxnTimes] = {}
    order: list[str] = []
    out = open(dump, "wb") if dump else None  # noqa: SIM115 -- closed below
    try:
        at_end = False
        while not at_end:
            batch = consumer.consume(num_messages=1000, timeout=timeout_s)
            if not batch:
                raise TimeoutError(f"the control topic {cfg.control_topic} gave nothing for {timeout_s:g} s")
            for m in batch:
                if (error := m.error()) is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end = True
                        continue
                    raise RuntimeError(f"reading {cfg.control_topic}: {error.str()}")
                msg, ts = decode(m.value()), m.timestamp()[1] / 1000
                _note(txns, order, msg, ts)
                if out is not None:
                    out.write(msgspec.json.encode({"ts": ts, "msg": msg}) + b"\n")
    finally:
        consumer.close()
        if out is not None:
            out.close()
    for earlier, later in pairwise(order):
        txns[earlier].next_start = txns[later].start
    return txns


def _note(txns: dict[str, TxnTimes], order: list[str], msg: object, ts: float) -> None:
    if isinstance(msg, StartCommit):
        order.append(msg.txn)
        txns.setdefault(msg.txn, TxnTimes()).start = ts
    elif isinstance(msg, EndCommit):
        txns.setdefault(msg.txn, TxnTimes()).end = ts
        if msg.next is not None:
            _note(txns, order, msg.next, ts)
    elif isinstance(msg, WriteStatus):
        times = txns.setdefault(msg.txn, TxnTimes())
        times.write_statuses.append(ts)
        times.rows += msg.rows
        times.chunks += msg.chunks
    elif isinstance(msg, AckCommit):
        txns.setdefault(msg.txn, TxnTimes()).ack = ts


def phases(txns: dict[str, TxnTimes]) -> Phases | None:
    """Medians over the txns with rows that went START -> END -> WRITE-STATUS -> ACK; None if none did."""
    data = [t for t in txns.values() if t.rows and t.start and t.end and t.write_statuses and t.ack]
    if not data:
        return None

    def median_ms(values: list[float]) -> float:
        return statistics.median(values) * 1000 if values else float("nan")

    return Phases(
        txns=len(data),
        consume_ms=median_ms([t.end - t.start for t in data]),
        flush_ms=median_ms([max(t.write_statuses) - t.end for t in data]),
        turnaround_ms=median_ms([max(0.0, t.next_start - t.end) for t in data if t.next_start]),
        to_ack_ms=median_ms([t.ack - max(t.write_statuses) for t in data]),
        chunks_per_txn=statistics.mean(t.chunks for t in data),
    )
