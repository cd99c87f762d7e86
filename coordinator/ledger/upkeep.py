"""Checkpoints and expiry of one pipeline's ledger (``protocol.ledger.checkpoint``), written through its
``coordinator.ledger.access.LedgerAccess`` (the ledger store).

Guarantees:
- ``after_won_slot`` is for the claimer that just won a slot: every ``every``-th won slot and every
  won seal are followed by a checkpoint and an expiry run. Their failures are logged, never
  raised: the commit stands, and the next checkpoint covers what this one missed.
- A checkpoint covers the longest decided and settled prefix of the chain past the latest
  checkpoint, derived from what is read back, never from what the leader hoped to write; two
  writers of one slot's checkpoint store one row (token ``naming.checkpoint_token``).
- Expiry deletes history older than ``retention_s`` that no reader needs, never the head.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from coordinator.ledger.access import LedgerAccess
from protocol import naming
from protocol.errors import ChtxnError
from protocol.ledger import checkpoint as ledger_checkpoint, sql as ledger_sql

log = logging.getLogger(__name__)


class LedgerUpkeep:
    """The checkpoints and expiry of ``store``'s ledger; ``wall_clock`` gives unix seconds.
    The constructor does no I/O."""

    def __init__(self, store: LedgerAccess, *, every: int, retention_s: float, wall_clock: Callable[[], float]) -> None:
        self._store = store
        self.every = every
        self.retention_s = retention_s
        self._wall_clock = wall_clock
        self._expired_through = 0

    def after_won_slot(self, commit_seq: int, *, epoch: int, coordinator: str, seal: bool = False) -> None:
        """Upkeep for the claimer that just won slot ``commit_seq`` (by its seal, with ``seal``): a
        checkpoint and an expiry run when due. Failures are logged, never raised.

        Runs the store's ``checkpoint`` and ``expire``, so a store that replaces them is obeyed."""
        if commit_seq % self.every != 0 and not seal:
            return
        try:
            self._store.checkpoint(epoch=epoch, coordinator=coordinator)
            self._store.expire()
        except ChtxnError as exc:
            log.warning("could not checkpoint or expire the ledger", extra={"error": str(exc)})

    def checkpoint(self, *, epoch: int, coordinator: str) -> int:
        """Write a checkpoint for the longest decided and settled prefix of the chain past the
        latest checkpoint (``protocol.ledger.checkpoint``), derived from what is read back.
        Returns its slot, or the latest checkpoint's when there is nothing new to summarise."""
        store = self._store
        latest = store.latest_checkpoint()
        after = latest.commit_seq if latest else 0
        slots = [
            int(r[0])
            for r in store._query(
                "read the commit slots", ledger_checkpoint.chain_slots_sql(store._database), after=after
            )
        ]
        pending = [r.commit_seq for r in store.committed_unpublished(after=after)]
        through = ledger_checkpoint.settled_through(after, slots, pending)
        if through <= after:
            return after
        rows = store._query(
            "read the head to checkpoint", ledger_sql.head_sql(store._database), after=after, through=through
        )
        seq, offsets = ledger_checkpoint.overlay(latest, rows)
        row = ledger_checkpoint.checkpoint_row(store.pipeline, seq, offsets, epoch=epoch, coordinator=coordinator)
        store._insert(row, naming.checkpoint_token(store.pipeline, seq), f"checkpoint the ledger at slot {seq}")
        store.commit_point.forget_through(seq)  # claims of covered slots are needed no more
        return seq

    def expire(self) -> int:
        """Delete the history older than the retention that no reader needs
        (``protocol.ledger.checkpoint``); returns the last slot whose rows are now gone (0: none)."""
        store = self._store
        before_ms = int((self._wall_clock() - self.retention_s) * 1000)
        horizon = store._query(
            "find the expiry horizon", ledger_checkpoint.expiry_horizon_sql(store._database), before_ms=before_ms
        )
        if not horizon:
            return 0
        through, at_ms = int(horizon[0][0]), int(horizon[0][1])
        if through > self._expired_through:
            store._command(
                "expire old checkpoints", ledger_checkpoint.expire_checkpoints_sql(store._database), through=through
            )
            store._command(
                "expire old ledger rows",
                ledger_checkpoint.expire_rows_sql(store._database),
                through=through,
                before_ms=at_ms,
            )
            self._expired_through = through
        return through
