"""Whether the pipeline has had its first start: the one fact ``pipeline.start_from`` depends on.

``start_from`` applies to the partitions the pipeline sees at its first start; every partition it
first sees later starts from its earliest offset (``coordinator.offsets.source``). The first start is
recorded by INITIAL rows (docs/architecture.md §9): one per partition its first leader saw, or, when
it saw none (only ``re:`` patterns, none matching yet), one INITIAL row with no partition, so a run
in which no topic matched still counts as the first start."""

from __future__ import annotations

from coordinator.ledger.store import LedgerStore
from protocol.ledger.rows import LedgerEvent, LedgerRow, qualified


def recorded(store: LedgerStore) -> bool:
    """True once any INITIAL row of the pipeline exists (with or without a partition)."""
    sql = (
        f"SELECT count() FROM {qualified(store._database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'INITIAL' LIMIT 1"
    )
    [(count,)] = store._query("read whether the pipeline started before", sql)
    return int(count) > 0


def record(store: LedgerStore, start_from: str, *, epoch: int, coordinator: str) -> None:
    """Record a first start that saw no partition (the first write wins)."""
    row = LedgerRow(
        pipeline=store.pipeline,
        txn="",
        event=LedgerEvent.INITIAL,
        epoch=epoch,
        coordinator=coordinator,
        reason=f'the first start saw no partition (start_from = "{start_from}"): every topic seen later starts '
        "from its earliest offset",
    )
    store._insert(row, f"{store.pipeline}/initial/first-start", "record the pipeline's first start")
