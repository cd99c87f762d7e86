"""Sharded ClickHouse (``clickhouse.shards``): which shard a row is staged on.

``clickhouse.placement = "partition"`` (the default): all of a source partition's rows go to one
shard, chosen by a pure function of the topic and the partition, so no record is parsed, a
participant stages each of its partitions on one shard only, and a partition's offsets stay
contiguous there. The partitions of one topic go round the shards in turn, starting at a shard the
topic's name picks (``crc32``), so a topic of ``n`` partitions spreads evenly over up to ``n`` shards.

``"sharding-key"``: each row goes where a ``Distributed`` table with ``clickhouse.sharding_key`` and
``clickhouse.shard_weights`` would put it (ClickHouse's ``createBlockSelector``: the key's value as
an unsigned integer of 32 bits, or 64 for a 64-bit key, modulo the total weight, each shard owning
as many consecutive slots as its weight). ClickHouse evaluates it, not Python: a chunk goes to one
shard (the one its partition is placed on), whose server parses it once and sends every other
shard its rows in one insert of its own (``ShardRouter``). Each shard's insert carries the chunk's
deduplication token, so a chunk sent again is stored once on every shard. The key must be
deterministic (``key_problem``): a retried chunk must place every row as the first try did. Since
every chunk becomes an insert (and a part) on every shard, chunks placed by key hold ``chunk_scale``
times the rows, so that each shard's part of one is about as large as a chunk placed by partition.

Commit step 5 sums each source partition's rows over the txn's shards, and publish moves each
shard's stage table into that shard's own table, so a row is counted and published where it was
staged, once. Placed by partition, a txn has stage tables only on the shards whose partitions had
records waiting (``StartCommit.shards``): a participant that places partitions over another count of
shards (another ``clickhouse.shards`` or placement) could find no stage table on the shard it picks,
so it holds them instead (``protocol.participant.partitions``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from urllib.parse import quote as url_quote, urlencode, urlsplit

from protocol.framing import MetadataInsert

#: The shards a single server is: one, the server of ``clickhouse.url``.
ONE = 1


def shard_of(topic: str, partition: int, shards: int) -> int:
    """The 0-based shard of ``topic``'s ``partition`` among ``shards``."""
    if shards < 1:
        raise ValueError(f"a cluster has at least one shard, not {shards}")
    return (zlib.crc32(topic.encode()) + partition) % shards


def placed_count(shards: Sequence[str], placement: str) -> int:
    """The shards partitions are placed on: ``len(shards)`` when ``placement`` is by partition over
    several, else 0 (one server, or rows placed by a sharding key: every txn on every shard). The
    leader makes a txn's stage tables on some of these only (``StartCommit.shards``)."""
    return len(shards) if placement == "partition" and len(shards) > 1 else 0


def chunk_scale(placement: str, shards: int) -> int:
    """How many times the rows of a chunk placed by partition a chunk holds (``participant.chunk_rows``
    and the START's cap alike): ``shards`` by a sharding key, whose every chunk is one insert, and one
    part, on each of the ``shards``; 1 by partition. Every shard's insert and part costs ClickHouse a
    fixed amount of work whatever its rows, so each shard's part of a chunk is kept about as large as
    a chunk placed by partition. A function of the config only: a txn's chunks still depend only on
    its records and its START."""
    return max(1, shards) if placement == "sharding-key" else 1


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


#: Functions whose value differs between two evaluations of one row: a key using one would place a
#: retried chunk's rows elsewhere than its first try did.
_NONDETERMINISTIC = re.compile(
    r"\b(rand\w*|random\w*|generateUUID\w*|generateULID|generateSnowflakeID|now\w*|today|yesterday|"
    r"rowNumberIn\w*|blockNumber|blockSize|runningDifference\w*|runningAccumulate|neighbor|hostName|fqdn|"
    r"uptime|serverUUID|currentDatabase|currentUser|queryID|initialQueryID|shardNum|shardCount)\s*\(",
    re.IGNORECASE,
)


def key_problem(key: str) -> str:
    """Why ``key`` cannot place rows (a function whose value changes between tries), "" when it can."""
    if not key.strip():
        return 'clickhouse.placement = "sharding-key" needs clickhouse.sharding_key, the Distributed table\'s key'
    if found := _NONDETERMINISTIC.search(key):
        return (
            f"{found.group(1)}() gives a row another value on every try, so a chunk sent again would place its rows "
            "on other shards than the first try and store them twice: use a key of the row's columns only, e.g. "
            "cityHash64(customer_id)"
        )
    return ""


def slots(weights: Sequence[int]) -> list[int]:
    """The 0-based shard of each slot: shard ``i`` owns ``weights[i]`` consecutive slots, in shard order."""
    return [i for i, weight in enumerate(weights) for _ in range(weight)]


def placement_sql(key: str, weights: Sequence[int], destinations: Sequence[str]) -> str:
    """The ClickHouse expression of a row's destination among ``destinations`` (one per shard, in
    shard order), as a Distributed table with sharding key ``key`` and ``weights`` places it."""
    owner = slots(weights)
    k = f"({key})"
    slot = f"multiIf(byteSize({k}) <= 4, toUInt64(toUInt32({k})) % {len(owner)}, toUInt64({k}) % {len(owner)})"
    return "[" + ", ".join(_literal(destinations[i]) for i in owner) + f"][{slot} + 1]"


class ShardRouter:
    """The statement that stages a chunk on every shard by ``key`` (``clickhouse.sharding_key``), sent
    to one shard's server: ``INSERT INTO FUNCTION url(...) PARTITION BY <placement> SELECT ...``. The
    destination of each row is the address (``host:port``) of its shard, put into the URL in place of
    ``{_partition_id}``; each shard's insert is ``INSERT INTO <stage> (columns) FORMAT Native`` with
    ``settings`` (the chunk's token among them) in its URL. ``login``: ``headers(...)`` with the user
    and password for every shard ("" for none)."""

    def __init__(self, urls: Sequence[str], key: str, weights: Sequence[int], *, login: str = "") -> None:
        schemes = {urlsplit(u).scheme for u in urls}
        if len(schemes) != 1:
            raise ValueError(f"the shards of a sharding key must share one scheme, not {', '.join(sorted(schemes))}")
        self.scheme = schemes.pop()
        self.placement = placement_sql(key, weights or [1] * len(urls), [address(u) for u in urls])
        self.login = login

    def statement(self, insert: MetadataInsert, select: str, settings: Mapping[str, object]) -> str:
        """The routed insert of ``select`` (``MetadataInsert.select``) into ``insert``'s table, every shard's
        insert with ``settings``."""
        into = f"INSERT INTO `{insert.database}`.`{insert.table}` ({insert.names}) FORMAT Native"
        query = urlencode({"query": into, **{k: _setting(v) for k, v in settings.items()}}, quote_via=url_quote)
        url = f"{self.scheme}://{{_partition_id}}/?{query}"
        args = f"{_literal(url)}, 'Native', {_literal(', '.join(insert.columns))}" + (
            f", {self.login}" if self.login else ""
        )
        return f"INSERT INTO FUNCTION url({args}) PARTITION BY {self.placement} {select}"


def url_login(user: str, password: str) -> str:
    """``headers(...)`` that log ClickHouse's ``url()`` in to a shard as ``user``."""
    return f"headers('X-ClickHouse-User' = {_literal(user)}, 'X-ClickHouse-Key' = {_literal(password)})"


def _setting(value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
