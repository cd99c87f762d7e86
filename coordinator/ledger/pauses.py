"""``chtxn pause`` / ``resume`` in the ledger: a marker in the next commit slot, then the history row.

Pause step 1: the marker (``protocol.ledger.pauses``) claims slot head + 1 through the commit point,
so the pause or resume is ordered against every commit and reset; a claim lost to a commit that
landed first reads the head again. Pause step 2: the PAUSED / RESUMED row with the marker's slot.
Pause step 3 (``cli.pause``): the ``Pause`` message, so that the running leader acts at once.
"""

from __future__ import annotations

import time

from clients import failpoints
from coordinator.ledger import commit_points
from coordinator.ledger.store import LedgerStore
from protocol.errors import ChtxnError
from protocol.ledger import pauses as ledger_pauses
from protocol.ledger.rows import LedgerRow

#: Claims of a slot before giving up (each lost one means a commit landed first).
CLAIM_TRIES = 10


class PauseNotRecorded(ChtxnError):
    """Commits kept taking the slot the pause or resume claimed."""


def record(ledger: LedgerStore, *, paused: bool, who: str, reason: str) -> LedgerRow:
    """Pause steps 1 and 2; returns the PAUSED or RESUMED row recorded (its slot the marker's).
    Refuses (``CommitPointMismatch``) when ``ledger`` claims by another commit point than the
    ledger records."""
    commit_points.ensure(ledger, who)
    for _ in range(CLAIM_TRIES):
        head_seq, _ = ledger.head()
        marker = ledger_pauses.marker_row(
            pipeline=ledger.pipeline,
            commit_seq=head_seq + 1,
            epoch=ledger.max_epoch(),
            paused=paused,
            who=who,
            reason=reason,
            now=time.time(),
        )
        failpoints.hit("pause.before-claim", who)
        if ledger.claim_commit(marker):  # Pause step 1: the chain's order
            row = ledger_pauses.history_row(marker)
            ledger.append(row)  # Pause step 2: the history, kept past ledger retention
            return row
    raise PauseNotRecorded(
        f"commits kept taking the commit slot the {'pause' if paused else 'resume'} claimed ({CLAIM_TRIES} tries): "
        "ClickHouse may be slow to answer; run the command again"
    )
