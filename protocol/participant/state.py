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
   staged, send one WRITE-STATUS (end offset = next offset to read: after the last record, or the
   partition's end when the consumer read to it past offsets that hold no record, such as a
   transaction marker; errors, if any, make the coordinator abort the txn). WRITE-STATUS of one partition go out in txn order. When END
   carries the next txn (``EndCommit.next``), the partition goes straight on reading into it
   from the cut, without a pause; otherwise it stops reading (nothing is polled, the fetched
   records stay buffered) until the next START.
4. ACK-COMMIT for a txn this task ended: commit its offsets to the consumer group.
5. ABORT of the current txn, or of an ended txn not yet acknowledged (which dooms every txn
   started after it): drop those txns, pause, and wait for the next START.
6. LEAVE of this task's job (its driver got SIGTERM): heartbeat ``leaving`` at once and from then
   on, so the leader ends the txn this task is in at once and names it in no START; finish every
   txn it is in as in steps 2 and 3. ``left`` is true once it owes nothing and it has listened for
   ``LEAVE_SETTLE_BEATS`` heartbeat intervals since the LEAVE (a START the leader sent before it
   read the leaving heartbeat arrives within that, and is finished too): the runner then stops.

Partitions are paused only when they leave every txn (dropped, failed, fenced, or not part of
a START), never at END.

Messages of a lower epoch than the highest seen, messages for txns this task is not part of,
and other participants' messages are ignored. A START that names another copy of this
participant (another ``sender``) as a partition's holder fences this copy out of that partition
for the txn: it stands down (pauses) and waits for a START that names it. A task that starts
mid-txn (a restart) sees no START for it and so takes no part; it joins at the next START that
gives its partitions explicit offsets (a chained START's ``CONTINUE`` can only be followed by the
copy that cut the txn before). A heartbeat goes out every ``heartbeat_interval_s``, with the
copy's figures as the runner counts them (``figures``: rows read, chunks staged, inserts, retries).

A chunk that fails to stage (``ChunkStaged.error``) fails its partition for the txn: the
partition is paused and its records are no longer staged; at END its WRITE-STATUS carries the
error, so the coordinator aborts and the records are read again in a later txn.

