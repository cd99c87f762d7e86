"""The size trigger, as both sides apply it: ``transaction.size_trigger_rows`` bounds a txn.

Each partition of a txn stands for a share of the trigger (the trigger divided by the partitions
its START lists). A participant reports at once each time its rows cross a multiple of its share,
and once more when they reach ``full_rows``; there it stops reading until END. The coordinator
ends the txn (commit step 3) as soon as the rows reported reach the trigger, or one partition reports
itself full: a skewed topic then moves in txns of ``full_rows`` each, one after the other (the
END carries the next START), instead of one such txn per interval. So a txn ended by the trigger
holds at most the trigger plus ``SIZE_SLACK`` of it, to a poll batch per partition.
"""

from __future__ import annotations

#: How far past its share a partition reads before it waits for END.
SIZE_SLACK = 0.2


def share(size_trigger_rows: int, partitions: int) -> int:
    """Rows of the trigger one of ``partitions`` stands for (0: no trigger)."""
    return size_trigger_rows // max(1, partitions)


def full_rows(partition_share: int) -> int:
    """Rows after which a partition of that share stops reading until END (0: never)."""
    return partition_share + int(partition_share * SIZE_SLACK)
