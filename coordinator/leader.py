"""The leader's I/O shell: feeds Kafka, timers and I/O outcomes to ``CoordinatorState``.

Actions are carried out in order; each I/O action's outcome goes straight back into the
machine as an event. The commit point itself is ``LedgerStore.claim_commit`` (step 6 of
``protocol.coordinator_state``).

Take-over, before the first START, in this order:

1. Check the target table.
2. Seal: read the head and claim slot head+1 with an empty commit of this epoch, unless a
   newer epoch was claimed (then step down: an older epoch never seals on top of a newer
   leader's slots). Until the seal is ours, no stage table is touched: an older leader's commit that lands first is rolled
   forward below, and one that comes later loses its slot and steps down. A seal lost to a
   newer epoch means a newer leader exists: step down.
3. Roll forward, in commit order, every committed txn not yet published.
4. Drop this pipeline's other stage tables (orphans): nothing older can commit them any more.

While leading, the control loop never waits on ClickHouse: the machine's ClickHouse actions run
on three single-thread lanes and their outcomes come back as events. The commit lane counts and
claims (steps 5 and 6) in txn order; the stage lane creates the next txn's stage table (and
drops unused ones); the background lane records STARTED, publishes (step 7) and cleans up
aborts, in the order they were asked for. So the
count and claim of txn k overlap the reading of k+1, and control messages are answered while
ClickHouse is slow.

Liveness: the leader heartbeat goes out from its own thread with its own producer, so a leader
blocked in ClickHouse retries or a Kafka flush keeps its lease; a loop, or a lane action, stuck
for longer than ``LOOP_STALL_LIMIT_S`` stops heartbeating and lets a standby take over (the seal
keeps that safe).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from confluent_kafka import KafkaException, Producer, TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec

from clients import failpoints
from clients import kafka as kafka_clients
from clients.kafka import BrokerUnreachable
from clients.clickhouse import retrying
from coordinator.control import ControlChannel
from coordinator.dead_letter_publisher import DeadLetterPublisher, NewerLeader
from coordinator.ledger_store import LedgerStore
from coordinator import ledger_rows
from coordinator.ledger_rows import ledger_row
from coordinator.metrics import LEADER_STEPS, CoordinatorMetrics
from coordinator.stage import StageTableMissing, StageTables
from protocol.chcodes import UNKNOWN_TABLE
from protocol.config import PipelineConfig
from protocol.coordinator_events import (
    AbortTxn, Action, Broadcast, Commit, CommitResult, CountStage, Counted, CreateStage, DropStage, Event, GapFound,
    PartitionsChanged, Phase, Publish, PublishResult, Ready, Received, RecordStarted, Shutdown, StageCreated,
    StepDown, Stopped, Tick, Txn,
)
from protocol.coordinator_state import CoordinatorState, Timing
from protocol.errors import ChtxnError, ClickHouseError, SetupError
from protocol import codec
from protocol.ledger import LedgerEvent
from protocol.messages import LeaderHeartbeat, TopicPartition

log = logging.getLogger(__name__)

PARTITION_CHECK_S = 5.0
#: A leader loop that made no progress for this long stops heartbeating (a standby takes over).
LOOP_STALL_LIMIT_S = 120.0
#: How long a stopping leader waits for what it was asked (publishes, clean-ups) before it stops
#: anyway, leaving the rest to the next leader (every step is safe to repeat).
SHUTDOWN_GRACE_S = 30.0
#: Longest wait in one control-topic poll; shorter while lane outcomes are due.
POLL_S, BUSY_POLL_S = 0.02, 0.005
#: Which lane runs each ClickHouse action (``Leader`` module docstring); others run on the loop.
LANES: dict[type, str] = {
    CountStage: "commit", Commit: "commit",
    CreateStage: "stage", DropStage: "stage",
    RecordStarted: "background", Publish: "background", AbortTxn: "background",
}


def _snapshot(action: Action) -> Action:
    """``action`` with a copy of its ``Txn``, for a lane: the loop keeps changing the original."""
    txn = getattr(action, "txn", None)
    if not isinstance(txn, Txn):
        return action
    copy = dataclasses.replace(txn, start=dict(txn.start), statuses=dict(txn.statuses), holders=dict(txn.holders))
    return dataclasses.replace(action, txn=copy)  # type: ignore[type-var]


class SteppedDown(ChtxnError):
    """A newer leader exists (found by take-over, or by the dead-letter publisher): this replica must not lead."""


class Leader:
    """Leads one epoch until it steps down or is stopped. Returns the reason it stopped."""

    def __init__(self, cfg: PipelineConfig, *, epoch: int, coordinator: str, control: ControlChannel,
                 ledger: LedgerStore, stages: StageTables, metrics: CoordinatorMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.epoch = epoch
        self.coordinator = coordinator
        self.control = control
        self.ledger = ledger
        self.stages = stages
        self.metrics = metrics
        self.clock = clock
        self.retry = lambda what: retrying(cfg.coordinator.clickhouse_retries, what)
        tx = cfg.transaction
        self.state = CoordinatorState(
            pipeline=cfg.name, epoch=epoch, coordinator=coordinator, target=cfg.clickhouse.target_table,
            timing=Timing(interval_s=tx.interval_s, size_trigger_rows=tx.size_trigger_rows,
                          write_status_timeout_s=tx.write_status_timeout_s,
                          heartbeat_timeout_s=cfg.heartbeat_timeout_s),
        )
        self._admin: Any = None
        self._ack_at: dict[str, float] = {}
        self._dead_letters: Any = None
        self._progress_at = clock()
        self._gaps_recorded: set[tuple[TopicPartition, int, int]] = set()
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        self._outcomes: queue.SimpleQueue[Event | BaseException] = queue.SimpleQueue()
        self._in_flight: dict[int, float] = {}  # lane actions running or queued: id -> submitted at
        self._gap_check_due = False
        self._published: set[str] = set()  # PUBLISHED rows written whose stage table is not dropped yet

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> str:
        done = threading.Event()
        beating = threading.Thread(target=self._heartbeats, args=(done,), name=f"leader-heartbeat-e{self.epoch}",
                                   daemon=True)
        beating.start()
        self._admin = kafka_clients.admin(self.cfg)
        self._dead_letters = DeadLetterPublisher(self.cfg, self.stages.client, self.ledger, epoch=self.epoch)
        self._lanes = {lane: ThreadPoolExecutor(1, thread_name_prefix=f"chtxn-{lane}-e{self.epoch}")
                       for lane in sorted(set(LANES.values()))}
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
            for lane in self._lanes.values():
                lane.shutdown(wait=True, cancel_futures=outcome != "stopped")
            done.set()
            beating.join(10)
            self._dead_letters.close()

    def _run(self, stop: threading.Event) -> str:
        head_seq, head = self.take_over()
        failpoints.hit("leader.after-take-over", self.coordinator)
        partitions = kafka_clients.partitions_of(self._admin, self.cfg.pipeline.topics)
        initial = self._initial(partitions, head)
        outcome = self._feed(Ready(head_seq, head, initial))
        next_gauges = next_partition_check = self.clock()
        shutting, give_up_at = False, 0.0
        fresh_s = self.cfg.heartbeat_timeout_s / 4
        while outcome is None:
            listened_at = self._progress_at = self.clock()
            for message in self.control.poll(timeout=BUSY_POLL_S if self._in_flight else POLL_S):
                outcome = outcome or self._feed(Received(message))
            outcome = outcome or self._collect()
            now = self.clock()
            if now >= next_gauges:
                next_gauges = now + self.cfg.coordinator.leader_lease_s / 3
                self._gauges(now)
            if now >= next_partition_check:
                next_partition_check = now + PARTITION_CHECK_S
                outcome = outcome or self._check_partitions()
                self._gap_check_due = True
            if self._gap_check_due:  # every PARTITION_CHECK_S, and after a participant-error abort
                self._gap_check_due = False
                outcome = outcome or self._check_gaps()
            if stop.is_set() and not shutting:
                shutting, give_up_at = True, self.clock() + SHUTDOWN_GRACE_S
                outcome = outcome or self._feed(Shutdown())
            if shutting and outcome is None and self.clock() >= give_up_at:
                log.error("stopping without finishing: the next leader finishes what is left",
                          extra={"waited_s": SHUTDOWN_GRACE_S, "txns": [t.id for t in self.state.txns]})
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
                    self._drop_uncommitted()
                    return f"stepped down: {action.reason}"
                if isinstance(action, Stopped):
                    return "stopped"
                result = self._do(action)
                if result is not None:
                    pending.append(result)
        return None

    def _do(self, action: Action) -> Event | None:
        handler = getattr(self, f"_do_{type(action).__name__}")
        lane = LANES.get(type(action))
        if lane is None:
            return handler(action)
        action = _snapshot(action)  # the loop goes on changing the machine's Txn
        key = id(action)
        self._in_flight[key] = self.clock()

        step = self.metrics.step_seconds.labels(self.cfg.name, LEADER_STEPS[type(action)])

        def run() -> None:
            started = self.clock()
            try:
                outcome = handler(action)
                if outcome is not None:
                    self._outcomes.put(outcome)
            except BaseException as exc:  # a bug or an armed failpoint: raised again on the loop
                self._outcomes.put(exc)
            finally:
                step.observe(self.clock() - started)
                self._in_flight.pop(key, None)

        self._lanes[lane].submit(run)
        return None

    def _collect(self) -> str | None:
        """Feed the outcomes the lanes have posted; an exception a lane raised is raised here."""
        outcome = None
        while outcome is None:
            try:
                event = self._outcomes.get_nowait()
            except queue.Empty:
                return None
            if isinstance(event, BaseException):
                raise event
            outcome = self._feed(event)
        return outcome

    # ---- actions ----------------------------------------------------------------------------

    def _do_Broadcast(self, action: Broadcast) -> None:
        self.control.send(action.message)
        if type(action.message).__name__ == "EndCommit":
            self._ack_at[action.message.txn] = self.clock()

    def _do_CreateStage(self, action: CreateStage) -> Event:
        try:
            self.retry(f"create stage table {action.stage_table}")(self.stages.create, action.stage_table)
            return StageCreated(action.txn)
        except ChtxnError as exc:
            log.error("could not create the next stage table; retrying", extra={"txn": action.txn, "error": str(exc)})
            return StageCreated(action.txn, ok=False, error=str(exc))

    def _do_DropStage(self, action: DropStage) -> None:
        try:
            self.retry(f"drop {action.stage_table}")(self.stages.drop, action.stage_table)
        except ChtxnError as exc:  # an unused, empty table: the next take-over drops it as an orphan
            log.warning("could not drop an unused stage table", extra={"txn": action.txn, "error": str(exc)})

    def _do_RecordStarted(self, action: RecordStarted) -> None:
        try:
            self.ledger.append(ledger_row(self, action.txn, "STARTED"))
        except ChtxnError as exc:  # history only: the txn goes on
            log.warning("could not record STARTED", extra={"txn": action.txn.id, "error": str(exc)})

    def _do_CountStage(self, action: CountStage) -> Event:
        failpoints.hit("leader.before-count", self.coordinator)
        table = action.stage_table
        try:
            check = self.retry(f"check {table} against the target")(self.stages.check, table)
        except ChtxnError as exc:
            return Counted(action.txn, None, error=str(exc))
        return Counted(action.txn, check.count, partitions=check.partitions, altered=check.altered)

    def _do_Commit(self, action: Commit) -> Event:
        # Step 6, the commit point.
        failpoints.hit("leader.before-commit", self.coordinator)
        row = ledger_row(self, action.txn, "COMMITTED", commit_seq=action.commit_seq)
        try:
            won = self.ledger.claim_commit(row)
        except ChtxnError as exc:
            return CommitResult(action.txn.id, None, error=str(exc))
        if won:
            failpoints.hit("leader.after-commit", self.coordinator)
        if won:
            txn = action.txn
            self.metrics.transactions.labels(self.cfg.name, "committed").inc()
            self.metrics.rows.labels(self.cfg.name).inc(txn.rows)
            self.metrics.bytes.labels(self.cfg.name).inc(sum(ws.bytes for ws in txn.statuses.values()))
            self.metrics.dead_letters.labels(self.cfg.name).inc(sum(ws.dead_letters for ws in txn.statuses.values()))
            ended = self._ack_at.pop(txn.id, None)
            if ended is not None:
                self.metrics.commit_latency.labels(self.cfg.name).observe(self.clock() - ended)
            self._ack_at[txn.id] = self.clock()
            log.info("committed", extra={"txn": txn.id, "commit_seq": action.commit_seq, "rows": txn.rows})
        return CommitResult(action.txn.id, won)

    def _do_Publish(self, action: Publish) -> Event:
        txn = action.txn
        try:
            lost = self._publish(txn.id, txn.stage_table,
                                 lambda: ledger_row(self, txn, "PUBLISHED", commit_seq=txn.commit_seq))
        except SteppedDown:
            raise
        except (ChtxnError, RuntimeError) as exc:
            log.error("publish failed; will retry", extra={"txn": txn.id, "error": str(exc)})
            return PublishResult(txn.id, ok=False, error=str(exc))
        acked = self._ack_at.pop(txn.id, None)
        if acked is not None and not lost:
            self.metrics.publish_latency.labels(self.cfg.name).observe(self.clock() - acked)
        return PublishResult(txn.id, ok=True, lost=lost)

    def _publish(self, txn_id: str, stage: str, published_row: Callable[[], Any]) -> bool:
        """Step 7 for one committed txn: rows into the target, PUBLISHED, drop. True if it was lost.

        A missing stage table with no PUBLISHED row means the rows are gone: that is recorded as
        LOST (an alarm: error log, metric, ``chtxn verify`` fails), never as PUBLISHED. Once this
        leader wrote the PUBLISHED row, a repeated call (its drop failed) only drops.
        """
        if txn_id in self._published:
            self.retry(f"drop {stage}")(self.stages.drop, stage)
            self._published.discard(txn_id)
            return False
        failpoints.hit("leader.before-publish", self.coordinator)
        try:
            try:
                self.retry(f"publish {txn_id}")(
                    self.stages.publish, stage, txn_id, lambda: failpoints.hit("leader.mid-publish", self.coordinator))
            except ClickHouseError as exc:  # the stage table went away mid-publish: another leader finished it?
                if exc.code != UNKNOWN_TABLE or self.retry(f"find {stage}")(self.stages.exists, stage):
                    raise
                raise StageTableMissing(str(exc)) from exc
        except StageTableMissing as exc:
            summary = self.ledger.txn(txn_id)
            if summary is not None and summary.state == "PUBLISHED":
                return False  # another leader finished it
            log.error("committed txn lost: its stage table is gone", extra={"txn": txn_id, "error": str(exc)})
            self.metrics.lost.labels(self.cfg.name).inc()
            lost = msgspec.structs.replace(published_row(), event=LedgerEvent.LOST, published_at=0.0, reason=str(exc))
            self.ledger.append(lost)
            return True
        row = published_row()
        failpoints.hit("leader.before-dead-letters", self.coordinator)
        try:
            self._dead_letters.publish(txn_id, row.commit_seq)  # the txn's bad records, exactly once
        except NewerLeader as exc:
            raise SteppedDown(str(exc)) from None
        failpoints.hit("leader.before-published-row", self.coordinator)
        self.ledger.append(row)
        self._published.add(txn_id)
        self.retry(f"drop {stage}")(self.stages.drop, stage)
        self._published.discard(txn_id)
        return False

    def _do_AbortTxn(self, action: AbortTxn) -> None:
        txn = action.txn
        log.warning("aborted", extra={"txn": txn.id, "reason": action.reason, "kind": action.kind})
        self.metrics.transactions.labels(self.cfg.name, "aborted").inc()
        self.metrics.aborts.labels(self.cfg.name, action.kind).inc()
        self._ack_at.pop(txn.id, None)
        try:
            self.retry(f"drop {txn.stage_table}")(self.stages.drop_all, txn.stage_table)
            self.ledger.append(ledger_row(self, txn, "ABORTED", reason=action.reason))
        except ChtxnError as exc:  # the orphan is dropped by the next take-over; nothing committed depends on it
            log.error("abort clean-up failed", extra={"txn": txn.id, "error": str(exc)})
        if action.kind == "participant-error":
            self._gap_check_due = True  # an offset out of range may be a gap that opened while we ran

    def _drop_uncommitted(self) -> None:
        """Best effort on stepping down: this epoch's stage tables that can never commit."""
        for txn in self.state.txns:
            if txn.phase in (Phase.COMMITTING, Phase.PUBLISHING):
                continue  # outcome unknown or committed: the next leader decides
            try:
                self.retry(f"drop {txn.stage_table}")(self.stages.drop, txn.stage_table)
                self.ledger.append(ledger_row(self, txn, "ABORTED", reason="leader stepped down"))
            except ChtxnError as exc:
                log.warning("could not drop a stage table on stepping down", extra={"txn": txn.id, "error": str(exc)})
        if self.state.spare is not None:
            self._do_DropStage(DropStage(self.state.spare.txn, self.state.spare.stage_table))

    # ---- take-over and periodic duties -------------------------------------------------------

    def take_over(self) -> tuple[int, dict[TopicPartition, int]]:
        """Take-over steps 1-4 (module docstring); returns the head after the seal."""
        failpoints.hit("leader.before-take-over", self.coordinator)
        self.retry("check the target table")(self.stages.check_target)
        while True:  # Take-over step 2: seal
            head_seq, head = self.ledger.head()
            newest = self.ledger.max_epoch()  # read after the head: a newer seal in it shows here too
            if newest > self.epoch:
                raise SteppedDown(f"epoch {newest} > {self.epoch} was claimed: a newer leader exists")
            failpoints.hit("leader.before-seal", self.coordinator)
            if self.ledger.seal(self.epoch, self.coordinator, head_seq):
                break
            winner = self.ledger.commit_at(head_seq + 1)
            if winner is not None and winner.epoch > self.epoch:
                raise SteppedDown(f"slot {head_seq + 1} is held by epoch {winner.epoch} > {self.epoch}")
            log.warning("a late commit took the slot to seal; rolling it forward",
                        extra={"slot": head_seq + 1, "txn": winner.txn if winner else "?"})
        seal = self.ledger.commit_at(head_seq + 1)
        assert seal is not None
        self.ledger.append(ledger_rows.published_from(seal, epoch=self.epoch, coordinator=self.coordinator))
        for row in self.ledger.committed_unpublished():  # Take-over step 3: roll forward, in commit order
            log.warning("rolling forward the publish of a committed txn", extra={"txn": row.txn})
            self._publish(row.txn, row.stage_table,
                          lambda row=row: ledger_rows.published_from(row, epoch=self.epoch, coordinator=self.coordinator))
            self._progress_at = self.clock()  # a long roll-forward is progress: the lease holds
        for txn_id, table in self.retry("list stage tables")(self.stages.existing).items():  # Take-over step 4
            summary = self.ledger.txn(txn_id)
            if summary is not None and summary.state == "PUBLISHED":  # its rows are in the target: only clean up
                self.retry(f"drop {table}")(self.stages.drop_all, table)
            elif summary is not None and summary.state == "COMMITTED" and self._owns_slot(summary):
                self._publish(txn_id, table, lambda s=summary: ledger_rows.published_from_summary(
                    s, pipeline=self.cfg.name, epoch=self.epoch, coordinator=self.coordinator))
                self.retry(f"drop {table}")(self.stages.drop_all, table)
            else:
                log.warning("dropping an orphan stage table", extra={"txn": txn_id, "table": table})
                self.retry(f"drop {table}")(self.stages.drop_all, table)
                self.ledger.append(ledger_rows.orphan_aborted(
                    txn_id, table, pipeline=self.cfg.name, target=self.cfg.clickhouse.target_table,
                    epoch=self.epoch, coordinator=self.coordinator))
            self._progress_at = self.clock()
        return head_seq + 1, head

    def _owns_slot(self, summary: Any) -> bool:
        """Whether ``summary``'s txn won its commit slot (a late claim past the deduplication
        window leaves a COMMITTED row that lost: its stage table is an orphan)."""
        winner = self.ledger.commit_at(summary.commit_seq) if summary.commit_seq else None
        return winner is not None and winner.txn == summary.txn

    def _initial(self, partitions: list[TopicPartition], head: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Where each partition's next txn may start, beyond its committed end: the recorded
        initial offset of a never-committed partition, or where a skipped gap ends.

        ``start_from = latest`` applies to the partitions of a pipeline's very first start;
        partitions added later start from their earliest offset (all their records came after
        the pipeline started). The choice is recorded in the ledger once, so a later leader
        never moves it.
        """
        recorded = self.ledger.initial_offsets()
        latest = not head and not recorded and self.cfg.pipeline.start_from == "latest"
        marks = self._watermarks([tp for tp in partitions if tp not in head and tp not in recorded])
        choices = {tp: high if latest else low for tp, (low, high) in marks.items()}
        recorded.update(self.ledger.claim_initials(choices, epoch=self.epoch, coordinator=self.coordinator))
        initial = {tp: recorded[tp] for tp in partitions if tp not in head}
        base = {tp: max(head.get(tp, 0), initial.get(tp, 0)) for tp in partitions}
        for tp, skip_to in self._gaps(base).items():
            initial[tp] = skip_to
        return initial

    def _gaps(self, base: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Partitions whose next offset is gone (retention), each recorded once as a GAP; per
        ``on_gap``, raise (fail) or return where to go on from (skip)."""
        skips = {}
        marks = self._watermarks(list(base))
        for tp, offset in sorted(base.items()):
            low, _ = marks[tp]
            if offset < low:
                self._gap(tp, offset, low)
                skips[tp] = low
        return skips

    def _check_gaps(self) -> str | None:
        """A gap that opened while leading (lag passed retention during an outage)."""
        if not self.state.ready:
            return None
        try:
            skips = self._gaps({tp: self.state.base(tp) for tp in self.state.partitions})
        except BrokerUnreachable as exc:
            log.warning("could not check for gaps", extra={"error": str(exc)})
            return None
        outcome = None
        for tp, offset in skips.items():
            outcome = outcome or self._feed(GapFound(tp, offset))
        return outcome

    def _gap(self, tp: TopicPartition, head: int, low: int) -> None:
        message = (f"{tp.topic}-{tp.partition}: offsets {head}..{low - 1} are gone (retention) before they were "
                   "committed")
        if (tp, head, low) not in self._gaps_recorded:
            self.ledger.append(ledger_rows.gap(tp, head, low, pipeline=self.cfg.name,
                                               target=self.cfg.clickhouse.target_table,
                                               epoch=self.epoch, coordinator=self.coordinator))
            self._gaps_recorded.add((tp, head, low))
        if self.cfg.pipeline.on_gap == "fail":
            raise SetupError(f"{message}; set pipeline.on_gap = \"skip\" to go on from offset {low}")
        log.error("gap skipped", extra={"topic": tp.topic, "partition": tp.partition, "from": head, "to": low})

    def _check_partitions(self) -> str | None:
        try:
            partitions = kafka_clients.partitions_of(self._admin, self.cfg.pipeline.topics)
        except ChtxnError as exc:
            log.warning("could not list partitions", extra={"error": str(exc)})
            return None
        if tuple(partitions) == self.state.partitions:
            return None
        new = [tp for tp in partitions if tp not in self.state.head and tp not in self.state.initial]
        initial = self._initial(new, dict(self.state.head))
        log.warning("source partitions changed", extra={"partitions": len(partitions)})
        return self._feed(PartitionsChanged(tuple(partitions), initial))

    def _watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """(low, high) of each of ``tps``: two ListOffsets rounds (one request per broker each),
        however many partitions, instead of a blocking round trip per partition."""
        if not tps:
            return {}
        low, high = self._list_offsets(tps, OffsetSpec.earliest()), self._list_offsets(tps, OffsetSpec.latest())
        return {tp: (low[tp], high[tp]) for tp in tps}

    def _list_offsets(self, tps: list[TopicPartition], spec: OffsetSpec) -> dict[TopicPartition, int]:
        try:
            futures = self._admin.list_offsets({KafkaTP(tp.topic, tp.partition): spec for tp in tps}, request_timeout=10)
            return {TopicPartition(topic=k.topic, partition=k.partition): f.result().offset for k, f in futures.items()}
        except KafkaException as exc:
            raise BrokerUnreachable(
                f"cannot read the offsets of {len(tps)} partitions of {', '.join(sorted({tp.topic for tp in tps}))} "
                f"from {self.cfg.kafka.bootstrap_servers}: {exc}"
            ) from None

    def _gauges(self, now: float) -> None:
        self.metrics.participants.labels(self.cfg.name).set(len(self.state.live_partitions(now)))
        for tp, lag in self.state.lag().items():
            self.metrics.lag.labels(self.cfg.name, tp.topic, str(tp.partition)).set(lag)

    def _heartbeats(self, done: threading.Event) -> None:
        """The lease, on its own thread and producer: never waits on the loop's ClickHouse or Kafka I/O."""
        producer = Producer(kafka_clients.producer_conf(self.cfg, **{
            "client.id": f"chtxn-coordinator-{self.coordinator}-lease", "linger.ms": 0}))
        beat = codec.encode(LeaderHeartbeat(pipeline=self.cfg.name, epoch=self.epoch, txn="", sender=self.coordinator))
        interval = self.cfg.coordinator.leader_lease_s / 3
        try:
            while not done.is_set():
                oldest = min(list(self._in_flight.values()), default=self._progress_at)
                if self.clock() - min(self._progress_at, oldest) <= LOOP_STALL_LIMIT_S:
                    try:
                        producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=beat)
                    except BufferError:
                        pass  # the broker is unreachable: the lease lapses, as it should
                else:
                    log.error("the leader loop is stuck; no longer heartbeating",
                              extra={"stuck_s": round(self.clock() - min(self._progress_at, oldest), 1)})
                producer.poll(0)
                done.wait(interval)
        finally:
            producer.flush(1)
