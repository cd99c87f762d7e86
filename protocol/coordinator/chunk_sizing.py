"""The START's ``chunk_rows``: how big a txn's chunks are, from the rate the partitions are read at.

A participant inserts each chunk as soon as it is cut, so what is left to insert at END is its
open chunk (plus any still in flight): the chunk size is the END -> WRITE-STATUS latency. Big
chunks cost ClickHouse least per row; small ones end a txn sooner. The coordinator asks for
chunks of about a ``CHUNKS_PER_TXN``-th of what the busiest partition will read in the next txn:
the rows a partition read per second in the last complete txn, times the interval, plus how far
it is behind its log end (a partition catching up reads at full speed, so it gets big chunks).
The participant's own ``participant.chunk_rows`` stays the upper bound, ``MIN_CHUNK_ROWS`` the
lower one. Placed by a sharding key, both are ``scale`` times larger (``protocol.shards.chunk_scale``):
each chunk is split over every shard, and each shard's part of it keeps the size it would have
placed by partition. The size is fixed per txn, so chunks still depend only on the records from its START.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from protocol.messages import TopicPartition

#: Chunks per partition a txn at the expected rate holds: about one of them is left at END.
CHUNKS_PER_TXN = 4
#: Below this an insert costs mostly its own overhead (an HTTP request, a part).
MIN_CHUNK_ROWS = 1_000


class ChunkSizer:
    """Learns per-partition read rates from complete txns; answers a START's ``chunk_rows``."""

    def __init__(self, *, interval_s: float, size_trigger_rows: int, scale: int = 1) -> None:
        self.interval_s = interval_s
        self.size_trigger_rows = size_trigger_rows
        self.scale = scale  # ``protocol.shards.chunk_scale``: the shards each chunk is split over, else 1
        self.rows_per_s: dict[TopicPartition, float] = {}

    def learn(self, rows: Mapping[TopicPartition, int], span_s: float) -> None:
        """A txn read ``rows`` per partition in ``span_s`` seconds (START to END)."""
        if span_s > 0:
            self.rows_per_s = {tp: n / span_s for tp, n in rows.items()}

    def chunk_rows(self, behind: Mapping[TopicPartition, int]) -> int:
        """The cap for the next txn's chunks, 0 (no cap) until a txn has been learnt from.

        ``behind``: per partition, log end minus read position as last heartbeated."""
        if not self.rows_per_s:
            return 0
        partitions = set(self.rows_per_s) | set(behind)
        expected = max(self.rows_per_s.get(tp, 0.0) * self.interval_s + max(0, behind.get(tp, 0)) for tp in partitions)
        expected = min(expected, self.size_trigger_rows / len(partitions))  # the trigger ends the txn there
        return self.scale * max(MIN_CHUNK_ROWS, math.ceil(expected / CHUNKS_PER_TXN))
