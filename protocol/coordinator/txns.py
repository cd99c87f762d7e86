"""The order of the leader's txns in flight (``CoordinatorState.txns``, oldest first). Pure.

Txns are kept in the order they started. Each names the txn it was pipelined after; an abort
takes with it every txn after the aborted one (the cascade). Verifying and the commit point
(commit steps 5 and 6) take the oldest uncommitted txn only, and publishing (commit step 7) the
oldest committed one, so commits and publishes both happen strictly in txn order.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.coordinator.events import Phase, Txn

#: Started and not yet ended: participants are reading into it.
OPEN = (Phase.COLLECTING, Phase.ENDING)
#: Started and not yet past the commit point.
UNCOMMITTED = (Phase.COLLECTING, Phase.ENDING, Phase.COMPLETE, Phase.VERIFYING, Phase.COMMITTING)


def find(txns: Sequence[Txn], txn_id: str) -> Txn | None:
    return next((t for t in txns if t.id == txn_id), None)


def follows(txns: Sequence[Txn], later: Txn, earlier: Txn) -> bool:
    """``later`` was pipelined after ``earlier``, directly or through txns still in ``txns``."""
    after = later.after
    while after is not None:
        if after == earlier.id:
            return True
        parent = find(txns, after)
        after = parent.after if parent else None
    return False


def cascade(txns: Sequence[Txn], txn: Txn) -> list[Txn]:
    """``txn`` and every txn that aborts with it: those pipelined after it."""
    return [txn] + [t for t in txns if follows(txns, t, txn)]


def older_uncommitted(txns: Sequence[Txn], txn: Txn) -> bool:
    """Some txn older than ``txn`` is not committed yet (``txn`` may not end)."""
    return any(t.phase in UNCOMMITTED for t in txns[: txns.index(txn)])


def is_oldest_uncommitted(txns: Sequence[Txn], txn: Txn) -> bool:
    """Every txn before ``txn`` is committed (publishing): ``txn`` is next to verify and commit."""
    for t in txns:
        if t is txn:
            return True
        if t.phase is not Phase.PUBLISHING:
            return False
    return False


def is_oldest_publishing(txns: Sequence[Txn], txn: Txn) -> bool:
    """``txn`` is the oldest committed txn not yet published: next to publish."""
    return next((t for t in txns if t.phase is Phase.PUBLISHING), None) is txn
