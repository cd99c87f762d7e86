"""A sharded ClickHouse (``clickhouse.shards``, issue 39) under the real Spark participant job and a
coordinator process (``tests.e2e.processes``): three real embedded endpoints (the stack's and two of
``tests.sharded.more_shards``), six source partitions, one malformed record among them. It must end
with the oracle over the union of the shards (every committed offset once, on the shard its partition
is placed on, the malformed one dead-lettered and on no shard) and ``chtxn verify --deep`` clean.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.processes import running
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.sharded import (
    assert_exactly_once_over_shards,
    make_sharded_pipeline,
    more_shards,
    rows_per_shard,
    union_count,
)

pytestmark = pytest.mark.e2e

PARTITIONS = 6
RECORDS = 6_000  # record i goes to partition i % 6 at offset i // 6; the last one is malformed
BAD_PARTITION, BAD_OFFSET = (RECORDS - 1) % PARTITIONS, (RECORDS - 1) // PARTITIONS


def test_six_partitions_over_three_shards_with_a_dead_letter_land_once(stack, tmp_path):
    with more_shards(stack, tmp_path / "shards", 2) as shards:
        pipeline = make_sharded_pipeline(
            stack,
            shards.urls,
            tmp_path,
            unique_name("shjob"),
            partitions=PARTITIONS,
            settings={"participant.chunk_rows": 500},
        )
        produced = pipeline.produce(RECORDS, bad_every=RECORDS)
        good = produced - 1
        with running(pipeline, tmp_path, slots=2) as procs:
            wait_until(lambda: procs.alive() or union_count(pipeline) >= good, 300, f"{good} rows over the shards")
            dead = wait_until(lambda: procs.alive() or pipeline.dead_letter_offsets(), 60, "the dead letter published")

        assert {(tp.partition, frozenset(o)) for tp, o in dead.items()} == {(BAD_PARTITION, frozenset({BAD_OFFSET}))}
        assert_exactly_once_over_shards(pipeline, good, dead)
        assert all(rows for rows in rows_per_shard(pipeline)), "every shard holds rows of its two partitions"
        verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        report = json.loads(verified.stdout)
        assert report["ok"], report["anomalies"]
        ((table, deep),) = report["tables"].items()
        assert (table, deep["rows_in_target"]) == ("events", good), deep
