"""Sharded ClickHouse (``clickhouse.shards``): which shard a source partition's rows are staged on.

Placement by source partition: all of a partition's rows go to one shard, chosen by a pure
function of the topic and the partition, so no record is parsed, a participant stages each of its
partitions on one shard only, and a partition's offsets stay contiguous there. The partitions of
one topic go round the shards in turn, starting at a shard the topic's name picks (``crc32``), so
a topic of ``n`` partitions spreads evenly over up to ``n`` shards.

Nothing here depends on the placement being the same in every process: commit step 5 sums each
source partition's rows over every shard, and publish moves each shard's stage table into that
shard's own table, so a participant that placed a partition elsewhere (another ``clickhouse.shards``)
stages rows that are counted and published where they are, once.
"""

from __future__ import annotations

import zlib
from urllib.parse import urlsplit

#: The shards a single server is: one, the server of ``clickhouse.url``.
ONE = 1


def shard_of(topic: str, partition: int, shards: int) -> int:
    """The 0-based shard of ``topic``'s ``partition`` among ``shards``."""
    if shards < 1:
        raise ValueError(f"a cluster has at least one shard, not {shards}")
    return (zlib.crc32(topic.encode()) + partition) % shards


def label(index: int) -> str:
    """How logs, errors and tables name the 0-based shard ``index``: ``shard 1`` first."""
    return f"shard {index + 1}"


def address(url: str) -> str:
    """``host:port`` of a shard's URL, without the user or password it may carry."""
    parts = urlsplit(url)
    port = parts.port or (8443 if parts.scheme == "https" else 8123)
    return f"{parts.hostname or 'localhost'}:{port}"


def where(index: int, url: str) -> str:
    """``shard 2 (host:port)``: a shard in a message an operator reads."""
    return f"{label(index)} ({address(url)})"
