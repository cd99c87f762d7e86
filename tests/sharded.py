"""A pipeline into a sharded ClickHouse for tests (``clickhouse.shards``): the stack's endpoint is
shard 1, more embedded endpoints (each its own chDB process and data) are the others, every shard
has the local target table, and the oracle is counted over the union of the shards.

The oracle here reads each shard's ``(_topic, _partition, _offset)`` and judges them in Python
against the ledger's committed ranges, independently of ``chtxn verify --deep``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import clickhouse_connect

from embedded.clickhouse_process import EmbeddedClickHouse
from procs import free_port
from protocol import shards as shard_rules
from protocol.messages import TopicPartition
from tests.pipelines import TARGET_DDL, Pipeline, make_pipeline


def client_of(url: str):  # a clickhouse-connect client
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    return clickhouse_connect.get_client(host=host, port=int(port))


def make_sharded_pipeline(
    stack, shard_urls: list[str], tmp_path: Path, name: str, *, partitions: int = 6, settings: dict | None = None
) -> Pipeline:
    """A fresh pipeline whose shards are ``shard_urls`` (the stack's endpoint first, where the ledger
    lives), with its database and target table on every shard."""
    for url in shard_urls[1:]:
        client = client_of(url)
        client.command(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        client.command(TARGET_DDL.format(db=f"`{name}`", table="`events`"))
    return make_pipeline(
        stack,
        tmp_path,
        name,
        partitions=partitions,
        settings={"clickhouse.shards": shard_urls, **(settings or {})},
    )


def rows_per_shard(pipeline: Pipeline, table: str = "events") -> list[list[tuple[str, int, int]]]:
    """``(_topic, _partition, _offset)`` of every row of ``table`` on each shard, in shard order."""
    db = pipeline.cfg.clickhouse.database
    return [
        [
            tuple(r)
            for r in client_of(url).query(f"SELECT _topic, _partition, _offset FROM `{db}`.`{table}`").result_rows
        ]
        for url in pipeline.cfg.clickhouse.shards
    ]


def union_count(pipeline: Pipeline) -> int:
    db = pipeline.cfg.clickhouse.database
    return sum(
        int(client_of(url).command(f"SELECT count() FROM `{db}`.`events`")) for url in pipeline.cfg.clickhouse.shards
    )


def stage_tables_on_shards(pipeline: Pipeline) -> list[str]:
    db = pipeline.cfg.clickhouse.database
    marker = f"events__chtxn_{pipeline.cfg.name}__"
    return [
        name
        for url in pipeline.cfg.clickhouse.shards
        for (name,) in client_of(url)
        .query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, {p:String})",
            parameters={"db": db, "p": marker},
        )
        .result_rows
    ]


def assert_exactly_once_over_shards(
    pipeline: Pipeline,
    produced: int,
    dead_letters: dict[TopicPartition, set[int]] | None = None,
    *,
    by_partition: bool = True,
) -> None:
    """Every offset of the ledger's committed ranges exactly once over the union of the shards, nothing
    else, ``produced`` rows in all; ``by_partition``: each partition's rows on the shard its placement
    names. ``dead_letters`` (``Pipeline.dead_letter_offsets``): offsets of committed ranges expected on
    no shard."""
    expected: Counter[tuple[str, int, int]] = Counter()
    for commit in pipeline.ledger().commits():
        for r in commit.ranges:
            expected.update((r.topic, r.partition, o) for o in range(r.start, r.end))
    letters = {(tp.topic, tp.partition, o) for tp, offsets in (dead_letters or {}).items() for o in offsets}
    assert letters <= set(expected), f"dead letters outside every committed range: {sorted(letters - set(expected))}"
    for letter in letters:
        del expected[letter]
    shards = rows_per_shard(pipeline)
    found = Counter(row for rows in shards for row in rows)
    twice = {row: n for row, n in found.items() if n > 1}
    assert not twice, f"offsets stored more than once over the shards: {sorted(twice)[:10]}"
    assert set(found) == set(expected), (
        f"missing {sorted(set(expected) - set(found))[:10]}, not committed {sorted(set(found) - set(expected))[:10]}"
    )
    assert sum(found.values()) == produced
    for i, rows in enumerate(shards if by_partition else []):
        for topic, partition, _ in rows:
            assert shard_rules.shard_of(topic, partition, len(shards)) == i, (topic, partition, i)


@dataclass
class Shards:
    """The shards of a test: the stack's endpoint first, then ``extra`` (embedded endpoints of their own)."""

    urls: list[str]
    extra: list[EmbeddedClickHouse]

    def endpoint(self, index: int) -> EmbeddedClickHouse:
        """The endpoint of 0-based shard ``index`` (not the stack's, shard 0)."""
        return self.extra[index - 1]


@contextmanager
def more_shards(stack, tmp_path: Path, count: int) -> Iterator[Shards]:
    """The stack's endpoint and ``count`` more embedded endpoints: ``count + 1`` shards."""
    # fixed ports: a shard restarted in a test keeps its URL
    endpoints = [EmbeddedClickHouse(tmp_path / f"shard{i + 2}", free_port("127.0.0.1")) for i in range(count)]
    with ExitStack() as started:
        for endpoint in endpoints:
            started.enter_context(endpoint)
        yield Shards([stack.clickhouse_url, *(e.url for e in endpoints)], endpoints)


def config_with_shards(pipeline: Pipeline, urls: list[str], path: Path) -> Path:
    """A copy of ``pipeline``'s config file at ``path`` whose ``clickhouse.shards`` are ``urls``."""
    text = pipeline.config_path.read_text()
    listed = f"shards = {json.dumps(list(pipeline.cfg.clickhouse.shards))}"
    assert listed in text, text
    path.write_text(text.replace(listed, f"shards = {json.dumps(urls)}"))
    return path
