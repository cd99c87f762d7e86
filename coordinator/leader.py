"""The leader's I/O shell: feeds Kafka, timers and I/O outcomes to ``CoordinatorState``.

Actions are carried out in order, each by the handler of its type (``Leader._handlers``); each I/O
action's outcome goes straight back into the machine as an event. The ClickHouse actions run on
lanes (``coordinator.lanes``), so the control loop never waits on ClickHouse: the count and claim
of txn k (commit steps 5 and 6, here) overlap the reading of k+1, and control messages are
answered while ClickHouse is slow. The other actions are ``coordinator.txn_actions``.

The commit point is ``LedgerStore.claim_commit`` (commit step 6 of ``protocol.coordinator.state``);
right after a won claim the ledger is checkpointed and expired when due (``after_won_slot``). Before
the first START it takes over (``coordinator.takeover``); its heartbeat goes out from a thread of its
own (``coordinator.lease``); where each partition starts is ``coordinator.offsets.source``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from clients import failpoints
from clients.clickhouse import retrying
from clients.kafka import KafkaClientFactory
from coordinator.control import ControlChannel
from coordinator.dead_letters.publisher import DeadLetterPublisher
from coordinator.lanes import LANES, Lanes
from coordinator.lease import Lease
from coordinator.ledger.rows import ledger_row
from coordinator.ledger.store import LedgerStore
from coordinator.metrics import LEADER_STEPS, CoordinatorMetrics
from coordinator.offsets.source import SourceOffsets
from coordinator.stage.shards import Stages, on_shards
from coordinator.takeover import SteppedDown, take_over
from coordinator.txn_actions import TxnActions
from coordinator.txn_publisher import TxnPublisher
from protocol.config.parse import PipelineConfig
from protocol.coordinator.events import (
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
    PartitionsChanged,
    Publish,
    Ready,
    Received,
    RecordStarted,
    Shutdown,
    StepDown,
    Stopped,
    Tick,
)
from protocol.coordinator.flight import Timing
from protocol.coordinator.state import CoordinatorState
from protocol.errors import ChtxnError
from protocol.ledger import pauses as ledger_pauses
from protocol.ledger.rows import LedgerEvent

log = logging.getLogger(__name__)

PARTITION_CHECK_S = 5.0
#: How long a stopping leader waits for what it was asked (publishes, clean-ups) before it stops
#: anyway, leaving the rest to the next leader (every step is safe to repeat).
SHUTDOWN_GRACE_S = 30.0
#: Longest wait in one control-topic poll; shorter while lane outcomes are due.
POLL_S, BUSY_POLL_S = 0.02, 0.005


class Leader:
    """Leads one epoch until it steps down or is stopped. Returns the reason it stopped."""

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        epoch: int,
        coordinator: str,
        control: ControlChannel,
        ledger: LedgerStore,
        stages: Stages,
        metrics: CoordinatorMetrics,
        clock: Callable[[], float] = time.monotonic,
        kafka: KafkaClientFactory | None = None,
    ) -> None:
        self.cfg = cfg
        self.epoch = epoch
        self.coordinator = coordinator
        self.control = control
        self.ledger = ledger
        self.stages = stages
        self.metrics = metrics
        self.clock = clock
        self.kafka = kafka or KafkaClientFactory(cfg)
        self.retry = lambda what: retrying(cfg.coordinator.clickhouse_retries, what)
        tx = cfg.transaction
        timing = Timing(
            interval_s=tx.interval_s,
            idle_interval_s=tx.idle_interval_s,
            size_trigger_rows=tx.size_trigger_rows,
            write_status_timeout_s=tx.write_status_timeout_s,
            heartbeat_timeout_s=cfg.heartbeat_timeout_s,
            chunk_scale=cfg.chunk_scale,
        )
        self.state = CoordinatorState(
            pipeline=cfg.name,
            epoch=epoch,
            coordinator=coordinator,
            target=cfg.tables[0],
            timing=timing,
            routes=cfg.routes,
            shard_count=cfg.placed_count,
        )
        self._ack_at: dict[str, float] = {}  # txn -> when it committed (its publish latency's start)
        self._hand_over = False  # a step-down that ends the lease at once (``StepDown.hand_over``)
        self.failure: ChtxnError | None = None  # what left a commit's outcome unknown, if that ended the leadership
        self._offsets: Any = None  # SourceOffsets, made by ``run``
        self._progress_at = clock()
        self._lanes = Lanes(epoch, clock)
        self._gap_check_due = False
        self._partition_check_due = False  # a topic was re-created under a txn: check the logs at once
        # No I/O until ``run``: the dead-letter publisher connects on its first publish.
        self._dead_letters = DeadLetterPublisher(cfg, stages.client, ledger, epoch=epoch, kafka=self.kafka)
        self._publisher = TxnPublisher(
            cfg.name,
            coordinator=coordinator,
            stages=stages,
            ledger=ledger,
            dead_letters=self._dead_letters,
            metrics=metrics,
            retry=self.retry,
        )
        self._actions = TxnActions(
            cfg,
            epoch=epoch,
            coordinator=coordinator,
            clock=clock,
            ledger=ledger,
            stages=stages,
            metrics=metrics,
            retry=self.retry,
            publisher=self._publisher,
            acked_at=self._ack_at,
            on_participant_error=self._check_gaps_soon,
        )
        #: The handler of each action the machine asks for (``StepDown`` and ``Stopped`` end ``_feed``).
        self._handlers: dict[type, Callable[[Any], Event | None]] = {
            Broadcast: self._broadcast,
            CountStage: self._count_stage,
            Commit: self._commit,
            CreateStage: self._actions.create_stage,
            DropStage: self._actions.drop_stage,
            RecordStarted: self._actions.record_started,
            Publish: self._actions.publish,
            AbortTxn: self._actions.abort,
        }

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> str:
        lease = Lease(
            self.cfg,
            self.kafka,
            epoch=self.epoch,
            coordinator=self.coordinator,
            clock=self.clock,
            last_progress=self._last_progress,
        )
        lease.start()
        admin = self.kafka.admin()
        self._offsets = SourceOffsets(self.cfg, admin, self.ledger, epoch=self.epoch, coordinator=self.coordinator)
        self._lanes.open()
        outcome = "crashed"
        try:
            outcome = self._run(stop)
            return outcome
        except SteppedDown as exc:
            outcome = f"stepped down: {exc}"
            return outcome
        finally:
            # Stopping: what was asked (clean-ups included) is done before we go. Stepping down or
            # crashing: what has not begun never begins (the next leader decides it).
            self._lanes.shutdown(cancel=outcome != "stopped")
            # Stopped (SIGTERM): hand the lease over, so a standby need not wait for it to lapse.
            lease.stop(leaving=outcome.startswith("stopped") or self._hand_over)
            self._dead_letters.close()

    def _run(self, stop: threading.Event) -> str:
        head_seq, head = take_over(
            self.cfg,
            epoch=self.epoch,
            coordinator=self.coordinator,
            ledger=self.ledger,
            stages=self.stages,
            retry=self.retry,
            publish=self._publisher.publish,
            progress=self._made_progress,
            aborted=self._actions.count_abort,
        )
        failpoints.hit("leader.after-take-over", self.coordinator)
        partitions = self._offsets.partitions()
        initial = self._offsets.initial(partitions, head, head_seq=head_seq)
        pause = self.ledger.pause()
        paused = pause is not None and pause.event is LedgerEvent.PAUSED
        if pause is not None and paused:
            log.warning("the pipeline is paused: no txn starts until chtxn resume", extra={"reason": pause.reason})
        outcome = self._feed(Ready(head_seq, head, initial, paused=paused))
        if self._offsets.stopped:  # no START before this: none goes out until participants are heard
            read = tuple(tp for tp in self.state.partitions if tp not in self._offsets.stopped)
            outcome = outcome or self._feed(PartitionsChanged(read, {}))
        next_gauges = next_partition_check = self.clock()
        shutting, give_up_at = False, 0.0
        fresh_s = self.cfg.heartbeat_timeout_s / 4
        while outcome is None:
            listened_at = self._progress_at = self.clock()
            for message in self.control.poll(timeout=BUSY_POLL_S if self._lanes.in_flight else POLL_S):
                outcome = outcome or self._feed(Received(message))
            outcome = outcome or self._lanes.collect(self._feed)
            now = self.clock()
            if now >= next_gauges:
                next_gauges = now + self.cfg.coordinator.leader_lease_s / 3
                self._gauges(now)
            if now >= next_partition_check or self._partition_check_due:
                next_partition_check, self._partition_check_due = now + PARTITION_CHECK_S, False
                outcome = outcome or self._feed_all(self._offsets.partitions_changed(self.state))
                self._gap_check_due = True
            if self._gap_check_due:  # every PARTITION_CHECK_S, and after a participant-error abort
                self._gap_check_due = False
                outcome = outcome or self._feed_all(self._offsets.gaps_found(self.state))
            if stop.is_set() and not shutting:
                shutting, give_up_at = True, self.clock() + SHUTDOWN_GRACE_S
                outcome = outcome or self._feed(Shutdown())
            if shutting and outcome is None and self.clock() >= give_up_at:
                log.error(
                    "stopping without finishing: the next leader finishes what is left",
                    extra={"waited_s": SHUTDOWN_GRACE_S, "txns": [t.id for t in self.state.txns]},
                )
                return "stopped: gave up waiting for publishes and clean-ups"
            if self.clock() - listened_at <= fresh_s:  # Tick judges silence: only right after listening
                outcome = outcome or self._feed(Tick())
        return outcome

    def _feed(self, event: Event) -> str | None:
        """Hand one event to the machine and carry out its actions, feeding outcomes back."""
        pending: list[Event] = [event]
        while pending:
            actions = self.state.handle(pending.pop(0), self.clock())
            for action in actions:
                if isinstance(action, StepDown):
                    log.warning("stepping down", extra={"epoch": self.epoch, "reason": action.reason})
                    failpoints.hit("leader.stepping-down", self.coordinator)
                    self._hand_over = action.hand_over
                    self._actions.drop_uncommitted(self.state)
                    return f"stepped down: {action.reason}"
                if isinstance(action, Stopped):
                    return "stopped"
                result = self._do(action)
                if result is not None:
                    pending.append(result)
        return None

    def _feed_all(self, events: list[Event]) -> str | None:
        outcome = None
        for event in events:
            outcome = outcome or self._feed(event)
        return outcome

    def _do(self, action: Action) -> Event | None:
        """Carry out ``action`` on the loop, or hand it to its lane (its outcome comes back through
        ``Lanes.collect``)."""
        handler = self._handlers[type(action)]
        lane = LANES.get(type(action))
        if lane is None:
            return handler(action)
        step = self.metrics.step_seconds.labels(self.cfg.name, LEADER_STEPS[type(action)])
        self._lanes.submit(lane, action, handler, step)
        return None

    def _made_progress(self) -> None:
        self._progress_at = self.clock()

    def _last_progress(self) -> float:
        """When the loop, or the oldest lane action still running or queued, last made progress."""
        return min(self._progress_at, self._lanes.oldest(default=self._progress_at))

    def _check_gaps_soon(self) -> None:
        self._gap_check_due = True

    def _gauges(self, now: float) -> None:
        self.metrics.live_partitions.labels(self.cfg.name).set(len(self.state.live_partitions(now)))
        for tp, lag in self.state.lag().items():
            self.metrics.lag.labels(self.cfg.name, tp.topic, str(tp.partition)).set(lag)
        self.metrics.hold_topics(self._offsets.held)
        self.metrics.set_stopped(self._offsets.stopped)

    # ---- the loop's actions and the commit lane's (commit steps 5 and 6) --------------------

    def _broadcast(self, action: Broadcast) -> None:
        self.control.send(action.message)

    def _count_stage(self, action: CountStage) -> Event:
        failpoints.hit("leader.before-count", self.coordinator)
        table = action.stage_table
        try:
            if changed := self._offsets.logs.changed():  # a re-created topic: stop its partitions now
                self._partition_check_due = True
                return Counted(action.txn, None, log_changed=changed)
            stages = on_shards(self.stages, action.shards)
            check = self.retry(f"check {table} against the target")(stages.check, table)
        except ChtxnError as exc:
            return Counted(action.txn, None, error=str(exc))
        return Counted(action.txn, check.count, partitions=check.partitions, altered=check.altered)

    def _commit(self, action: Commit) -> Event:
        # Commit step 6: the commit point
        failpoints.hit("leader.before-commit", self.coordinator)
        row = ledger_row(self, action.txn, LedgerEvent.COMMITTED, commit_seq=action.commit_seq)
        try:
            won = self.ledger.claim_commit(row)
            while not won and ledger_pauses.moves_nothing(self.ledger.commit_at(row.commit_seq)):
                # A pause or a resume took the slot: it moves no offset, so the head this txn
                # started from is the head before the next slot too.
                row = ledger_row(self, action.txn, LedgerEvent.COMMITTED, commit_seq=row.commit_seq + 1)
                won = self.ledger.claim_commit(row)
        except ChtxnError as exc:
            self.failure = exc  # the machine steps down on it; the replica then reports it (``service``)
            return CommitResult(action.txn.id, None, error=str(exc))
        if won:
            self.ledger.after_won_slot(row.commit_seq, epoch=row.epoch, coordinator=row.coordinator)
            failpoints.hit("leader.after-commit", self.coordinator)
            txn = action.txn
            self.metrics.count_commit(txn, self.cfg)
            now = self.clock()
            if txn.ended_at:  # the first END's time: a copy sent again to a holder that missed it is no END
                self.metrics.commit_latency.labels(self.cfg.name).observe(now - txn.ended_at)
                if txn.complete_at:
                    self.metrics.flush_latency.labels(self.cfg.name).observe(txn.complete_at - txn.ended_at)
            self._ack_at[txn.id] = now
            log.info("committed", extra={"txn": txn.id, "commit_seq": row.commit_seq, "rows": txn.rows})
        return CommitResult(action.txn.id, won, commit_seq=row.commit_seq)
