"""The participant of one Spark task as a pure state machine (no I/O, clock passed in).

``ParticipantState.handle(event, now)`` returns the actions the runner carries out in order.
The steps of one txn, for each partition the task holds (DESIGN.md section 3):

1. START lists the partition: seek to its START offset (no seek when already there, e.g. a
   START pipelined right after the previous END) and consume.
2. Records are cut into chunks (``protocol.chunking``) and each chunk is staged as it closes,
   while consumption goes on.
3. END: flush the open chunk, pause the partition, and once every chunk of it is staged send
   one WRITE-STATUS (end offset = next offset to read; errors, if any, make the coordinator
   abort the txn).
4. ACK-COMMIT for a txn this task ended: commit its offsets to the consumer group.
5. ABORT of the current txn, or of an ended txn not yet acknowledged (which dooms every txn
   started after it): drop those txns, pause, and wait for the next START.

Messages of a lower epoch than the highest seen, messages for txns this task is not part of,
and other participants' messages are ignored. A START that names another copy of this
participant (another ``sender``) as a partition's holder fences this copy out of that partition
for the txn: it stands down (stays paused) and waits for a START that names it. A task that starts mid-txn (a restart) sees no
START for it and so takes no part; it joins at the next START. A heartbeat goes out every
``heartbeat_interval_s``.

A chunk that fails to stage (``ChunkStaged.error``) fails its partition for the txn: the
partition is paused and its records are no longer staged; at END its WRITE-STATUS carries the
error, so the coordinator aborts and the records are read again in a later txn.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from protocol.chunking import ChunkBuilder, RecordLike
from protocol.messages import (
    Abort, AckCommit, ControlMessage, EndCommit, Heartbeat, PartitionOffset, PartitionPosition,
    StartCommit, TopicPartition, WriteStatus,
)
from protocol.participant_events import (
    Action, ChunkStaged, CommitOffsets, DropTxn, Event, PartitionFailed, Pause, Polled, Received,
    Resume, Seek, Send, StageChunk, Tick,
)

log = logging.getLogger(__name__)

#: Ended txns awaiting ACK-COMMIT remembered at most (older ones are forgotten, not failed).
MAX_UNACKED = 16


class Status(enum.Enum):
    IDLE = "idle"  # in no txn: paused (or never assigned), waiting for a START
    STAGING = "staging"  # consuming into the current txn
    FAILED = "failed"  # a chunk failed: paused, waiting for END to report the error
    ENDING = "ending"  # END seen, waiting for in-flight chunks before WRITE-STATUS


@dataclass
class Partition:
    """One partition this task holds; ``position`` is the consumer's next offset (-1: unknown)."""

    tp: TopicPartition
    position: int = -1
    fetching: bool = False  # assigned and not paused
    status: Status = Status.IDLE
    txn: str = ""
    epoch: int = 0
    start_offset: int = 0
    builder: ChunkBuilder | None = None
    pending: set[int] = field(default_factory=set)  # chunk numbers in flight
    rows: int = 0
    dead_letters: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def buffered_rows(self) -> int:
        return self.builder.rows_read if self.builder else 0


