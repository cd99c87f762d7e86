"""The participant of one Spark task as a pure state machine (no I/O, clock passed in).

``ParticipantState.handle(event, now)`` returns the actions the runner carries out in order.
The steps of one txn, for each partition the task holds (docs/architecture.md §4 and §8); the
code calls these "participant step N":

1. START lists the partition: seek to its START offset only when the position differs, and
   consume.
2. Records are cut into chunks (``protocol.chunking``) and each chunk is staged as it closes,
   while consumption goes on. Each time the rows read for the txn cross a multiple of this
   partition's share of ``size_trigger_rows`` (``protocol.size_trigger``), and once more when
   they reach ``full_rows``, a heartbeat goes out at once, so the coordinator sees the trigger
   reached, or this partition full, without waiting for the next beat; a full partition stops
   reading until END (which a full partition brings at once, with the next START).
3. END: cut the open chunk at the current position and stage it; once every chunk of the txn is
   staged, send one WRITE-STATUS (end offset = next offset to read; errors, if any, make the
   coordinator abort the txn). WRITE-STATUS of one partition go out in txn order. When END
   carries the next txn (``EndCommit.next``), the partition goes straight on reading into it
   from the cut, without a pause; otherwise it stops reading (nothing is polled, the fetched
   records stay buffered) until the next START.
4. ACK-COMMIT for a txn this task ended: commit its offsets to the consumer group.
5. ABORT of the current txn, or of an ended txn not yet acknowledged (which dooms every txn
   started after it): drop those txns, pause, and wait for the next START.

Partitions are paused only when they leave every txn (dropped, failed, fenced, or not part of
a START), never at END.

Messages of a lower epoch than the highest seen, messages for txns this task is not part of,
and other participants' messages are ignored. A START that names another copy of this
participant (another ``sender``) as a partition's holder fences this copy out of that partition
for the txn: it stands down (pauses) and waits for a START that names it. A task that starts
mid-txn (a restart) sees no START for it and so takes no part; it joins at the next START that
gives its partitions explicit offsets (a chained START's ``CONTINUE`` can only be followed by the
copy that cut the txn before). A heartbeat goes out every ``heartbeat_interval_s``.

A chunk that fails to stage (``ChunkStaged.error``) fails its partition for the txn: the
partition is paused and its records are no longer staged; at END its WRITE-STATUS carries the
error, so the coordinator aborts and the records are read again in a later txn.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from protocol import size_trigger
from protocol.chunking import ChunkBuilder, RecordLike
from protocol.messages import (
    CONTINUE,
    Abort,
    AckCommit,
    EndCommit,
    Heartbeat,
    PartitionPosition,
    StartCommit,
    TopicPartition,
    WriteStatus,
)
from protocol.participant_events import (
    Action,
    ChunkStaged,
    CommitOffsets,
    DropTxn,
    Event,
    PartitionFailed,
    Pause,
    Polled,
    Received,
    Resume,
    Seek,
    Send,
    StageChunk,
    Tick,
)

log = logging.getLogger(__name__)

#: Ended txns awaiting ACK-COMMIT remembered at most (older ones are forgotten, not failed).
MAX_UNACKED = 16


class Status(enum.Enum):
    STAGING = "staging"  # consuming into the txn
    FAILED = "failed"  # a chunk failed: paused, waiting for END to report the error
    ENDING = "ending"  # END seen, waiting for in-flight chunks before WRITE-STATUS


@dataclass
class Stint:
    """One partition's part in one txn."""

    txn: str
    epoch: int
    stage_table: str
    start_offset: int
    builder: ChunkBuilder
    share: int  # rows of ``size_trigger_rows`` this partition stands for (0: no trigger)
    status: Status = Status.STAGING
    pending: set[int] = field(default_factory=set)  # chunk numbers in flight
    rows: int = 0
    dead_letters: int = 0
    errors: list[str] = field(default_factory=list)
    reported_share: int = 0  # how many shares read were already reported at once
    reported_full: bool = False  # reaching ``full_rows`` was reported at once


