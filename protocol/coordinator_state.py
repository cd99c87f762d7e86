"""The coordinator's state machine: ``handle(event, now) -> [actions]``, no I/O.

One transaction, as the leader of ``epoch`` runs it (docs/architecture.md §4); the code calls
these "commit step N":

1. Read the ledger head (the runner does, then feeds ``Ready``): the last committed offset of
   every partition is the source of truth.
2. Create the stage table ``<target>__chtxn_<pipeline>__<txn>`` one txn ahead (``CreateStage``,
   answered by ``StageCreated``): a txn starts on a stage table that already exists.
3. Broadcast START; after ``interval_s``, or once heartbeats report ``size_trigger_rows`` staged,
   broadcast END.
4. Collect one WRITE-STATUS per partition. On timeout, or as soon as heartbeats show a
   participant of the txn is gone, ABORT: drop the stage table, append ABORTED; the next txn
   starts from the ledger head. A holder whose heartbeats still name the txn ``RESEND_END_S``
   after its END (it never read it) gets the same END again, at most once per ``RESEND_END_S``.
5. Verify: ``count()`` of the stage table equals the rows reported (and, with the metadata
   columns, each partition's rows and offsets match its WRITE-STATUS), the target's structure
   still matches the stage table's, and every partition's start equals the ledger head. A
   mismatch aborts.
6. Commit point: append COMMITTED claiming ``commit_seq = head + 1`` by compare-and-set. Losing
   it means another leader exists: step down.
7. Broadcast ACK-COMMIT, then publish (move the stage table into the target), append PUBLISHED.
   Publishes happen strictly in commit order: a failed publish of k holds back k+1.
8. An idle interval still commits (an empty commit).

Fencing: START names one holder (participant id) per partition, preferring the previous holder
while it heartbeats. Only the holder's WRITE-STATUS counts and only its silence aborts the txn;
another live copy of the same participant stands down.

Continuous txns: the END of txn k carries the START of k+1 (``EndCommit.next``) when every
holder of k heartbeats ``continues`` and keeps its partitions, and the next stage table is ready.
Participants cut k where they are and read on into k+1 without stopping; k+1's start of each
partition is ``CONTINUE`` until k's WRITE-STATUS gives it. Otherwise (older participants, a
change of holder, no stage table yet, shutting down) END goes alone and the next START waits for
k's WRITE-STATUS set and starts from the end offsets it reported. Either way, if k aborts, every
txn after it aborts too, and the next START re-reads from the ledger head (explicit offsets).
A txn ends only when every older txn is committed, so at most two are uncommitted at once and
commits happen strictly in txn order; while k commits, k+1 goes on reading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol import coordinator_invariants, naming, size_trigger
from protocol.chunk_sizing import ChunkSizer
from protocol.coordinator_events import (
    AbortKind,
    AbortTxn,
    Action,
    Broadcast,
    Commit,
    CommitResult,
    Counted,
    CountStage,
    CreateStage,
    DropStage,
    Event,
    GapFound,
    Offsets,
    PartitionsChanged,
    PartitionStats,
    Phase,
    Publish,
    PublishResult,
    Ready,
    Received,
    RecordStarted,
    Shutdown,
    StageCreated,
    StepDown,
    Stopped,
    Tick,
    Txn,
)
from protocol.errors import InvalidTransition
from protocol.leadership import COORDINATOR_KINDS
from protocol.messages import (
    CONTINUE,
    Abort,
    AckCommit,
    EndCommit,
    Heartbeat,
    PartitionHolder,
    PartitionOffset,
    StartCommit,
    TopicPartition,
    WriteStatus,
)

log = logging.getLogger(__name__)

#: An END's holder that still names its txn in heartbeats this long after it gets the END again.
RESEND_END_S = 1.0
_OPEN = (Phase.COLLECTING, Phase.ENDING)
_UNCOMMITTED = (Phase.COLLECTING, Phase.ENDING, Phase.COMPLETE, Phase.VERIFYING, Phase.COMMITTING)


@dataclass(frozen=True)
class Timing:
    interval_s: float = 1.0
    size_trigger_rows: int = 1_000_000
    write_status_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 3.0
    publish_retry_s: float = 1.0


@dataclass
class _Liveness:
    sender: str
    seen_at: float
    txn: str = ""
    buffered_rows: int = 0
    log_end: int = -1  # the partition's end as the participant last saw it (-1: unknown)
    continues: bool = False  # understands a START chained to an END
    position: int = -1  # next offset the participant reads (-1: unknown)


@dataclass
class _Spare:
    """The next txn's stage table, created ahead of its START."""

    txn: str
    stage_table: str
    ready: bool = False


