"""The leader's txns in flight and the driver of every commit step (``protocol.coordinator.state``). Pure.

``CoordinatorState`` owns one ``Flight`` and calls ``advance`` after every event: it ends a txn
when its END is due (at once when a holder leaves: its job was stopped), starts the next one
(alone, or carried by the END when every holder can continue; never on a leaving copy), aborts on a holder's silence or the WRITE-STATUS timeout (with the cascade), sends an
END again to a holder that missed it, and takes the oldest uncommitted txn to verify and the
oldest committed one to publish. It collects each WRITE-STATUS (commit step 4) and the rows the
holders report read (the size trigger). It reads the leader's epoch, ledger head and whether it
stops through ``Leader``; the commit point and the ledger head stay with ``CoordinatorState``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from protocol import shards as shard_rules, size_trigger
from protocol.coordinator.chunk_sizing import ChunkSizer
from protocol.coordinator.events import (
    AbortKind,
    AbortTxn,
    Action,
    Broadcast,
    CountStage,
    Offsets,
    Phase,
    Publish,
    RecordStarted,
    Stopped,
    Txn,
)
from protocol.coordinator.liveness import Liveness
from protocol.coordinator.outbox import Outbox
from protocol.coordinator.spare import StageAhead
from protocol.coordinator.txns import (
    OPEN,
    cascade,
    find,
    is_oldest_publishing,
    is_oldest_uncommitted,
    older_uncommitted,
)
from protocol.messages import CONTINUE, Heartbeat, StartCommit, TopicPartition, WriteStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    interval_s: float = 1.0
    #: A txn with nothing to read stays open past ``interval_s`` until records arrive, or this long (0: never).
    idle_interval_s: float = 0.0
    size_trigger_rows: int = 1_000_000
    write_status_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 3.0
    publish_retry_s: float = 1.0
    chunk_scale: int = 1  # ``PipelineConfig.chunk_scale``: the START's cap is that many times larger


class Leader(Protocol):
    """What the flight reads of its leader (``CoordinatorState``)."""

    @property
    def epoch(self) -> int: ...

    @property
    def ready(self) -> bool: ...  # the ledger head is read (commit step 1)

    @property
    def stopping(self) -> bool: ...

    @property
    def paused(self) -> bool: ...  # an operator paused the pipeline: no txn starts

    @property
    def partitions(self) -> tuple[TopicPartition, ...]: ...

    def base(self, tp: TopicPartition) -> int: ...


class Flight:
    """The leader's uncommitted and unpublished txns, oldest first, and what moves them on."""

    def __init__(
        self, leader: Leader, timing: Timing, *, liveness: Liveness, ahead: StageAhead, outbox: Outbox
    ) -> None:
        self.leader = leader
        self.timing = timing
        self.liveness = liveness
        self.ahead = ahead
        self.outbox = outbox
        self.sizer = ChunkSizer(
            interval_s=timing.interval_s, size_trigger_rows=timing.size_trigger_rows, scale=timing.chunk_scale
        )
        self.txns: list[Txn] = []

    def txn(self, txn_id: str) -> Txn | None:
        return find(self.txns, txn_id)

    @property
    def open_txn(self) -> Txn | None:
        return next((t for t in self.txns if t.phase in OPEN), None)

    # ---- what participants report ---------------------------------------------------

    def heard(self, msg: Heartbeat) -> None:
        """The rows each holder of the collecting txn read for it, as its heartbeat says (the size trigger)."""
        collecting = next((t for t in self.txns if t.phase is Phase.COLLECTING), None)
        if collecting is None:
            return
        for pos in msg.partitions:
            if collecting.holders.get(pos.tp) == msg.sender:
                rows = pos.buffered_rows if msg.txn == collecting.id else 0  # rows of another txn do not count
                collecting.buffered_rows += rows - collecting.buffered.get(pos.tp, 0)
                collecting.buffered[pos.tp] = rows

    def write_status(self, ws: WriteStatus, now: float) -> list[Action] | None:
        """Commit step 4: one WRITE-STATUS of a txn collecting them. None when it does not count."""
        txn = self.txn(ws.txn)
        if ws.epoch != self.leader.epoch or txn is None or txn.phase not in (Phase.COLLECTING, Phase.ENDING):
            return None  # stale epoch, another txn, or one already decided
        if ws.tp not in txn.start or (ws.tp in txn.holders and ws.sender != txn.holders[ws.tp]):
            return None  # not in this txn, or a fenced copy of the participant
        if ws.start_offset != txn.start[ws.tp]:
            why = f"{ws.topic}-{ws.partition} staged from {ws.start_offset}, START said {txn.start[ws.tp]}"
            return self.abort(txn, why, now, AbortKind.OFFSET_MISMATCH)
        if ws.errors:
            why = f"{ws.topic}-{ws.partition} failed: {'; '.join(ws.errors)}"
            return self.abort(txn, why, now, AbortKind.PARTICIPANT_ERROR)
        if ws.end_offset < ws.start_offset:
            why = f"{ws.topic}-{ws.partition} reported end {ws.end_offset} before start {ws.start_offset}"
            return self.abort(txn, why, now, AbortKind.OFFSET_MISMATCH)
        if ws.tp in txn.statuses:
            return []  # a repeated WRITE-STATUS (e.g. from a restarted participant) changes nothing
        txn.statuses[ws.tp] = ws
        for later in self.txns:  # the txn chained to this one continues from where this one ended
            if later.chained and later.after == txn.id and later.start.get(ws.tp) == CONTINUE:
                later.start[ws.tp] = ws.end_offset
        if txn.phase is Phase.ENDING and txn.complete:
            self._completed(txn, now)
        return []

    # ---- the driver of every commit step ----------------------------------------------

    def advance(self, now: float, judge_silence: bool = False) -> list[Action]:
        """Move every txn on, oldest first; then START, and ask for the next spare stage table."""
        actions: list[Action] = []
        t = self.timing
        for txn in list(self.txns):
            if txn not in self.txns:
                continue  # aborted by a cascade in this loop
            if txn.phase is Phase.COLLECTING and self.end_due(txn, now):
                if not self.awaits_spare(txn, now):
                    actions += self._end(txn, now)
                elif self.ahead.ready:
                    actions += self.ahead.drop()  # it misses where records wait: made anew below
            # A holder's silence is judged on ``Tick`` only, right after the runner read the control topic.
            if txn.phase in OPEN and judge_silence and (dead := self.liveness.silent(txn, now)):
                names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in dead)
                why = f"participant of {names} stopped sending heartbeats"
                actions += self.abort(txn, why, now, AbortKind.PARTICIPANT_DEAD)
                continue
            if txn.phase is Phase.ENDING and txn.end_message is not None and (unaware := self.liveness.missed_end(txn)):
                log.warning(
                    "%s still reads %s %.1f s after its END: sending the END again", unaware, txn.id, now - txn.ended_at
                )
                txn.end_sent_at = now
                actions.append(Broadcast(txn.end_message))
            if txn.phase is Phase.ENDING and now - txn.ended_at > t.write_status_timeout_s:
                missing = ", ".join(f"{tp.topic}-{tp.partition}" for tp in txn.missing)
                why = f"write-status timeout: nothing from {missing}"
                actions += self.abort(txn, why, now, AbortKind.WRITE_STATUS_TIMEOUT)
                continue
            if txn.phase is Phase.COMPLETE and is_oldest_uncommitted(self.txns, txn):
                txn.phase = Phase.VERIFYING  # Commit step 5
                actions.append(CountStage(txn.id, txn.stage_table, txn.shards))
            if (
                txn.phase is Phase.PUBLISHING
                and not txn.publish_in_flight
                and now >= txn.publish_not_before
                and is_oldest_publishing(self.txns, txn)
            ):
                txn.publish_not_before = 0.0
                txn.publish_in_flight = True
                actions.append(Publish(txn))
        actions += self.maybe_start(now)
        leader = self.leader
        if leader.ready and not leader.stopping and leader.partitions and self.ahead.wants(now):
            actions += self.ahead.prepare(now, *self._stages_due())  # commit step 2, one txn ahead
        if leader.stopping and not self.txns:
            actions.append(Stopped())
        return actions

    def end_due(self, txn: Txn, now: float) -> bool:
        """Commit step 3's END: the interval passed, the size trigger is reached, one partition is full
        (``protocol.size_trigger``) or a holder leaves (its job was stopped), and every older txn is
        committed (participants go on reading meanwhile); at once when shutting down or paused. A txn
        with nothing to read (``idle``) waits past the interval for its first record, up to
        ``idle_interval_s``; each time it waits, ``txn.idle_at`` notes when."""
        if self.leader.stopping or self.leader.paused:
            return True
        if older_uncommitted(self.txns, txn):
            return False
        trigger = self.timing.size_trigger_rows
        full = size_trigger.full_rows(size_trigger.share(trigger, len(txn.start)))
        if leaving := self.liveness.leaving(txn):
            names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in leaving)
            log.info("the holder of %s leaves: ending %s now", names, txn.id)
            return True
        if txn.buffered_rows >= trigger or (full > 0 and any(rows >= full for rows in txn.buffered.values())):
            return True
        age = now - txn.started_at
        if age < self.timing.interval_s:
            return False
        if age < self.timing.idle_interval_s and self.idle(txn):
            txn.idle_at = now  # what it reads from here on is what the chunk sizer learns from
            return False
        return True

    def idle(self, txn: Txn) -> bool:
        """Whether ending ``txn`` now would commit nothing: its holders read no row in it, it holds
        exactly the partitions the leader reads (a partition added or stopped since its START ends it
        as before, so the next START follows the change), and none of them may have records past its
        committed offset, as their freshest heartbeats tell (``Liveness.waiting``: a log end not known
        yet counts as records). Such a txn would move no offset (a WRITE-STATUS ends where the holder
        read to), so it stays open until records arrive: an idle pipeline commits once per
        ``idle_interval_s``, not once per interval."""
        partitions = self.leader.partitions
        return (
            not txn.buffered_rows
            and set(partitions) == set(txn.start)
            and not self.liveness.waiting(partitions, self.leader.base)
        )

    def awaits_spare(self, txn: Txn, now: float) -> bool:
        """Whether the due END of ``txn``, which read nothing (as its holders last said), waits within
        ``idle_interval_s`` of its START for a spare that is created and stages where records now wait
        (``Spare.misses``): its END then carries a START that reads them, not one that holds them for
        a txn more. Waiting costs it nothing; a txn that read rows ends at once, as when stopping."""
        leader = self.leader
        if leader.stopping or leader.paused or txn.buffered_rows or now - txn.started_at >= self.timing.idle_interval_s:
            return False
        staged_lazily = self.outbox.many or self.outbox.shard_count  # ``_stages_due``'s forms
        if not staged_lazily or set(leader.partitions) != set(txn.start) or self.liveness.leaving(txn):
            return False
        spare = self.ahead.spare
        return spare is None or not spare.ready or spare.misses(*self._stages_due())

    def _end(self, txn: Txn, now: float) -> list[Action]:
        txn.phase = Phase.ENDING
        txn.ended_at = now
        nxt = self._chain(txn, now)
        txn.end_message = self.outbox.end(txn, None if nxt is None else self._start_message(nxt))
        txn.end_sent_at = now
        actions: list[Action] = [Broadcast(txn.end_message)]
        if nxt is not None:
            actions.append(RecordStarted(nxt))
        if txn.complete:
            self._completed(txn, now)
        return actions

    def _completed(self, txn: Txn, now: float) -> None:
        """Every WRITE-STATUS of an ended txn is in: commit step 5 may begin."""
        txn.phase, txn.complete_at = Phase.COMPLETE, now
        read_from = max(txn.started_at, txn.idle_at)  # a txn kept open while idle read only since
        self.sizer.learn({tp: ws.rows for tp, ws in txn.statuses.items()}, txn.ended_at - read_from)

    def _chain(self, txn: Txn, now: float) -> Txn | None:
        """The txn that starts with ``txn``'s END, or None when END must go alone."""
        partitions = self.leader.partitions
        if self.leader.stopping or self.leader.paused or not self.ahead.ready or not partitions:
            return None
        if not set(partitions) <= self.liveness.live_partitions(now):
            return None
        holders = self.liveness.chained_holders(partitions, txn)
        if holders is None:
            return None
        start = {tp: CONTINUE if tp in txn.start else self.leader.base(tp) for tp in partitions}
        nxt = self._take_spare(start, txn, now)
        nxt.chained = True
        nxt.holders = holders
        self.liveness.hold(holders)
        return nxt

    def _stages_due(self) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None]:
        """The tables the next txn stages into, in route order (None: the one-table form's one table),
        and the shards it stages on (None: every shard): those with a partition its holder read past
        its committed offset, or whose log end is past it (or not known yet: ``Liveness.waiting``).
        A table none of whose records wait gets no stage table, nor does a shard no such partition is
        placed on (``protocol.shards.shard_of``), and their partitions stage nothing in the txn: an
        idle table or shard costs a txn no statement. Their first records wait for the txn after the
        one under way when they arrive, unless that one read nothing (``awaits_spare``)."""
        if not self.outbox.many and not self.outbox.shard_count:
            return None, None
        waiting = self.liveness.waiting(self.leader.partitions, self.leader.base)
        tables = None
        if self.outbox.many:
            due = set(self.outbox.tables_of({tp.topic for tp in waiting}).values())
            tables = tuple(table for table in self.outbox.tables if table in due)
        shards = None
        if count := self.outbox.shard_count:
            shards = tuple(sorted({shard_rules.shard_of(tp.topic, tp.partition, count) for tp in waiting}))
        return tables, shards

    def maybe_start(self, now: float) -> list[Action]:
        """A START on its own: the first txn, after an abort, or after an END that went alone."""
        leader = self.leader
        if not leader.ready or leader.stopping or leader.paused or self.open_txn is not None or not leader.partitions:
            return []
        if not self.ahead.ready:
            return []
        uncommitted = [t for t in self.txns if t.phase in (Phase.COMPLETE, Phase.VERIFYING, Phase.COMMITTING)]
        if len(uncommitted) > 1:
            return []
        if not set(leader.partitions) <= self.liveness.live_partitions(now):
            return []  # Commit step 3 needs every participant: START only when all partitions are held
        previous = uncommitted[-1] if uncommitted else None
        start = {tp: leader.base(tp) for tp in leader.partitions}
        if previous is not None:
            start.update(previous.end)
        txn = self._take_spare(start, previous, now)
        txn.holders = {tp: holder for tp in txn.start if (holder := self.liveness.holder(tp))}
        self.liveness.hold(txn.holders)
        return [Broadcast(self._start_message(txn)), RecordStarted(txn)]

    def _take_spare(self, start: Offsets, previous: Txn | None, now: float) -> Txn:
        spare = self.ahead.take()
        txn = Txn(
            spare.txn, spare.stage_table, start, now, after=previous.id if previous else None, shards=spare.shards
        )
        txn.started_at = now
        self.txns.append(txn)
        return txn

    def _start_message(self, txn: Txn) -> StartCommit:
        """START, with chunks sized to how far behind each holder reads (``protocol.coordinator.chunk_sizing``)."""
        return self.outbox.start(txn, self.sizer.chunk_rows(self.liveness.behind(txn)))

    def abort(self, txn: Txn, reason: str, now: float, kind: AbortKind) -> list[Action]:
        """Commit step 4's ABORT, cascading to every txn pipelined after this one."""
        actions: list[Action] = []
        for victim in cascade(self.txns, txn):
            why, why_kind = (
                (reason, kind) if victim is txn else (f"cascade: {txn.id} aborted ({reason})", AbortKind.CASCADE)
            )
            actions.append(Broadcast(self.outbox.abort(victim, why)))
            actions.append(AbortTxn(victim, why, why_kind))
            self.txns.remove(victim)
        return actions
