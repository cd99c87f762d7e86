"""Commit step 7 for one committed txn (``protocol.coordinator.state``): its rows into the target,
its dead letters to their topic, the PUBLISHED row, then the stage table dropped.

Run by the leader's background lane for the txns it commits, and by take-over for those an
earlier leader committed and did not publish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from clients import failpoints
from coordinator.dead_letters.publisher import DeadLetterPublisher, NewerLeader
from coordinator.ledger.store import LedgerStore
from coordinator.metrics import CoordinatorMetrics
from coordinator.stage.publish import StageTableMissing
from coordinator.stage.shards import Stages, on_shards
from coordinator.takeover import SteppedDown
from protocol.chcodes import UNKNOWN_TABLE
from protocol.errors import ClickHouseError
from protocol.ledger.rows import LedgerEvent

log = logging.getLogger(__name__)


class TxnPublisher:
    """Publishes committed txns for the leader ``coordinator`` of pipeline ``pipeline``; ``retry(what)``
    wraps a ClickHouse call in the coordinator's retries. The constructor does no I/O."""

    def __init__(
        self,
        pipeline: str,
        *,
        coordinator: str,
        stages: Stages,
        ledger: LedgerStore,
        dead_letters: DeadLetterPublisher,
        metrics: CoordinatorMetrics,
        retry: Callable[[str], Any],
    ) -> None:
        self.pipeline, self.coordinator = pipeline, coordinator
        self.stages, self.ledger, self.dead_letters, self.metrics = stages, ledger, dead_letters, metrics
        self.retry = retry
        self._published: set[str] = set()  # PUBLISHED rows written whose stage table is not dropped yet

    def publish(
        self, txn_id: str, stage: str, published_row: Callable[[], Any], *, shards: Sequence[int] | None = None
    ) -> bool:
        """Commit step 7 for one committed txn: rows into the target, PUBLISHED, drop. True if it was lost.
        ``shards``: the shards with its stage tables (``LedgerRow.shards``); None: every shard.

        A missing stage table with no PUBLISHED row means the rows are gone: that is recorded as
        LOST (an alarm: error log, metric, ``chtxn verify`` fails), never as PUBLISHED. Once this
        leader wrote the PUBLISHED row, a repeated call (its drop failed) only drops. Raises
        ``SteppedDown`` when the dead-letter publisher finds a newer leader.
        """
        stages = on_shards(self.stages, shards)
        if txn_id in self._published:
            self.retry(f"drop {stage}")(stages.drop, stage)
            self._published.discard(txn_id)
            return False
        failpoints.hit("leader.before-publish", self.coordinator)
        try:
            try:
                self.retry(f"publish {txn_id}")(
                    stages.publish, stage, txn_id, lambda: failpoints.hit("leader.mid-publish", self.coordinator)
                )
            except ClickHouseError as exc:  # the stage table went away mid-publish: another leader finished it?
                if exc.code != UNKNOWN_TABLE or self.retry(f"find {stage}")(stages.exists, stage):
                    raise
                raise StageTableMissing(str(exc)) from exc
        except StageTableMissing as exc:
            summary = self.ledger.txn(txn_id)
            if summary is not None and summary.state == LedgerEvent.PUBLISHED:
                return False  # another leader finished it
            log.error("committed txn lost: its stage table is gone", extra={"txn": txn_id, "error": str(exc)})
            self.metrics.lost.labels(self.pipeline).inc()
            lost = msgspec.structs.replace(published_row(), event=LedgerEvent.LOST, published_at=0.0, reason=str(exc))
            self.ledger.append(lost)
            return True
        row = published_row()
        failpoints.hit("leader.before-dead-letters", self.coordinator)
        try:
            self.dead_letters.publish(txn_id, row.commit_seq, letters=row.dead_letters)  # its bad records, once
        except NewerLeader as exc:
            raise SteppedDown(str(exc)) from None
        failpoints.hit("leader.before-published-row", self.coordinator)
        self.ledger.append(row)
        self._published.add(txn_id)
        self.retry(f"drop {stage}")(stages.drop, stage)
        self._published.discard(txn_id)
        return False
