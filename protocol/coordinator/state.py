"""The coordinator's state machine: ``handle(event, now) -> [actions]``, no I/O.

One transaction, as the leader of ``epoch`` runs it (docs/architecture.md §4); the code calls
these "commit step N":

1. Read the ledger head (the runner does, then feeds ``Ready``): the last committed offset of
   every partition is the source of truth.
2. Create the stage table ``<target>__chtxn_<pipeline>__<txn>`` one txn ahead (``CreateStage``,
   answered by ``StageCreated``): a txn starts on a stage table that already exists.
3. Broadcast START; after ``interval_s``, or once heartbeats report ``size_trigger_rows`` staged,
   broadcast END. A txn with nothing to read waits past ``interval_s`` for its first record, up
   to ``idle_interval_s`` (``Flight.idle``); one that read nothing ends on a spare that stages
   where records wait (``Flight.awaits_spare``).
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
8. An idle txn still commits, once ``idle_interval_s`` has passed (an empty commit).

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

This module holds the ledger head, the commit point and the events' dispatch. The machine's parts,
one concept each: ``coordinator_flight`` (the txns in flight and the driver of every commit step),
``coordinator_liveness`` (heartbeats: holders, silence, a missed END, lag), ``coordinator_spare``
(step 2's stage table one txn ahead), ``coordinator_outbox`` (the messages it broadcasts),
``coordinator_txns`` (the order of txns in flight, the abort cascade), ``coordinator_verify``
(step 5's verdict).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from protocol import routing
from protocol.coordinator.events import (
    AbortKind,
    Action,
    Broadcast,
    Commit,
    CommitResult,
    Counted,
    Event,
    GapFound,
    Offsets,
    PartitionsChanged,
    Phase,
    PublishResult,
    Ready,
    Received,
    Shutdown,
    StageCreated,
    StepDown,
    Tick,
    Txn,
)
from protocol.coordinator.flight import Flight, Timing
from protocol.coordinator.leadership import COORDINATOR_KINDS
from protocol.coordinator.liveness import Liveness
from protocol.coordinator.outbox import Outbox
from protocol.coordinator.spare import Spare, StageAhead
from protocol.coordinator.txns import OPEN
from protocol.coordinator.verdict import verdict
from protocol.errors import InvalidTransition
from protocol.messages import Heartbeat, Pause, Reset, TopicPartition, WriteStatus


class CoordinatorState:
    """The leader's view of its transactions. Construct on winning an epoch; feed ``Ready`` first."""

    def __init__(
        self,
        *,
        pipeline: str,
        epoch: int,
        coordinator: str,
        target: str,
        timing: Timing,
        routes: Sequence[routing.Route] = (),
        shard_count: int = 0,
    ) -> None:
        """``shard_count``: the shards partitions are placed on (``clickhouse.placement = "partition"``
        over several ``clickhouse.shards``): a txn's stage tables are then made only on the shards
        whose partitions have records waiting. 0: every stage table on every shard."""
        self.pipeline = pipeline
        self.epoch = epoch
        self.coordinator = coordinator
        self.target = target
        self.timing = timing
        self.ready = False
        self.stepped_down = False
        self.stopping = False
        self.paused = False  # ``chtxn pause``: the open txn ends at once and no txn starts until resumed
        self.head_seq = 0
        self.head: Offsets = {}
        self.initial: Offsets = {}
        self.partitions: tuple[TopicPartition, ...] = ()
        self.ignored = 0  # stale-epoch and foreign messages skipped
        self.liveness = Liveness(timing.heartbeat_timeout_s)
        self.ahead = StageAhead(pipeline=pipeline, epoch=epoch, target=target, retry_s=timing.publish_retry_s)
        self.outbox = Outbox(
            pipeline=pipeline, epoch=epoch, coordinator=coordinator, routes=routes, shard_count=shard_count
        )
        self.flight = Flight(self, timing, liveness=self.liveness, ahead=self.ahead, outbox=self.outbox)

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
            actions += self.flight.advance(now, judge_silence=isinstance(event, Tick))
        return actions

    @property
    def txns(self) -> list[Txn]:
        """Uncommitted and unpublished txns, oldest first."""
        return self.flight.txns

    def txn(self, txn_id: str) -> Txn | None:
        return self.flight.txn(txn_id)

    @property
    def open_txn(self) -> Txn | None:
        return self.flight.open_txn

    @property
    def spare(self) -> Spare | None:
        """The next txn's stage table (commit step 2), once asked for."""
        return self.ahead.spare

    def lag(self) -> dict[TopicPartition, int]:
        """Per partition: log end (from heartbeats) minus the last committed offset."""
        return self.liveness.lag(self.partitions, self.base)

    def live_partitions(self, now: float) -> set[TopicPartition]:
        return self.liveness.live_partitions(now)

    def base(self, tp: TopicPartition) -> int:
        """Where ``tp``'s next txn must start: its last committed end, or a later floor (its initial
        offset when never committed, or where a skipped gap ended)."""
        return max(self.head.get(tp, 0), self.initial.get(tp, 0))

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
        self.partitions = self._routed(set(event.head) | set(event.initial))
        self.paused = event.paused
        return []

    def _on_partitions_changed(self, event: PartitionsChanged, now: float) -> list[Action]:
        self.partitions = self._routed(event.partitions)
        # A partition's initial offset is fixed once known: a START may already have gone out from it.
        self.initial.update(
            {tp: o for tp, o in event.initial.items() if tp not in self.head and tp not in self.initial}
        )
        return []

    def _routed(self, partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
        """Those of ``partitions`` whose topic goes to one table (every one without routes): a
        partition of no table is never STARTed, whatever the ledger head or a listing still has."""
        if not self.outbox.routes:
            return tuple(sorted(partitions))
        tables = self.outbox.tables_of({tp.topic for tp in partitions})
        return tuple(sorted(tp for tp in partitions if tp.topic in tables))

    def _on_tick(self, event: Tick, now: float) -> list[Action]:
        return []  # ``handle`` advances every txn after each event, judging silence on Tick

    def _on_shutdown(self, event: Shutdown, now: float) -> list[Action]:
        self.stopping = True
        actions: list[Action] = []
        for txn in [t for t in self.txns if t.phase in OPEN or t.phase is Phase.COMPLETE]:
            if txn in self.txns:
                actions += self.flight.abort(txn, "coordinator shutting down", now, AbortKind.SHUTDOWN)
        return actions + self.ahead.drop()

    def _on_received(self, event: Received, now: float) -> list[Action]:
        msg = event.message
        if msg.pipeline != self.pipeline:
            self.ignored += 1
            return []
        if isinstance(msg, Heartbeat):
            self.liveness.heard(msg, now)
            self.flight.heard(msg)
            return []
        if isinstance(msg, Pause):
            self.paused = msg.paused
            return []
        if isinstance(msg, Reset):  # an offset reset took a slot past this leader's head: read it at a take-over
            if not self.ready or msg.commit_seq <= self.head_seq:
                return []
            return self._step_down(
                f"offsets were reset by {msg.who or msg.sender} in commit slot {msg.commit_seq}: "
                "handing over so that a take-over starts from them",
                hand_over=True,
            )
        kind = type(msg).__struct_config__.tag
        if kind in COORDINATOR_KINDS:
            if msg.epoch > self.epoch:
                return self._step_down(f"a coordinator of a newer epoch ({msg.epoch} > {self.epoch}) is sending")
            return []
        if isinstance(msg, WriteStatus) and (actions := self.flight.write_status(msg, now)) is not None:
            return actions
        self.ignored += 1  # not for the leader, or a WRITE-STATUS that does not count
        return []

    def _on_stage_created(self, event: StageCreated, now: float) -> list[Action]:
        self.ahead.created(event, now)
        return []

    def _on_counted(self, event: Counted, now: float) -> list[Action]:
        txn = self._expect(event, Phase.VERIFYING)
        if txn is None:
            return []
        failed = verdict(txn, event, self.base)  # commit step 5's checks
        if failed is not None:
            why, kind = failed
            actions = self.flight.abort(txn, why, now, kind)
            if kind is AbortKind.TARGET_ALTERED:
                actions += self.ahead.drop()  # the spare was made like the old target too
            return actions
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
            lost = event.commit_seq or txn.commit_seq
            return self._step_down(f"lost commit slot {lost} of {txn.id} to another leader")
        if event.commit_seq:  # past slots a pause or a resume took
            txn.commit_seq = event.commit_seq
        self.head_seq = txn.commit_seq
        self.head.update(txn.end)
        # Commit step 7: ACK-COMMIT, then publish (``Flight.advance`` publishes in commit order).
        txn.phase = Phase.PUBLISHING
        return [Broadcast(self.outbox.ack(txn))]

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

    def _step_down(self, reason: str, *, hand_over: bool = False) -> list[Action]:
        self.stepped_down = True
        return [StepDown(reason, hand_over=hand_over)]