@dataclass
class Partition:
    """One partition this task holds; ``position`` is the consumer's next offset (-1: unknown)."""

    tp: TopicPartition
    position: int = -1
    fetching: bool = False  # assigned and not paused
    open: Stint | None = None  # the txn being read (STAGING or FAILED)
    ending: list[Stint] = field(default_factory=list)  # ended txns awaiting chunks, oldest first

    @property
    def buffered_rows(self) -> int:
        return self.open.builder.rows_read if self.open else 0

    def stint(self, txn: str) -> Stint | None:
        if self.open is not None and self.open.txn == txn:
            return self.open
        return next((s for s in self.ending if s.txn == txn), None)


class ParticipantState:
    """The participant's decisions, for the partitions of one task."""

    def __init__(
        self,
        *,
        pipeline: str,
        sender: str,
        partitions: Iterable[TopicPartition],
        chunk_rows: int,
        chunk_bytes: int,
        heartbeat_interval_s: float,
        size_trigger_rows: int = 0,
    ) -> None:
        self.pipeline, self.sender = pipeline, sender
        self.chunk_rows, self.chunk_bytes = chunk_rows, chunk_bytes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.size_trigger_rows = size_trigger_rows
        self.parts: dict[tuple[str, int], Partition] = {
            (tp.topic, tp.partition): Partition(tp=tp) for tp in sorted(set(partitions))
        }
        self.epoch = 0  # highest epoch seen
        self.current = ""  # the txn of the latest START this task took part in
        self.current_epoch = 0
        self.current_open = False  # START seen, neither ended nor dropped
        self.unacked: dict[str, int] = {}  # txn -> epoch: ended here, oldest first, awaiting ACK
        self.next_heartbeat = float("-inf")
        self.log_ends: dict[TopicPartition, int] = {}
        self._report_now = False

    # ---- queries (read-only, for the runner) ----------------------------------------------

    @property
    def consuming(self) -> bool:
        """True when some partition is being read into a txn and has room left in it (the runner
        should poll data). A partition has read its fill at ``size_trigger.full_rows`` of its share:
        reading waits for END, so a txn ended by the trigger stays within ``SIZE_SLACK`` of it (to a
        poll batch)."""
        return any(
            p.open is not None
            and p.open.status is Status.STAGING
            and not (p.open.share and p.open.builder.rows_read >= size_trigger.full_rows(p.open.share))
            for p in self.parts.values()
        )

    @property
    def insert_backlog_rows(self) -> int:
        """One chunk per partition being read, at its txn's chunk size (``chunk_rows``, or the
        START's when lower): how many rows cut and not yet staged the runner allows by default, so
        that what is left to insert at END is about one chunk per partition. 0 when none is read."""
        return sum(p.open.builder.chunk_rows for p in self.parts.values() if p.open is not None)

    def heartbeat_due(self, now: float) -> bool:
        return now >= self.next_heartbeat

    # ---- events ---------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Take ``event`` at ``now``; the actions to carry out, in order."""
        handler = self._HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"ParticipantState has no handler for {type(event).__name__} (not a participant event)")
        return handler(self, event, now)

    def validate(self) -> None:
        """Raise ``InvalidTransition`` unless the invariants the module docstring promises hold
        (``protocol.participant_invariants``). O(partitions x txns): for tests, not the hot path."""
        from protocol import participant_invariants  # here: it imports this module

        participant_invariants.check(self)

    def _on_polled(self, event: Polled, now: float) -> list[Action]:
        actions = self._on_records(event.records)
        if self._report_now:  # Participant step 2: a share of the size trigger was crossed
            actions += self._heartbeat(now)
        return actions

    def _on_received(self, event: Received, now: float) -> list[Action]:
        m = event.message
        handler = self._MESSAGE_HANDLERS.get(type(m))
        if handler is None:
            return []  # heartbeats, WRITE-STATUS of others, leader heartbeats
        if m.pipeline != self.pipeline:
            log.warning("ignoring a control message of pipeline %r (this is %r)", m.pipeline, self.pipeline)
            return []
        if m.epoch < self.epoch:
            log.info("ignoring %s of stale epoch %d (seen %d)", type(m).__name__, m.epoch, self.epoch)
            return []
        self.epoch = m.epoch
        return handler(self, m)

    def _on_tick(self, event: Tick, now: float) -> list[Action]:
        self.log_ends.update(event.log_ends)
        return self._heartbeat(now) if now >= self.next_heartbeat else []

    def _on_start(self, m: StartCommit, cuts: dict[TopicPartition, int] | None = None) -> list[Action]:
        """Participant step 1: START. ``cuts``: where the END that carried this START cut each partition
        this copy read to that END without an error (``CONTINUE`` goes on from there)."""
        if m.txn == self.current or m.txn in self.unacked:
            return []  # a START seen before
        actions: list[Action] = []
        if self.current_open:
            log.warning("START of %s while %s was never ended: dropping %s", m.txn, self.current, self.current)
            actions += self._drop([self.current])
        self.current, self.current_epoch, self.current_open = m.txn, m.epoch, True
        holders = {(h.topic, h.partition): h.sender for h in m.holders}
        share = size_trigger.share(self.size_trigger_rows, len(m.offsets))
        resume: list[TopicPartition] = []
        joined: set[TopicPartition] = set()
        for po in m.offsets:
            p = self.parts.get((po.topic, po.partition))
            if p is None:
                continue
            holder = holders.get((po.topic, po.partition), self.sender)
            if holder != self.sender:  # another copy of this participant holds it: stand down
                log.warning(
                    "START of %s names %s as holder of %s/%d, not this copy (%s): standing down",
                    m.txn,
                    holder,
                    po.topic,
                    po.partition,
                    self.sender,
                )
                continue
            if p.open is not None:  # still reading an older txn: it will never report
                log.warning("START of %s: abandoning %s of %s/%d", m.txn, p.open.txn, po.topic, po.partition)
                p.open = None
            offset = po.offset
            if offset == CONTINUE:
                if cuts is None or p.tp not in cuts:
                    log.warning(
                        "START of %s continues %s/%d from a txn this copy did not read to its END: taking no part",
                        m.txn,
                        po.topic,
                        po.partition,
                    )
                    continue
                offset = cuts[p.tp]
            self._join(p, m, offset, share)
            joined.add(p.tp)
            if p.position != offset:
                actions.append(Seek(po.topic, po.partition, offset))
                p.position, p.fetching = offset, True
            elif not p.fetching:
                resume.append(p.tp)
                p.fetching = True
        if resume:
            actions.append(Resume(tuple(resume)))
        return actions + self._pause([p for p in self.parts.values() if p.tp not in joined])

    def _join(self, p: Partition, m: StartCommit, offset: int, share: int) -> None:
        builder = ChunkBuilder(
            pipeline=self.pipeline,
            txn=m.txn,
            topic=p.tp.topic,
            partition=p.tp.partition,
            start_offset=offset,
            chunk_rows=min(self.chunk_rows, m.chunk_rows or self.chunk_rows),
            chunk_bytes=self.chunk_bytes,
        )
        p.open = Stint(
            txn=m.txn, epoch=m.epoch, stage_table=m.stage_table, start_offset=offset, builder=builder, share=share
        )

    def _on_end(self, m: EndCommit) -> list[Action]:
        """Participant step 3: END, then the START it carries, if any."""
        if m.txn != self.current or not self.current_open:
            if m.next is not None and m.next.epoch >= self.epoch:
                return self._on_start(m.next)  # not in this txn: join the next where offsets are explicit
            return []
        self.current_open = False
        self.unacked[m.txn] = self.current_epoch
        while len(self.unacked) > MAX_UNACKED:
            del self.unacked[next(iter(self.unacked))]
        actions: list[Action] = []
        cuts: dict[TopicPartition, int] = {}
        for p in self.parts.values():
            stint = p.open
            if stint is None or stint.txn != m.txn:
                continue
            if not stint.errors:
                cuts[p.tp] = stint.builder.next_offset
            if stint.status is Status.STAGING:
                chunk = stint.builder.flush()
                if chunk is not None:
                    stint.pending.add(chunk.chunk_no)
                    actions.append(StageChunk(stint.stage_table, chunk))
            stint.status = Status.ENDING
            p.open = None
            p.ending.append(stint)
            actions += self._report_ready(p)
        if m.next is not None:
            actions += self._on_start(m.next, cuts)
        return actions

    def _on_ack(self, m: AckCommit) -> list[Action]:
        """Participant step 4: ACK-COMMIT, for this txn and every older one ended here."""
        if m.txn not in self.unacked:
            return []  # a txn this task did not end, or one forgotten (``MAX_UNACKED``)
        txns = list(self.unacked)
        for txn in txns[: txns.index(m.txn) + 1]:
            del self.unacked[txn]
        offsets = tuple(po for po in m.offsets if (po.topic, po.partition) in self.parts)
        return [CommitOffsets(offsets)] if offsets else []

    def _on_abort(self, m: Abort) -> list[Action]:
        """Participant step 5: ABORT."""
        if m.txn in self.unacked:  # txns of the same leader started after an aborted one abort too
            epoch, txns = self.unacked[m.txn], list(self.unacked)
            doomed = [t for t in txns[txns.index(m.txn) :] if self.unacked[t] == epoch]
            if self.current_open and self.current_epoch == epoch:
                doomed.append(self.current)
        elif m.txn == self.current and self.current_open:
            doomed = [self.current]
        else:
            return []  # a txn this task took no part in, or already dropped
        log.info("txn %s aborted (%s): dropping %s", m.txn, m.reason, ", ".join(doomed))
        return self._drop(doomed)

    def _drop(self, txns: list[str]) -> list[Action]:
        actions: list[Action] = [DropTxn(t) for t in txns]
        idle: list[Partition] = []
        for p in self.parts.values():
            p.ending = [s for s in p.ending if s.txn not in txns]
            if p.open is not None and p.open.txn in txns:
                p.open = None
            if p.open is None:
                idle.append(p)
        for txn in txns:
            self.unacked.pop(txn, None)
        if self.current in txns:
            self.current_open = False
        return actions + self._pause(idle)

    # ---- records and chunks ---------------------------------------------------------------

    def _on_records(self, records: Sequence[RecordLike]) -> list[Action]:
        actions: list[Action] = []
        n, i = len(records), 0
        only = next(iter(self.parts)) if len(self.parts) == 1 else None
        while i < n:  # runs of consecutive records of one partition
            topic, partition = records[i].topic(), records[i].partition()
            j = i + 1
            if (topic, partition) == only and (records[-1].topic(), records[-1].partition()) == only:
                j = n  # a task of one partition reads only that partition
            while j < n and records[j].partition() == partition and records[j].topic() == topic:
                j += 1
            p = self.parts.get((topic, partition))
            stint = p.open if p is not None else None
            if p is not None and stint is not None and stint.status is Status.STAGING:
                for chunk in stint.builder.add(records, i, j):
                    stint.pending.add(chunk.chunk_no)
                    actions.append(StageChunk(stint.stage_table, chunk))
                p.position = stint.builder.next_offset
                if stint.share and stint.builder.rows_read // stint.share > stint.reported_share:
                    stint.reported_share = stint.builder.rows_read // stint.share
                    self._report_now = True
                if (
                    stint.share
                    and not stint.reported_full
                    and stint.builder.rows_read >= size_trigger.full_rows(stint.share)
                ):
                    stint.reported_full = True  # full: the coordinator ends the txn at once
                    self._report_now = True
            elif p is not None:  # delivered outside a txn: not staged; a later START seeks back
                p.position = max(p.position, records[j - 1].offset() + 1)
            i = j
        return actions

    def _on_staged(self, e: ChunkStaged, now: float) -> list[Action]:
        p = self.parts.get((e.topic, e.partition))
        stint = p.stint(e.txn) if p is not None else None
        if p is None or stint is None or e.chunk_no not in stint.pending:
            return []  # a chunk of a dropped txn: ``DropTxn`` leaves chunks in flight, and they report
        stint.pending.discard(e.chunk_no)
        stint.rows += e.rows
        stint.dead_letters += e.dead_letters
        if e.error:
            return self._fail(p, stint, f"chunk {e.chunk_no}: {e.error}")
        return self._report_ready(p)

    def _on_partition_failed(self, e: PartitionFailed, now: float) -> list[Action]:
        p = self.parts.get((e.topic, e.partition))
        if p is None or p.open is None:
            log.warning("cannot read %s/%d outside a txn: %s", e.topic, e.partition, e.error)
            return []
        return self._fail(p, p.open, e.error)

    #: The handler of each event type, taken by ``handle``.
    _HANDLERS: ClassVar[dict[type, Callable[[Any, Any, float], list[Action]]]] = {
        Polled: _on_polled,
        Received: _on_received,
        ChunkStaged: _on_staged,
        Tick: _on_tick,
        PartitionFailed: _on_partition_failed,
    }
    #: The handler of each control message this task acts on; ``_on_received`` ignores the others.
    _MESSAGE_HANDLERS: ClassVar[dict[type, Callable[[Any, Any], list[Action]]]] = {
        StartCommit: _on_start,
        EndCommit: _on_end,
        AckCommit: _on_ack,
        Abort: _on_abort,
    }

    def _fail(self, p: Partition, stint: Stint, error: str) -> list[Action]:
        stint.errors.append(error)
        if stint.status is Status.STAGING:
            stint.status = Status.FAILED
            return self._pause([p])
        return self._report_ready(p)

    def _report_ready(self, p: Partition) -> list[Action]:
        """Participant step 3: one WRITE-STATUS per ended txn once nothing of it is in flight, oldest first."""
        actions: list[Action] = []
        while p.ending and not p.ending[0].pending:
            stint = p.ending.pop(0)
            b = stint.builder
            actions.append(
                Send(
                    WriteStatus(
                        pipeline=self.pipeline,
                        epoch=stint.epoch,
                        txn=stint.txn,
                        sender=self.sender,
                        topic=p.tp.topic,
                        partition=p.tp.partition,
                        start_offset=stint.start_offset,
                        end_offset=b.next_offset,
                        rows=stint.rows,
                        chunks=b.chunks_cut,
                        dead_letters=stint.dead_letters,
                        bytes=b.bytes_read,
                        errors=tuple(stint.errors),
                    )
                )
            )
        return actions

    # ---- helpers --------------------------------------------------------------------------

    def _pause(self, parts: list[Partition]) -> list[Action]:
        fetching = [p for p in parts if p.fetching]
        for p in fetching:
            p.fetching = False
        return [Pause(tuple(p.tp for p in fetching))] if fetching else []

    def _heartbeat(self, now: float) -> list[Action]:
        self.next_heartbeat = now + self.heartbeat_interval_s
        self._report_now = False
        in_txn = self.current if self.current_open else ""
        positions = tuple(
            PartitionPosition(
                topic=p.tp.topic,
                partition=p.tp.partition,
                position=p.position,
                log_end=self.log_ends.get(p.tp, -1),
                buffered_rows=p.buffered_rows if in_txn and p.open is not None and p.open.txn == in_txn else 0,
            )
            for p in self.parts.values()
        )
        return [
            Send(
                Heartbeat(
                    pipeline=self.pipeline,
                    epoch=self.epoch,
                    txn=in_txn,
                    sender=self.sender,
                    partitions=positions,
                    continues=True,
                )
            )
        ]
