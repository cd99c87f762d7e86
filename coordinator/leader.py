"""The leader's I/O shell: feeds Kafka, timers and I/O outcomes to ``CoordinatorState``.

Actions are carried out in order; each I/O action's outcome goes straight back into the
machine as an event. Take-over duties (roll forward committed txns, drop orphan stage tables,
read the ledger head) run before the first START. The commit point itself is
``LedgerStore.claim_commit`` (step 6 of ``protocol.coordinator_state``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition as KafkaTP

from clients import kafka as kafka_clients
from clients.kafka import BrokerUnreachable
from clients.clickhouse import retrying
from coordinator.control import ControlChannel
from coordinator.ledger_store import LedgerStore
from coordinator import ledger_rows
from coordinator.ledger_rows import ledger_row
from coordinator.metrics import CoordinatorMetrics
from coordinator.stage import StageTables
from protocol.config import PipelineConfig
from protocol.coordinator_events import (
    AbortTxn, Action, Broadcast, Commit, CommitResult, CountStage, Counted, CreateStage, Event,
    PartitionsChanged, Phase, Publish, PublishResult, Ready, Received, RecordStarted, Shutdown, StageCreated,
    StepDown, Stopped, Tick,
)
from protocol.coordinator_state import CoordinatorState, Timing
from protocol.errors import ChtxnError, SetupError
from protocol.messages import LeaderHeartbeat, TopicPartition

log = logging.getLogger(__name__)

PARTITION_CHECK_S = 5.0


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
        self._offsets_reader: Any = None
        self._ack_at: dict[str, float] = {}

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> str:
        self._heartbeat()
        self._admin = kafka_clients.admin(self.cfg)
        self._offsets_reader = Consumer(kafka_clients.consumer_conf(self.cfg, **{"client.id": f"chtxn-coordinator-{self.coordinator}"}))
        try:
            return self._run(stop)
        finally:
            self._offsets_reader.close()

    def _run(self, stop: threading.Event) -> str:
        self.take_over()
        head_seq, head = self.ledger.head()
        partitions = kafka_clients.partitions_of(self._admin, self.cfg.pipeline.topics)
        outcome = self._feed(Ready(head_seq, head, self._initial(partitions, head)))
        next_heartbeat = next_partition_check = self.clock()
        shutting = False
        fresh_s = self.cfg.heartbeat_timeout_s / 4
        while outcome is None:
            listened_at = self.clock()
            for message in self.control.poll(timeout=0.02):
                outcome = outcome or self._feed(Received(message))
            now = self.clock()
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self.cfg.coordinator.leader_lease_s / 3
                self._gauges(now)
            if now >= next_partition_check:
                next_partition_check = now + PARTITION_CHECK_S
                outcome = outcome or self._check_partitions()
            if stop.is_set() and not shutting:
                shutting = True
                outcome = outcome or self._feed(Shutdown())
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
        return handler(action)

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
            return StageCreated(action.txn, ok=False, error=str(exc))

    def _do_RecordStarted(self, action: RecordStarted) -> None:
        try:
            self.ledger.append(ledger_row(self, action.txn, "STARTED"))
        except ChtxnError as exc:  # history only: the txn goes on
            log.warning("could not record STARTED", extra={"txn": action.txn.id, "error": str(exc)})

    def _do_CountStage(self, action: CountStage) -> Event:
        try:
            return Counted(action.txn, self.retry(f"count {action.stage_table}")(self.stages.count, action.stage_table))
        except ChtxnError as exc:
            return Counted(action.txn, None, error=str(exc))

    def _do_Commit(self, action: Commit) -> Event:
        # Step 6, the commit point.
        row = ledger_row(self, action.txn, "COMMITTED", commit_seq=action.commit_seq)
        try:
            won = self.ledger.claim_commit(row)
        except ChtxnError as exc:
            return CommitResult(action.txn.id, None, error=str(exc))
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
            self.retry(f"publish {txn.id}")(self.stages.publish, txn.stage_table, txn.id)
            self.ledger.append(ledger_row(self, txn, "PUBLISHED", commit_seq=txn.commit_seq))
        except (ChtxnError, RuntimeError) as exc:
            log.error("publish failed; will retry", extra={"txn": txn.id, "error": str(exc)})
            return PublishResult(txn.id, ok=False, error=str(exc))
        acked = self._ack_at.pop(txn.id, None)
        if acked is not None:
            self.metrics.publish_latency.labels(self.cfg.name).observe(self.clock() - acked)
        return PublishResult(txn.id, ok=True)

    def _do_AbortTxn(self, action: AbortTxn) -> None:
        txn = action.txn
        log.warning("aborted", extra={"txn": txn.id, "reason": action.reason, "kind": action.kind})
        self.metrics.transactions.labels(self.cfg.name, "aborted").inc()
        self.metrics.aborts.labels(self.cfg.name, action.kind).inc()
        self._ack_at.pop(txn.id, None)
        try:
            self.retry(f"drop {txn.stage_table}")(self.stages.drop, txn.stage_table)
            self.ledger.append(ledger_row(self, txn, "ABORTED", reason=action.reason))
        except ChtxnError as exc:  # the orphan is dropped by the next take-over; nothing committed depends on it
            log.error("abort clean-up failed", extra={"txn": txn.id, "error": str(exc)})

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

    # ---- take-over and periodic duties -------------------------------------------------------

    def take_over(self) -> None:
        """Publish what was committed but not published; abort and drop every other stage table."""
        self.retry("check the target table")(self.stages.check_target)
        committed = {row.txn: row for row in self.ledger.committed_unpublished()}
        for txn_id, row in committed.items():
            log.warning("rolling forward the publish of a committed txn", extra={"txn": txn_id})
            self.retry(f"publish {txn_id}")(self.stages.publish, row.stage_table, txn_id)
            self.ledger.append(ledger_rows.published_from(row, epoch=self.epoch, coordinator=self.coordinator))
        for txn_id, table in self.retry("list stage tables")(self.stages.existing).items():
            if txn_id in committed:
                continue
            summary = self.ledger.txn(txn_id)
            if summary is not None and summary.state in ("COMMITTED", "PUBLISHED"):
                self.retry(f"publish {txn_id}")(self.stages.publish, table, txn_id)
                continue
            log.warning("dropping an orphan stage table", extra={"txn": txn_id, "table": table})
            self.retry(f"drop {table}")(self.stages.drop, table)
            self.ledger.append(ledger_rows.orphan_aborted(
                txn_id, table, pipeline=self.cfg.name, target=self.cfg.clickhouse.target_table,
                epoch=self.epoch, coordinator=self.coordinator))

    def _initial(self, partitions: list[TopicPartition], head: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Where never-committed partitions start, and gaps where retention passed the head."""
        initial = {}
        for tp in partitions:
            low, high = self._watermarks(tp)
            if tp not in head:
                initial[tp] = low if self.cfg.pipeline.start_from == "earliest" else high
            elif head[tp] < low:
                self._gap(tp, head[tp], low)
                initial[tp] = low
        return initial

    def _gap(self, tp: TopicPartition, head: int, low: int) -> None:
        message = (f"{tp.topic}-{tp.partition}: offsets {head}..{low - 1} are gone (retention) before they were "
                   "committed")
        self.ledger.append(ledger_rows.gap(tp, head, low, pipeline=self.cfg.name, target=self.cfg.clickhouse.target_table,
                                           epoch=self.epoch, coordinator=self.coordinator))
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
        initial = {tp: self._watermarks(tp)[0 if self.cfg.pipeline.start_from == "earliest" else 1] for tp in new}
        log.warning("source partitions changed", extra={"partitions": len(partitions)})
        return self._feed(PartitionsChanged(tuple(partitions), initial))

    def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        try:
            return self._offsets_reader.get_watermark_offsets(KafkaTP(tp.topic, tp.partition), timeout=10, cached=False)
        except KafkaException as exc:
            raise BrokerUnreachable(
                f"cannot read the offsets of {tp.topic}-{tp.partition} from {self.cfg.kafka.bootstrap_servers}: {exc}"
            ) from None

    def _gauges(self, now: float) -> None:
        self.metrics.participants.labels(self.cfg.name).set(len(self.state.live_partitions(now)))
        for tp, lag in self.state.lag().items():
            self.metrics.lag.labels(self.cfg.name, tp.topic, str(tp.partition)).set(lag)

    def _heartbeat(self) -> None:
        self.control.send(LeaderHeartbeat(pipeline=self.cfg.name, epoch=self.epoch, txn="", sender=self.coordinator))
