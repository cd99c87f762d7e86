"""The leader's stage-lane and background-lane actions (``coordinator.lanes``), and its clean-up on
stepping down: the next txn's stage table made (commit step 2) or an unused one dropped, STARTED
recorded, a committed txn published (commit step 7, ``coordinator.txn_publisher``), an aborted
txn's tables dropped and its ABORTED row written. Each action answers with the event it feeds
back into the machine, if any.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from coordinator.ledger.rows import ledger_row
from coordinator.ledger.store import LedgerStore
from coordinator.metrics import CoordinatorMetrics
from coordinator.stage.shards import Stages, on_shards
from coordinator.takeover import SteppedDown
from coordinator.txn_publisher import TxnPublisher
from protocol.config.parse import PipelineConfig
from protocol.coordinator.events import (
    AbortKind,
    AbortTxn,
    CreateStage,
    DropStage,
    Event,
    Phase,
    Publish,
    PublishResult,
    RecordStarted,
    StageCreated,
)
from protocol.coordinator.state import CoordinatorState
from protocol.errors import ChtxnError
from protocol.ledger.rows import LedgerEvent

log = logging.getLogger(__name__)


class TxnActions:
    """The actions of the leader ``coordinator`` of ``epoch``. ``acked_at`` (txn -> when its
    END went out, then when it committed) is the leader's, for the latency metrics;
    ``on_participant_error`` is called once an abort of kind ``participant-error`` is cleaned up
    (an offset out of range may be a gap that opened while leading). The constructor does no I/O."""

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        epoch: int,
        coordinator: str,
        clock: Callable[[], float],
        ledger: LedgerStore,
        stages: Stages,
        metrics: CoordinatorMetrics,
        retry: Callable[[str], Any],
        publisher: TxnPublisher,
        acked_at: dict[str, float],
        on_participant_error: Callable[[], None],
    ) -> None:
        self.cfg, self.epoch, self.coordinator, self.clock = cfg, epoch, coordinator, clock  # for ``ledger_row``
        self.ledger, self.stages, self.metrics, self.retry = ledger, stages, metrics, retry
        self.publisher, self.acked_at, self.on_participant_error = publisher, acked_at, on_participant_error

    def create_stage(self, action: CreateStage) -> Event:
        try:
            stages = on_shards(self.stages, action.shards)
            self.retry(f"create stage table {action.stage_table}")(stages.create, action.stage_table)
            return StageCreated(action.txn)
        except ChtxnError as exc:
            log.error("could not create the next stage table; retrying", extra={"txn": action.txn, "error": str(exc)})
            return StageCreated(action.txn, ok=False, error=str(exc))

    def drop_stage(self, action: DropStage) -> None:
        try:
            self.retry(f"drop {action.stage_table}")(on_shards(self.stages, action.shards).drop, action.stage_table)
        except ChtxnError as exc:  # an unused, empty table: the next take-over drops it as an orphan
            log.warning("could not drop an unused stage table", extra={"txn": action.txn, "error": str(exc)})

    def record_started(self, action: RecordStarted) -> None:
        try:
            self.ledger.append(ledger_row(self, action.txn, LedgerEvent.STARTED))
        except ChtxnError as exc:  # history only: the txn goes on
            log.warning("could not record STARTED", extra={"txn": action.txn.id, "error": str(exc)})

    def publish(self, action: Publish) -> Event:
        txn = action.txn
        try:
            lost = self.publisher.publish(
                txn.id,
                txn.stage_table,
                lambda: ledger_row(self, txn, LedgerEvent.PUBLISHED, commit_seq=txn.commit_seq),
                shards=txn.shards,
            )
        except SteppedDown:
            raise
        except (ChtxnError, RuntimeError) as exc:
            log.error("publish failed; will retry", extra={"txn": txn.id, "error": str(exc)})
            return PublishResult(txn.id, ok=False, error=str(exc))
        acked = self.acked_at.pop(txn.id, None)
        if acked is not None and not lost:
            self.metrics.publish_latency.labels(self.cfg.name).observe(self.clock() - acked)
        return PublishResult(txn.id, ok=True, lost=lost)

    def abort(self, action: AbortTxn) -> None:
        txn = action.txn
        log.warning("aborted", extra={"txn": txn.id, "reason": action.reason, "kind": action.kind})
        self.count_abort(action.kind)
        self.acked_at.pop(txn.id, None)
        try:
            self.retry(f"drop {txn.stage_table}")(on_shards(self.stages, txn.shards).drop_all, txn.stage_table)
            self.ledger.append(ledger_row(self, txn, LedgerEvent.ABORTED, reason=action.reason))
        except ChtxnError as exc:  # the orphan is dropped by the next take-over; nothing committed depends on it
            log.error("abort clean-up failed", extra={"txn": txn.id, "error": str(exc)})
        if action.kind == "participant-error":
            self.on_participant_error()

    def count_abort(self, kind: str) -> None:
        """``chtxn_transactions_total{outcome="aborted"}`` and ``chtxn_aborts_total{reason=kind}``."""
        self.metrics.transactions.labels(self.cfg.name, "aborted").inc()
        self.metrics.aborts.labels(self.cfg.name, kind).inc()

    def drop_uncommitted(self, state: CoordinatorState) -> None:
        """Best effort on stepping down: this epoch's stage tables that can never commit."""
        for txn in state.txns:
            if txn.phase in (Phase.COMMITTING, Phase.PUBLISHING):
                continue  # outcome unknown or committed: the next leader decides
            try:
                self.retry(f"drop {txn.stage_table}")(on_shards(self.stages, txn.shards).drop, txn.stage_table)
                self.ledger.append(ledger_row(self, txn, LedgerEvent.ABORTED, reason="leader stepped down"))
                self.count_abort(AbortKind.STEP_DOWN)
            except ChtxnError as exc:
                log.warning("could not drop a stage table on stepping down", extra={"txn": txn.id, "error": str(exc)})
        if state.spare is not None:
            self.drop_stage(DropStage(state.spare.txn, state.spare.stage_table, state.spare.shards))
