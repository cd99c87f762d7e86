"""Commit step 5's verdict on a txn's stage table, from the runner's ``Counted``. Pure.

A txn may reach the commit point only when its stage table holds exactly the rows its
participants reported (and, with the metadata columns, each partition's rows and offsets match
its WRITE-STATUS), the target's structure still matches the stage table's, every partition
starts where the ledger head ends, and no topic it read was deleted and created again. Anything
else aborts the txn before the commit point, and its records are read again.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.coordinator.events import AbortKind, Counted, PartitionStats, Txn
from protocol.messages import TopicPartition


def verdict(txn: Txn, counted: Counted, base: Callable[[TopicPartition], int]) -> tuple[str, AbortKind] | None:
    """Why ``txn`` must abort, and how to file it; None when it may commit. ``base`` gives where each
    partition's next txn must start (``CoordinatorState.base``)."""
    if counted.log_changed:
        return counted.log_changed, AbortKind.LOG_CHANGED
    if counted.count is None:
        return f"could not count the stage table: {counted.error}", AbortKind.COUNT_FAILED
    if counted.altered:
        why = (
            f"the target table changed after the stage table was made ({counted.altered}); "
            "the next txn stages in the new structure"
        )
        return why, AbortKind.TARGET_ALTERED
    if counted.count != txn.rows:
        why = f"row-count mismatch: stage table holds {counted.count}, participants reported {txn.rows}"
        return why, AbortKind.ROW_COUNT_MISMATCH
    wrong = partition_mismatch(txn, counted.partitions)
    if wrong:
        return f"row-count mismatch: {wrong}", AbortKind.ROW_COUNT_MISMATCH
    stale = {tp: o for tp, o in txn.start.items() if o != base(tp)}
    if stale:
        tp, o = next(iter(sorted(stale.items())))
        return f"{tp.topic}-{tp.partition} started at {o}, ledger head is {base(tp)}", AbortKind.OFFSET_MISMATCH
    return None


def partition_mismatch(txn: Txn, stats: dict[TopicPartition, PartitionStats] | None) -> str:
    """How the stage table's rows of each partition differ from its WRITE-STATUS ("" if they agree)."""
    if stats is None:
        return ""
    for tp in sorted(set(stats) | set(txn.statuses)):
        ws = txn.statuses.get(tp)
        got = stats.get(tp)
        rows, held = (ws.rows if ws else 0), (got.rows if got else 0)
        if held != rows:
            return f"{tp.topic}-{tp.partition}: stage table holds {held} rows, its participant reported {rows}"
        if got and ws and not (ws.start_offset <= got.min_offset and got.max_offset < ws.end_offset):
            return (
                f"{tp.topic}-{tp.partition}: stage table holds offsets {got.min_offset}..{got.max_offset}, "
                f"outside the reported [{ws.start_offset}, {ws.end_offset})"
            )
    return ""