class ParticipantState:
    """The participant's decisions, for the partitions of one task."""

    def __init__(
        self, *, pipeline: str, sender: str, partitions: Iterable[TopicPartition],
        chunk_rows: int, chunk_bytes: int, heartbeat_interval_s: float,
    ) -> None:
        self.pipeline, self.sender = pipeline, sender
        self.chunk_rows, self.chunk_bytes = chunk_rows, chunk_bytes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.parts: dict[tuple[str, int], Partition] = {
            (tp.topic, tp.partition): Partition(tp=tp) for tp in sorted(set(partitions))
        }
        self.epoch = 0  # highest epoch seen
        self.current = ""  # the txn of the latest START this task took part in
        self.current_epoch = 0
        self.current_open = False  # START seen, neither ended nor dropped
        self.stage_table = ""
        self.unacked: dict[str, int] = {}  # txn -> epoch: ended here, oldest first, awaiting ACK
        self.next_heartbeat = float("-inf")

    # ---- queries (read-only, for the runner) ----------------------------------------------

    @property
    def consuming(self) -> bool:
        """True when some partition is being read into a txn (the runner should poll data)."""
        return any(p.status is Status.STAGING for p in self.parts.values())

    def heartbeat_due(self, now: float) -> bool:
        return now >= self.next_heartbeat

    # ---- events ---------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        if isinstance(event, Polled):
            return self._on_records(event.records)
        if isinstance(event, Received):
            return self._on_message(event.message)
        if isinstance(event, ChunkStaged):
            return self._on_staged(event)
        if isinstance(event, Tick):
            return self._on_tick(event, now)
        if isinstance(event, PartitionFailed):
            return self._on_partition_failed(event)
        raise TypeError(f"not a participant event: {event!r}")

    def _on_message(self, m: ControlMessage) -> list[Action]:
        if not isinstance(m, (StartCommit, EndCommit, AckCommit, Abort)):
            return []  # heartbeats, WRITE-STATUS of others, leader heartbeats
        if m.pipeline != self.pipeline:
            log.warning("ignoring a control message of pipeline %r (this is %r)", m.pipeline, self.pipeline)
            return []
        if m.epoch < self.epoch:
            log.info("ignoring %s of stale epoch %d (seen %d)", type(m).__name__, m.epoch, self.epoch)
            return []
        self.epoch = m.epoch
        if isinstance(m, StartCommit):
            return self._on_start(m)
        if isinstance(m, EndCommit):
            return self._on_end(m)
        if isinstance(m, AckCommit):
            return self._on_ack(m)
        return self._on_abort(m)

    def _on_start(self, m: StartCommit) -> list[Action]:
        if m.txn == self.current or m.txn in self.unacked:
            return []  # a START seen before
        actions: list[Action] = []
        if self.current_open:
            log.warning("START of %s while %s was never ended: dropping %s", m.txn, self.current, self.current)
            actions += self._drop([self.current])
        self.current, self.current_epoch, self.current_open = m.txn, m.epoch, True
        self.stage_table = m.stage_table
        resume: list[TopicPartition] = []
        holders = {(h.topic, h.partition): h.sender for h in m.holders}
        for po in m.offsets:
            p = self.parts.get((po.topic, po.partition))
            if p is None:
                continue
            holder = holders.get((po.topic, po.partition), self.sender)
            if holder != self.sender:  # another copy of this participant holds it: stand down
                log.warning("START of %s names %s as holder of %s/%d, not this copy (%s): standing down",
                            m.txn, holder, po.topic, po.partition, self.sender)
                if p.status is not Status.IDLE:
                    p.status, p.builder, p.pending = Status.IDLE, None, set()
                actions += self._pause([p])
                continue
            if p.status is not Status.IDLE:  # still ending an older txn: it will never report
                log.warning("START of %s: abandoning %s of %s/%d", m.txn, p.txn, po.topic, po.partition)
            self._join(p, m, po.offset)
            if p.position != po.offset:
                actions.append(Seek(po.topic, po.partition, po.offset))
                p.position, p.fetching = po.offset, True
            elif not p.fetching:
                resume.append(p.tp)
                p.fetching = True
        if resume:
            actions.append(Resume(tuple(resume)))
        return actions

    def _join(self, p: Partition, m: StartCommit, offset: int) -> None:
        p.status, p.txn, p.epoch, p.start_offset = Status.STAGING, m.txn, m.epoch, offset
        p.builder = ChunkBuilder(
            pipeline=self.pipeline, txn=m.txn, topic=p.tp.topic, partition=p.tp.partition,
            start_offset=offset, chunk_rows=self.chunk_rows, chunk_bytes=self.chunk_bytes,
        )
        p.pending, p.rows, p.dead_letters, p.errors = set(), 0, 0, []

    def _on_end(self, m: EndCommit) -> list[Action]:
        if m.txn != self.current or not self.current_open:
            return []
        self.current_open = False
        self.unacked[m.txn] = self.current_epoch
        while len(self.unacked) > MAX_UNACKED:
            del self.unacked[next(iter(self.unacked))]
        actions: list[Action] = []
        for p in self._of_txn(m.txn):
            if p.status is Status.STAGING:
                chunk = p.builder.flush()  # type: ignore[union-attr]
                if chunk is not None:
                    p.pending.add(chunk.chunk_no)
                    actions.append(StageChunk(self.stage_table, chunk))
            p.status = Status.ENDING
            actions += self._pause([p]) + self._report_if_done(p)
        return actions

    def _on_ack(self, m: AckCommit) -> list[Action]:
        if m.txn not in self.unacked:
            return []
        txns = list(self.unacked)
        for txn in txns[: txns.index(m.txn) + 1]:
            del self.unacked[txn]
        offsets = tuple(po for po in m.offsets if (po.topic, po.partition) in self.parts)
        return [CommitOffsets(offsets)] if offsets else []

    def _on_abort(self, m: Abort) -> list[Action]:
        if m.txn in self.unacked:  # txns of the same leader started after an aborted one abort too
            epoch, txns = self.unacked[m.txn], list(self.unacked)
            doomed = [t for t in txns[txns.index(m.txn):] if self.unacked[t] == epoch]
            if self.current_open and self.current_epoch == epoch:
                doomed.append(self.current)
        elif m.txn == self.current and self.current_open:
            doomed = [self.current]
        else:
            return []
        log.info("txn %s aborted (%s): dropping %s", m.txn, m.reason, ", ".join(doomed))
        return self._drop(doomed)

    def _drop(self, txns: list[str]) -> list[Action]:
        actions: list[Action] = [DropTxn(t) for t in txns]
        dropped = [p for p in self.parts.values() if p.txn in txns and p.status is not Status.IDLE]
        for p in dropped:
            p.status, p.builder, p.pending = Status.IDLE, None, set()
        for txn in txns:
            self.unacked.pop(txn, None)
        if self.current in txns:
            self.current_open = False
        return actions + self._pause(dropped)

    # ---- records and chunks ---------------------------------------------------------------

    def _on_records(self, records: Sequence[RecordLike]) -> list[Action]:
        actions: list[Action] = []
        n, i = len(records), 0
        while i < n:  # runs of consecutive records of one partition
            topic, partition = records[i].topic(), records[i].partition()
            j = i + 1
            while j < n and records[j].partition() == partition and records[j].topic() == topic:
                j += 1
            p = self.parts.get((topic, partition))
            if p is not None and p.status is Status.STAGING:
                for chunk in p.builder.add(records, i, j):  # type: ignore[union-attr]
                    p.pending.add(chunk.chunk_no)
                    actions.append(StageChunk(self.stage_table, chunk))
                p.position = p.builder.next_offset  # type: ignore[union-attr]
            elif p is not None:  # delivered outside a txn: not staged; a later START seeks back
                p.position = max(p.position, records[j - 1].offset() + 1)
            i = j
        return actions

    def _on_staged(self, e: ChunkStaged) -> list[Action]:
        p = self.parts.get((e.topic, e.partition))
        if p is None or p.txn != e.txn or e.chunk_no not in p.pending:
            return []  # a dropped txn
        p.pending.discard(e.chunk_no)
        p.rows += e.rows
        p.dead_letters += e.dead_letters
        if e.error:
            return self._fail(p, f"chunk {e.chunk_no}: {e.error}")
        return self._report_if_done(p)

    def _on_partition_failed(self, e: PartitionFailed) -> list[Action]:
        p = self.parts.get((e.topic, e.partition))
        if p is None or p.status is Status.IDLE:
            log.warning("cannot read %s/%d outside a txn: %s", e.topic, e.partition, e.error)
            return []
        return self._fail(p, e.error)

    def _fail(self, p: Partition, error: str) -> list[Action]:
        p.errors.append(error)
        if p.status is Status.STAGING:
            p.status = Status.FAILED
            return self._pause([p])
        return self._report_if_done(p)

    def _report_if_done(self, p: Partition) -> list[Action]:
        """Step 3: one WRITE-STATUS once the partition has ended and nothing is in flight."""
        if p.status is not Status.ENDING or p.pending:
            return []
        b = p.builder
        assert b is not None
        status = WriteStatus(
            pipeline=self.pipeline, epoch=p.epoch, txn=p.txn, sender=self.sender,
            topic=p.tp.topic, partition=p.tp.partition, start_offset=p.start_offset,
            end_offset=b.next_offset, rows=p.rows, chunks=b.chunks_cut, dead_letters=p.dead_letters,
            bytes=b.bytes_read, errors=tuple(p.errors),
        )
        p.status, p.builder = Status.IDLE, None
        return [Send(status)]

    # ---- helpers --------------------------------------------------------------------------

    def _of_txn(self, txn: str) -> list[Partition]:
        return [p for p in self.parts.values() if p.txn == txn and p.status is not Status.IDLE]

    def _pause(self, parts: list[Partition]) -> list[Action]:
        fetching = [p for p in parts if p.fetching]
        for p in fetching:
            p.fetching = False
        return [Pause(tuple(p.tp for p in fetching))] if fetching else []

    def _on_tick(self, e: Tick, now: float) -> list[Action]:
        if now < self.next_heartbeat:
            return []
        self.next_heartbeat = now + self.heartbeat_interval_s
        in_txn = self.current if self.current_open else ""
        positions = tuple(
            PartitionPosition(
                topic=p.tp.topic, partition=p.tp.partition, position=p.position,
                log_end=e.log_ends.get(p.tp, -1),
                buffered_rows=p.buffered_rows if in_txn and p.txn == in_txn else 0,
            )
            for p in self.parts.values()
        )
        return [Send(Heartbeat(pipeline=self.pipeline, epoch=self.epoch, txn=in_txn, sender=self.sender, partitions=positions))]