This module holds the txns the task is part of, the control messages and the heartbeat; the
partitions and what is read into them (steps 2 and 3's WRITE-STATUS) are
``protocol.participant.partitions``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from protocol.messages import (
    Abort,
    AckCommit,
    EndCommit,
    Heartbeat,
    Leave,
    ParticipantFigures,
    StartCommit,
    TopicPartition,
)
from protocol.participant.events import (
    Action,
    ChunkStaged,
    CommitOffsets,
    DropTxn,
    Event,
    PartitionFailed,
    Polled,
    ReadToEnd,
    Received,
    Send,
    Tick,
)
from protocol.participant.partitions import Partitions
from protocol.participant.stint import Partition, Status

__all__ = ["MAX_UNACKED", "ParticipantState", "Status"]  # Status: re-exported, it lived here

log = logging.getLogger(__name__)

#: Ended txns awaiting ACK-COMMIT remembered at most (older ones are forgotten, not failed).
MAX_UNACKED = 16
#: Heartbeat intervals a leaving task that owes nothing still listens after the LEAVE (participant step 6).
LEAVE_SETTLE_BEATS = 2


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
        shard_count: int = 0,
        job: str = "",
        figures: Callable[[], ParticipantFigures | None] = lambda: None,
    ) -> None:
        """``shard_count``: the shards this participant places partitions on
        (``PipelineConfig.placed_count``); a START that places them over another count is not staged."""
        self.pipeline, self.sender = pipeline, sender
        self.job = job  # the participant job this task belongs to ("": none, it never leaves)
        self.figures = figures  # what the copy did so far, for each heartbeat (the runner counts it)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.partitions = Partitions(
            partitions,
            pipeline=pipeline,
            sender=sender,
            chunk_rows=chunk_rows,
            chunk_bytes=chunk_bytes,
            size_trigger_rows=size_trigger_rows,
            shard_count=shard_count,
        )
        self.epoch = 0  # highest epoch seen
        self.current = ""  # the txn of the latest START this task took part in
        self.current_epoch = 0
        self.current_open = False  # START seen, neither ended nor dropped
        self.unacked: dict[str, int] = {}  # txn -> epoch: ended here, oldest first, awaiting ACK
        self.next_heartbeat = float("-inf")
        self.log_ends: dict[TopicPartition, int] = {}
        self.leaving = False  # its job was stopped (participant step 6)
        self.leave_at = 0.0  # when the LEAVE was read

    # ---- queries (read-only, for the runner) ----------------------------------------------

    @property
    def parts(self) -> dict[tuple[str, int], Partition]:
        """The partitions this task holds, by (topic, partition)."""
        return self.partitions.parts

    @property
    def consuming(self) -> bool:
        """True when some partition is being read into a txn and has room left in it (the runner
        should poll data). A partition has read its fill at ``size_trigger.full_rows`` of its share:
        reading waits for END, so a txn ended by the trigger stays within ``SIZE_SLACK`` of it (to a
        poll batch)."""
        return self.partitions.consuming

    @property
    def insert_backlog_rows(self) -> int:
        """One chunk per partition being read, at its txn's chunk size (``chunk_rows``, or the
        START's when lower): how many rows cut and not yet staged the runner allows by default, so
        that what is left to insert at END is about one chunk per partition. 0 when none is read."""
        return self.partitions.insert_backlog_rows

    def heartbeat_due(self, now: float) -> bool:
        return now >= self.next_heartbeat

    def left(self, now: float) -> bool:
        """Participant step 6 is done: leaving, nothing owed (no txn read into or awaiting chunks), and
        ``LEAVE_SETTLE_BEATS`` heartbeat intervals listened since the LEAVE. The runner may stop."""
        settled = now - self.leave_at >= LEAVE_SETTLE_BEATS * self.heartbeat_interval_s
        return self.leaving and settled and not self.partitions.owed

    # ---- events ---------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Take ``event`` at ``now``; the actions to carry out, in order."""
        handler = self._HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"ParticipantState has no handler for {type(event).__name__} (not a participant event)")
        return handler(self, event, now)

    def _on_polled(self, event: Polled, now: float) -> list[Action]:
        actions = self.partitions.read(event.records)
        if self.partitions.report_now:  # Participant step 2: a share of the size trigger was crossed
            actions += self._heartbeat(now)
        return actions

    def _on_read_to_end(self, event: ReadToEnd, now: float) -> list[Action]:
        self.partitions.read_to_end(event)
        return []

    def _on_received(self, event: Received, now: float) -> list[Action]:
        m = event.message
        if isinstance(m, Leave):  # the job's driver, not a coordinator: no epoch to check
            return self._on_leave(m, now)
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
        return actions + self.partitions.start(m, cuts)

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
        actions, cuts = self.partitions.end(m.txn)
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

    def _on_leave(self, m: Leave, now: float) -> list[Action]:
        """Participant step 6: LEAVE of this task's job. Say so at once; finish what it is in."""
        if m.pipeline != self.pipeline or not self.job or m.job != self.job or self.leaving:
            return []
        owed = sorted(self.partitions.owed)
        log.warning("participant %s leaves: its job %s was stopped; finishing %s", self.sender, m.job, owed)
        self.leaving, self.leave_at = True, now
        return self._heartbeat(now)

    def _drop(self, txns: list[str]) -> list[Action]:
        actions: list[Action] = [DropTxn(t) for t in txns]
        for txn in txns:
            self.unacked.pop(txn, None)
        if self.current in txns:
            self.current_open = False
        return actions + self.partitions.drop(txns)

    def _on_staged(self, e: ChunkStaged, now: float) -> list[Action]:
        """A chunk's outcome: an error fails its partition for the txn; the last chunk of an ended txn
        sends its WRITE-STATUS (participant step 3)."""
        return self.partitions.staged(e)

    def _on_partition_failed(self, e: PartitionFailed, now: float) -> list[Action]:
        return self.partitions.failed(e)

    #: The handler of each event type, taken by ``handle``.
    _HANDLERS: ClassVar[dict[type, Callable[[Any, Any, float], list[Action]]]] = {
        Polled: _on_polled,
        ReadToEnd: _on_read_to_end,
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

    # ---- helpers --------------------------------------------------------------------------

    def _heartbeat(self, now: float) -> list[Action]:
        self.next_heartbeat = now + self.heartbeat_interval_s
        self.partitions.report_now = False
        in_txn = self.current if self.current_open else ""
        positions = self.partitions.positions(in_txn, self.log_ends)
        return [
            Send(
                Heartbeat(
                    pipeline=self.pipeline,
                    epoch=self.epoch,
                    txn=in_txn,
                    sender=self.sender,
                    partitions=positions,
                    continues=True,
                    leaving=self.leaving,
                    figures=self.figures(),
                )
            )
        ]