class CoordinatorState:
    """The leader's view of its transactions. Construct on winning an epoch; feed ``Ready`` first."""

    def __init__(self, *, pipeline: str, epoch: int, coordinator: str, target: str, timing: Timing) -> None:
        self.pipeline = pipeline
        self.epoch = epoch
        self.coordinator = coordinator
        self.target = target
        self.timing = timing
        self.ready = False
        self.stepped_down = False
        self.stopping = False
        self.head_seq = 0
        self.head: Offsets = {}
        self.initial: Offsets = {}
        self.partitions: tuple[TopicPartition, ...] = ()
        self.txns: list[Txn] = []  # uncommitted and unpublished txns, oldest first
        self.alive: dict[TopicPartition, dict[str, _Liveness]] = {}  # per partition, per participant copy
        self.holders: dict[TopicPartition, str] = {}  # who staged each partition in the latest START
        self.ignored = 0  # stale-epoch and foreign messages skipped
        self.spare: _Spare | None = None
        self.sizer = ChunkSizer(interval_s=timing.interval_s, size_trigger_rows=timing.size_trigger_rows)
        self._spare_not_before = 0.0
        self._next_seq = 1

    # ---- public -----------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Take ``event`` at ``now``; the actions to carry out, in order. Nothing once stepped down."""
        if self.stepped_down:
            return []
        handler = self._HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"CoordinatorState has no handler for {type(event).__name__} (not a coordinator event)")
        actions = handler(self, event, now)
        if not self.stepped_down:
            actions += self._advance(now, judge_silence=isinstance(event, Tick))
        return actions

    def validate(self) -> None:
        """Raise ``InvalidTransition`` unless the invariants the module docstring promises hold
        (``protocol.coordinator_invariants``). O(txns x partitions): for tests, not the hot path."""
        coordinator_invariants.check(self)

    def txn(self, txn_id: str) -> Txn | None:
        return next((t for t in self.txns if t.id == txn_id), None)

    @property
    def open_txn(self) -> Txn | None:
        return next((t for t in self.txns if t.phase in _OPEN), None)

    def lag(self) -> dict[TopicPartition, int]:
        """Per partition: log end (from heartbeats) minus the last committed offset."""
        lags = {}
        for tp, copies in self.alive.items():
            live = max(copies.values(), key=lambda c: c.seen_at)
            if live.log_end >= 0 and tp in self.partitions:
                lags[tp] = max(0, live.log_end - self.base(tp))
        return lags

    def live_partitions(self, now: float) -> set[TopicPartition]:
        return {tp for tp in self.alive if self._live_copies(tp, now)}

    def _live_copies(self, tp: TopicPartition, now: float) -> dict[str, _Liveness]:
        limit = self.timing.heartbeat_timeout_s
        return {s: c for s, c in self.alive.get(tp, {}).items() if now - c.seen_at <= limit}

    def _holder(self, tp: TopicPartition) -> str:
        """The copy to stage ``tp``: the previous holder while it heartbeats as recently as the
        freshest copy (within the heartbeat timeout), else the freshest copy. Judged between the
        copies only, never against the clock, so a leader's own stall never leaves a partition
        without a holder."""
        copies = self.alive.get(tp, {})
        if not copies:
            return ""
        freshest = max(copies.values(), key=lambda c: c.seen_at)
        previous = copies.get(self.holders.get(tp, ""))
        if previous is not None and freshest.seen_at - previous.seen_at <= self.timing.heartbeat_timeout_s:
            return previous.sender
        return freshest.sender

    # ---- events -----------------------------------------------------------------------

    def _on_gap_found(self, event: GapFound, now: float) -> list[Action]:
        """Offsets below ``event.offset`` are gone: the partition goes on from there (``on_gap = skip``).
        Txns that started below it fail their start check and abort."""
        self.initial[event.tp] = max(self.initial.get(event.tp, 0), event.offset)
        return []

    def _on_ready(self, event: Ready, now: float) -> list[Action]:
        self.ready = True
        self.head_seq = event.head_seq
        self.head = dict(event.head)
        self.initial = dict(event.initial)
        self.partitions = tuple(sorted(set(event.head) | set(event.initial)))
        return []

    def _on_partitions_changed(self, event: PartitionsChanged, now: float) -> list[Action]:
        self.partitions = tuple(sorted(event.partitions))
        # A partition's initial offset is fixed once known: a START may already have gone out from it.
        self.initial.update(
            {tp: o for tp, o in event.initial.items() if tp not in self.head and tp not in self.initial}
        )
        return []

    def _on_tick(self, event: Tick, now: float) -> list[Action]:
        return []  # ``handle`` advances every txn after each event, judging silence on Tick

    def _on_shutdown(self, event: Shutdown, now: float) -> list[Action]:
        self.stopping = True
        actions: list[Action] = []
        for txn in [t for t in self.txns if t.phase in _OPEN or t.phase is Phase.COMPLETE]:
            if txn in self.txns:
                actions += self._abort(txn, "coordinator shutting down", now, AbortKind.SHUTDOWN)
        return actions + self._drop_spare()

    def _on_received(self, event: Received, now: float) -> list[Action]:
        msg = event.message
        if msg.pipeline != self.pipeline:
            self.ignored += 1
            return []
        if isinstance(msg, Heartbeat):
            return self._on_heartbeat(msg, now)
        kind = type(msg).__struct_config__.tag
        if kind in COORDINATOR_KINDS:
            if msg.epoch > self.epoch:
                return self._step_down(f"a coordinator of a newer epoch ({msg.epoch} > {self.epoch}) is sending")
            return []
        if isinstance(msg, WriteStatus):
            return self._on_write_status(msg, now)
        self.ignored += 1
        return []

    def _on_heartbeat(self, msg: Heartbeat, now: float) -> list[Action]:
        forget = now - 10 * self.timing.heartbeat_timeout_s
        collecting = next((t for t in self.txns if t.phase is Phase.COLLECTING), None)
        for pos in msg.partitions:
            copies = self.alive.setdefault(pos.tp, {})
            copies[msg.sender] = _Liveness(
                msg.sender, now, msg.txn, pos.buffered_rows, pos.log_end, msg.continues, pos.position
            )
            if collecting is not None and collecting.holders.get(pos.tp) == msg.sender:
                rows = pos.buffered_rows if msg.txn == collecting.id else 0  # rows of another txn do not count
                collecting.buffered_rows += rows - collecting.buffered.get(pos.tp, 0)
                collecting.buffered[pos.tp] = rows
            for sender in [s for s, c in copies.items() if c.seen_at < forget]:
                del copies[sender]
        return []

    def _on_write_status(self, ws: WriteStatus, now: float) -> list[Action]:
        txn = self.txn(ws.txn)
        if ws.epoch != self.epoch or txn is None or txn.phase not in (Phase.COLLECTING, Phase.ENDING):
            self.ignored += 1  # stale epoch, another txn, or one already decided
            return []
        if ws.tp not in txn.start or (ws.tp in txn.holders and ws.sender != txn.holders[ws.tp]):
            self.ignored += 1  # not in this txn, or a fenced copy of the participant
            return []
        if ws.start_offset != txn.start[ws.tp]:
            why = f"{ws.topic}-{ws.partition} staged from {ws.start_offset}, START said {txn.start[ws.tp]}"
            return self._abort(txn, why, now, AbortKind.OFFSET_MISMATCH)
        if ws.errors:
            why = f"{ws.topic}-{ws.partition} failed: {'; '.join(ws.errors)}"
            return self._abort(txn, why, now, AbortKind.PARTICIPANT_ERROR)
        if ws.end_offset < ws.start_offset:
            why = f"{ws.topic}-{ws.partition} reported end {ws.end_offset} before start {ws.start_offset}"
            return self._abort(txn, why, now, AbortKind.OFFSET_MISMATCH)
        if ws.tp in txn.statuses:
            return []  # a repeated WRITE-STATUS (e.g. from a restarted participant) changes nothing
        txn.statuses[ws.tp] = ws
        for later in self.txns:  # the txn chained to this one continues from where this one ended
            if later.chained and later.after == txn.id and later.start.get(ws.tp) == CONTINUE:
                later.start[ws.tp] = ws.end_offset
        if txn.phase is Phase.ENDING and txn.complete:
            self._completed(txn, now)
        return []

    def _on_stage_created(self, event: StageCreated, now: float) -> list[Action]:
        spare = self.spare
        if spare is None or spare.txn != event.txn:
            return []  # a spare dropped (shutdown, target altered) while the runner was creating it
        if not event.ok:  # the runner logged why; try again a little later
            self.spare = None
            self._spare_not_before = now + self.timing.publish_retry_s
            return []
        spare.ready = True
        return []

    def _on_counted(self, event: Counted, now: float) -> list[Action]:
        txn = self._expect(event, Phase.VERIFYING)
        if txn is None:
            return []
        if event.count is None:
            return self._abort(txn, f"could not count the stage table: {event.error}", now, AbortKind.COUNT_FAILED)
        if event.altered:  # the spare was made like the old target too
            why = (
                f"the target table changed after the stage table was made ({event.altered}); "
                "the next txn stages in the new structure"
            )
            return self._abort(txn, why, now, AbortKind.TARGET_ALTERED) + self._drop_spare()
        if event.count != txn.rows:
            why = f"row-count mismatch: stage table holds {event.count}, participants reported {txn.rows}"
            return self._abort(txn, why, now, AbortKind.ROW_COUNT_MISMATCH)
        wrong = self._partition_mismatch(txn, event.partitions)
        if wrong:
            return self._abort(txn, f"row-count mismatch: {wrong}", now, AbortKind.ROW_COUNT_MISMATCH)
        stale = {tp: o for tp, o in txn.start.items() if o != self.base(tp)}
        if stale:
            tp, o = next(iter(sorted(stale.items())))
            why = f"{tp.topic}-{tp.partition} started at {o}, ledger head is {self.base(tp)}"
            return self._abort(txn, why, now, AbortKind.OFFSET_MISMATCH)
        # Commit step 6: the commit point.
        txn.phase = Phase.COMMITTING
        txn.commit_seq = self.head_seq + 1
        return [Commit(txn, txn.commit_seq)]

    def _on_commit_result(self, event: CommitResult, now: float) -> list[Action]:
        txn = self._expect(event, Phase.COMMITTING)
        if txn is None:
            return []
        if event.won is None:
            return self._step_down(f"commit outcome of {txn.id} unknown ({event.error}); re-reading the ledger")
        if not event.won:
            return self._step_down(f"lost commit slot {txn.commit_seq} of {txn.id} to another leader")
        self.head_seq = txn.commit_seq
        self.head.update(txn.end)
        # Commit step 7: ACK-COMMIT, then publish (``_advance`` publishes in commit order).
        txn.phase = Phase.PUBLISHING
        offsets = tuple(
            PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in sorted(txn.end.items())
        )
        ack = AckCommit(**self._envelope(txn.id), offsets=offsets, commit_seq=txn.commit_seq)
        return [Broadcast(ack)]

    def _on_publish_result(self, event: PublishResult, now: float) -> list[Action]:
        txn = self._expect(event, Phase.PUBLISHING)
        if txn is None:
            return []
        txn.publish_in_flight = False
        if event.ok:
            self.txns.remove(txn)
        else:
            txn.publish_not_before = now + self.timing.publish_retry_s
        return []

    def _expect(self, event: Counted | CommitResult | PublishResult, phase: Phase) -> Txn | None:
        """The txn an outcome of the runner's own action is for, or None when that txn is gone (a
        cascade abort or a step-down dropped it while the runner worked: the answer is moot). The
        runner answers each action once, and nothing but that answer moves a txn out of ``phase``:
        a txn still here in another phase is a programming error."""
        txn = self.txn(event.txn)
        if txn is not None and txn.phase is not phase:
            raise InvalidTransition(
                f"{type(event).__name__} for {event.txn}: expected the txn {phase.value}, found {txn.phase.value}"
            )
        return txn

    #: The handler of each event type, taken by ``handle``.
    _HANDLERS: ClassVar[dict[type, Callable[[Any, Any, float], list[Action]]]] = {
        Ready: _on_ready,
        PartitionsChanged: _on_partitions_changed,
        GapFound: _on_gap_found,
        Tick: _on_tick,
        Received: _on_received,
        StageCreated: _on_stage_created,
        Counted: _on_counted,
        CommitResult: _on_commit_result,
        PublishResult: _on_publish_result,
        Shutdown: _on_shutdown,
    }

    # ---- the driver of every commit step ----------------------------------------------

    def _advance(self, now: float, judge_silence: bool = False) -> list[Action]:
        actions: list[Action] = []
        t = self.timing
        for txn in list(self.txns):
            if txn not in self.txns:
                continue  # aborted by a cascade in this loop
            if txn.phase is Phase.COLLECTING and self._end_due(txn, now):
                actions += self._end(txn, now)
            if txn.phase in (Phase.COLLECTING, Phase.ENDING):
                dead = self._dead_participants(txn, now, judge_silence)
                if dead:
                    why = f"participant of {dead} stopped sending heartbeats"
                    actions += self._abort(txn, why, now, AbortKind.PARTICIPANT_DEAD)
                    continue
            if txn.phase is Phase.ENDING and txn.end_message is not None and (unaware := self._missed_end(txn)):
                log.warning(
                    "%s still reads %s %.1f s after its END: sending the END again", unaware, txn.id, now - txn.ended_at
                )
                txn.end_sent_at = now
                actions.append(Broadcast(txn.end_message))
            if txn.phase is Phase.ENDING and now - txn.ended_at > t.write_status_timeout_s:
                missing = ", ".join(f"{tp.topic}-{tp.partition}" for tp in txn.missing)
                why = f"write-status timeout: nothing from {missing}"
                actions += self._abort(txn, why, now, AbortKind.WRITE_STATUS_TIMEOUT)
                continue
            if txn.phase is Phase.COMPLETE and self._is_oldest_uncommitted(txn):
                txn.phase = Phase.VERIFYING  # Commit step 5
                actions.append(CountStage(txn.id, txn.stage_table))
            if (
                txn.phase is Phase.PUBLISHING
                and not txn.publish_in_flight
                and now >= txn.publish_not_before
                and self._is_oldest_publishing(txn)
            ):
                txn.publish_not_before = 0.0
                txn.publish_in_flight = True
                actions.append(Publish(txn))
        actions += self._maybe_start(now)
        actions += self._prepare_spare(now)
        if self.stopping and not self.txns:
            actions.append(Stopped())
        return actions

    def _end_due(self, txn: Txn, now: float) -> bool:
        """Commit step 3's END: the interval passed, the size trigger is reached or one partition is full
        (``protocol.size_trigger``), and every older txn is committed (participants go on reading
        meanwhile); at once when shutting down."""
        if self.stopping:
            return True
        if any(t.phase in _UNCOMMITTED for t in self.txns[: self.txns.index(txn)]):
            return False
        trigger = self.timing.size_trigger_rows
        full = size_trigger.full_rows(size_trigger.share(trigger, len(txn.start)))
        return (
            now - txn.started_at >= self.timing.interval_s
            or txn.buffered_rows >= trigger
            or (full > 0 and any(rows >= full for rows in txn.buffered.values()))
        )

    def _end(self, txn: Txn, now: float) -> list[Action]:
        txn.phase = Phase.ENDING
        txn.ended_at = now
        nxt = self._chain(txn, now)
        txn.end_message = EndCommit(**self._envelope(txn.id), next=None if nxt is None else self._start_message(nxt))
        txn.end_sent_at = now
        actions: list[Action] = [Broadcast(txn.end_message)]
        if nxt is not None:
            actions.append(RecordStarted(nxt))
        if txn.complete:
            self._completed(txn, now)
        return actions

    def _missed_end(self, txn: Txn) -> str:
        """A partition whose holder heartbeated, ``RESEND_END_S`` after the END was last sent, that
        it still reads ``txn``: it never read the END (a holder that read an END carrying the next
        START names the next txn at once). "" when there is none, or the END carried no START."""
        if txn.end_message is None or txn.end_message.next is None:
            return ""
        for tp in txn.missing:
            copy = self.alive.get(tp, {}).get(txn.holders.get(tp, ""))
            if (
                copy is not None
                and copy.continues
                and copy.txn == txn.id
                and copy.seen_at - txn.end_sent_at >= RESEND_END_S
            ):
                return f"the holder of {tp.topic}-{tp.partition} ({copy.sender})"
        return ""

    def _completed(self, txn: Txn, now: float) -> None:
        """Every WRITE-STATUS of an ended txn is in: commit step 5 may begin."""
        txn.phase, txn.complete_at = Phase.COMPLETE, now
        self.sizer.learn({tp: ws.rows for tp, ws in txn.statuses.items()}, txn.ended_at - txn.started_at)

    def _chain(self, txn: Txn, now: float) -> Txn | None:
        """The txn that starts with ``txn``'s END, or None when END must go alone."""
        if self.stopping or self.spare is None or not self.spare.ready or not self.partitions:
            return None
        if not set(self.partitions) <= self.live_partitions(now):
            return None
        holders = {tp: self._holder(tp) for tp in self.partitions}
        for tp in self.partitions:
            live = self.alive.get(tp, {}).get(holders[tp])
            if live is None or not live.continues:
                return None  # an older participant would not see a START inside an END
            if tp in txn.start and holders[tp] != txn.holders.get(tp):
                return None  # a new holder cannot continue what another one cut
        start = {tp: CONTINUE if tp in txn.start else self.base(tp) for tp in self.partitions}
        nxt = self._take_spare(start, txn, now)
        nxt.chained = True
        nxt.holders = holders
        self.holders.update(holders)
        return nxt

    def _maybe_start(self, now: float) -> list[Action]:
        """A START on its own: the first txn, after an abort, or after an END that went alone."""
        if not self.ready or self.stopping or self.open_txn is not None or not self.partitions:
            return []
        if self.spare is None or not self.spare.ready:
            return []
        uncommitted = [t for t in self.txns if t.phase in (Phase.COMPLETE, Phase.VERIFYING, Phase.COMMITTING)]
        if len(uncommitted) > 1:
            return []
        if not set(self.partitions) <= self.live_partitions(now):
            return []  # Commit step 3 needs every participant: START only when all partitions are held
        previous = uncommitted[-1] if uncommitted else None
        start = {tp: self.base(tp) for tp in self.partitions}
        if previous is not None:
            start.update(previous.end)
        txn = self._take_spare(start, previous, now)
        txn.holders = {tp: holder for tp in txn.start if (holder := self._holder(tp))}
        self.holders.update(txn.holders)
        return [Broadcast(self._start_message(txn)), RecordStarted(txn)]

    def _take_spare(self, start: Offsets, previous: Txn | None, now: float) -> Txn:
        spare = self.spare
        assert spare is not None and spare.ready
        self.spare = None
        txn = Txn(spare.txn, spare.stage_table, start, now, after=previous.id if previous else None)
        txn.started_at = now
        self.txns.append(txn)
        return txn

    def _start_message(self, txn: Txn) -> StartCommit:
        offsets = tuple(
            PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in sorted(txn.start.items())
        )
        holders = tuple(
            PartitionHolder(topic=tp.topic, partition=tp.partition, sender=s) for tp, s in sorted(txn.holders.items())
        )
        behind = {
            tp: c.log_end - c.position
            for tp, copies in self.alive.items()
            if tp in txn.start
            for c in copies.values()
            if c.sender == txn.holders.get(tp) and c.log_end >= 0 and c.position >= 0
        }
        return StartCommit(
            **self._envelope(txn.id),
            stage_table=txn.stage_table,
            offsets=offsets,
            holders=holders,
            chunk_rows=self.sizer.chunk_rows(behind),
        )

    def _prepare_spare(self, now: float) -> list[Action]:
        """Commit step 2, one txn ahead: the next txn's stage table."""
        if (
            self.spare is not None
            or not self.ready
            or self.stopping
            or not self.partitions
            or now < self._spare_not_before
        ):
            return []
        txn_id = naming.txn_id(self.epoch, self._next_seq)
        self._next_seq += 1
        self.spare = _Spare(txn_id, naming.stage_table(self.target, self.pipeline, txn_id))
        return [CreateStage(self.spare.txn, self.spare.stage_table)]

    def _drop_spare(self) -> list[Action]:
        spare, self.spare = self.spare, None
        return [DropStage(spare.txn, spare.stage_table)] if spare is not None else []

    # ---- helpers ----------------------------------------------------------------------

    def _abort(self, txn: Txn, reason: str, now: float, kind: AbortKind) -> list[Action]:
        """Commit step 4's ABORT, cascading to every txn pipelined after this one."""
        actions: list[Action] = []
        doomed = [txn] + [t for t in self.txns if self._follows(t, txn)]
        for victim in doomed:
            why, why_kind = (
                (reason, kind) if victim is txn else (f"cascade: {txn.id} aborted ({reason})", AbortKind.CASCADE)
            )
            actions.append(Broadcast(Abort(**self._envelope(victim.id), reason=why)))
            actions.append(AbortTxn(victim, why, why_kind))
            self.txns.remove(victim)
        return actions

    def _follows(self, later: Txn, earlier: Txn) -> bool:
        after = later.after
        while after is not None:
            if after == earlier.id:
                return True
            parent = self.txn(after)
            after = parent.after if parent else None
        return False

    def _dead_participants(self, txn: Txn, now: float, judge_silence: bool) -> str:
        """Partitions still owing a WRITE-STATUS whose holder is silent (judged only on ``Tick``,
        right after the runner read the control topic). Other copies of a participant, alive or
        not, do not count: only the holder named in START stages the partition."""
        if not judge_silence:
            return ""
        limit = self.timing.heartbeat_timeout_s
        gone = [
            tp
            for tp in txn.start
            if tp not in txn.statuses
            and ((c := self.alive.get(tp, {}).get(txn.holders.get(tp, ""))) is None or now - c.seen_at > limit)
        ]
        return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(gone))

    def _partition_mismatch(self, txn: Txn, stats: dict[TopicPartition, PartitionStats] | None) -> str:
        """How the stage table's rows of each partition differ from its WRITE-STATUS ("" if they agree)."""
        if stats is None:
            return ""
        for tp in sorted(set(stats) | set(txn.statuses)):
            ws = txn.statuses.get(tp)
            got = stats.get(tp)
            rows = ws.rows if ws else 0
            if (got.rows if got else 0) != rows:
                return f"{tp.topic}-{tp.partition}: stage table holds {got.rows if got else 0} rows, its participant reported {rows}"
            if got and ws and not (ws.start_offset <= got.min_offset and got.max_offset < ws.end_offset):
                return (
                    f"{tp.topic}-{tp.partition}: stage table holds offsets {got.min_offset}..{got.max_offset}, "
                    f"outside the reported [{ws.start_offset}, {ws.end_offset})"
                )
        return ""

    def _is_oldest_publishing(self, txn: Txn) -> bool:
        return next((t for t in self.txns if t.phase is Phase.PUBLISHING), None) is txn

    def _is_oldest_uncommitted(self, txn: Txn) -> bool:
        for t in self.txns:
            if t is txn:
                return True
            if t.phase is not Phase.PUBLISHING:
                return False
        return False

    def base(self, tp: TopicPartition) -> int:
        """Where ``tp``'s next txn must start: its last committed end, or a later floor (its initial
        offset when never committed, or where a skipped gap ended)."""
        return max(self.head.get(tp, 0), self.initial.get(tp, 0))

    def _step_down(self, reason: str) -> list[Action]:
        self.stepped_down = True
        return [StepDown(reason)]

    def _envelope(self, txn: str) -> dict:
        return {"pipeline": self.pipeline, "epoch": self.epoch, "txn": txn, "sender": self.coordinator}
