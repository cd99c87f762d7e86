"""Change is a fault: a shard added to a running sharded pipeline (issue 39), as a roll-out does it,
one process after the other. The coordinator is restarted with three shards first (a third shard in
``clickhouse.shards``, or in the cluster a Distributed target's shards are learnt from) while the
participant tasks still place partitions over two: every START says three, so the tasks hold their
partitions (nothing staged: the shard they would pick may have no stage table in the txn) and the
txns commit empty while the records wait. Once the tasks run with three shards too, every record
lands once, on the shard its partition is placed on over three, and ``chtxn verify --deep`` agrees.
"""

from __future__ import annotations

import logging

import pytest

from protocol.config.parse import load_config
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline
from tests.sharded import (
    assert_exactly_once_over_shards,
    config_with_shards,
    make_sharded_pipeline,
    more_shards,
    union_count,
)

WAIT_S = 60.0


@pytest.fixture(scope="module")
def shards(stack, tmp_path_factory):
    with more_shards(stack, tmp_path_factory.mktemp("shards"), 2) as found:
        yield found


def test_participants_on_two_shards_hold_under_a_coordinator_on_three_until_they_run_with_three_too(
    stack, shards, tmp_path, caplog
):
    pipeline = make_sharded_pipeline(stack, shards.urls, tmp_path, unique_name("shroll"), partitions=6)
    two = config_with_shards(pipeline, shards.urls[:2], tmp_path / "two-shards.toml")
    before = Pipeline(load_config(str(two)), two, pipeline.partitions)  # the tasks' config, not yet rolled out
    produced = pipeline.produce(1_200)
    caplog.set_level(logging.ERROR, logger="protocol.participant.partitions")
    with coordinator(pipeline):
        with participants(before, tasks=2):
            wait_until(lambda: len(pipeline.ledger().commits()) >= 3, WAIT_S, "three txns committed meanwhile")
            assert union_count(pipeline) == 0, "a task placing over two shards staged under a START of three"
            assert all(r.start == r.end for c in pipeline.ledger().commits() for r in c.ranges), "an offset moved"
        assert "places partitions by partition over 3 shards and this participant over 2" in caplog.text
        with participants(pipeline, tasks=2):
            wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed over three shards")
    assert_exactly_once_over_shards(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep")
    assert verified.returncode == 0, verified.stdout + verified.stderr
