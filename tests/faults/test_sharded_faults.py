"""Faults of a pipeline into a sharded ClickHouse (``clickhouse.shards``, issue 39): three real
embedded endpoints, each its own chDB process and data, real participant tasks, real leaders; a
leader stalled or killed between two shards' publishes, a shard frozen (SIGSTOP) through commit
and publish, a shard killed and restarted mid-txn, one shard's stage table failing commit step 5, a
shard down at publish time counted by the leader's metrics. Every test ends with the oracle over the
union of the shards (``tests.sharded``)."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from clients import failpoints
from protocol import shards as shard_rules
from protocol.config.parse import load_config
from tests.helpers import crash_a_coordinator_at, run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline
from tests.sharded import (
    assert_exactly_once_over_shards,
    client_of,
    config_with_shards,
    make_sharded_pipeline,
    more_shards,
    rows_per_shard,
    stage_tables_on_shards,
    union_count,
)

WAIT_S = 60.0
#: The two placements (``clickhouse.placement``): by source partition, and by a sharding key.
PLACEMENTS = {
    "partition": {},
    "sharding-key": {"clickhouse.placement": "sharding-key", "clickhouse.sharding_key": "cityHash64(user)"},
}


@pytest.fixture(scope="module")
def shards(stack, tmp_path_factory):
    with more_shards(stack, tmp_path_factory.mktemp("shards"), 2) as found:
        yield found


def _target_rows(pipeline, url: str) -> int:
    return int(client_of(url).command(f"SELECT count() FROM `{pipeline.cfg.clickhouse.database}`.`events`"))


def _staged_rows(pipeline, url: str) -> int:
    """Rows in the pipeline's stage tables on the shard at ``url``."""
    db = pipeline.cfg.clickhouse.database
    client = client_of(url)
    names = [n for n in stage_tables_on_shards(pipeline) if int(client.command(f"EXISTS TABLE `{db}`.`{n}`"))]
    return sum(int(client.command(f"SELECT count() FROM `{db}`.`{n}`")) for n in names)


def _idle(pipeline) -> bool:
    """Every committed txn is published and the latest has no stage table (no records waited for it)."""
    ledger = pipeline.ledger()
    return ledger.commits()[-1].stage_table == "" and all(t.state != "COMMITTED" for t in ledger.history(limit=50))


def _committed_txn(pipeline) -> str:
    """The txn a leader holds between two shards' publishes: the oldest COMMITTED (later ones may be too)."""
    return next(t.txn for t in reversed(pipeline.ledger().history(limit=50)) if t.state == "COMMITTED")


def test_a_leader_stalled_between_two_shards_publishes_is_rolled_forward_by_the_next(stack, shards, tmp_path):
    pipeline = make_sharded_pipeline(stack, shards.urls, tmp_path, unique_name("shpub"))
    produced = pipeline.produce(900)
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with participants(pipeline, tasks=2), leaders(e1, e2):
        between = failpoints.arm("leader.between-shard-publishes", "pause*1", who="E1")
        e1.start()
        assert between.reached.wait(WAIT_S), "E1 never published a first shard"
        k = _committed_txn(pipeline)
        assert _target_rows(pipeline, shards.urls[1]) == _target_rows(pipeline, shards.urls[2]) == 0
        assert _staged_rows(pipeline, shards.urls[1]) + _staged_rows(pipeline, shards.urls[2]) > 0, (
            "the txn held rows for the shards not yet published"
        )
        e2.start()  # seals, then rolls k forward: shard 1's stage table is empty, the others' are moved
        wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by E2")
        failpoints.release("leader.between-shard-publishes")  # E1 goes on: the rest is gone, published
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed")
        wait_until(lambda: isinstance(e1.outcome, str), WAIT_S, "E1 stepped down")
    assert_exactly_once_over_shards(pipeline, produced)
    wait_until(lambda: stage_tables_on_shards(pipeline) == [], WAIT_S, "no stage table left on any shard")


def test_a_txn_on_two_of_three_shards_is_rolled_forward_on_those_two_only(stack, shards, tmp_path):
    """Records wait only in partitions placed on shards 1 and 2, so a txn makes its stage tables there
    alone and its COMMITTED row names those two. Its leader stalls between their publishes; the next
    leader rolls it forward on exactly those two (a publish on shard 3 would find no stage table and
    never end) and shard 3 is never written."""
    # idle txns end at the interval: an empty txn prepared with nothing waiting has no stage table
    pipeline = make_sharded_pipeline(
        stack, shards.urls, tmp_path, unique_name("shtouch"), settings={"transaction.idle_interval_s": 0.5}
    )
    into = [tp.partition for tp in pipeline.partitions if shard_rules.shard_of(tp.topic, tp.partition, 3) != 2]
    touched = tuple(shard_rules.address(url) for url in shards.urls[:2])
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with participants(pipeline, tasks=2), leaders(e1, e2):
        e1.start()
        first = pipeline.produce(300, into=into)
        wait_until(lambda: union_count(pipeline) == first, WAIT_S, "the first records committed")
        wait_until(lambda: _idle(pipeline), WAIT_S, "every txn published, the latest with no stage table")
        between = failpoints.arm("leader.between-shard-publishes", "pause*1", who="E1")
        produced = first + pipeline.produce(600, start_id=first, into=into)
        assert between.reached.wait(WAIT_S), "E1 never published a first shard"
        k = _committed_txn(pipeline)
        [row] = [c for c in pipeline.ledger().commits() if c.txn == k]
        assert row.shards == touched and row.total_rows > 0, row
        assert _staged_rows(pipeline, shards.urls[1]) > 0, "the txn held rows for shard 2, not yet published"
        db = pipeline.cfg.clickhouse.database
        on_third = f"SELECT count() FROM system.tables WHERE database = '{db}' AND endsWith(name, '__{k}')"
        assert int(client_of(shards.urls[2]).command(on_third)) == 0, f"a stage table of {k} on shard 3"
        e2.start()  # seals, then rolls k forward on shards 1 and 2
        wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by E2")
        failpoints.release("leader.between-shard-publishes")
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed")
        wait_until(lambda: isinstance(e1.outcome, str), WAIT_S, "E1 stepped down")
    assert_exactly_once_over_shards(pipeline, produced)
    assert _target_rows(pipeline, shards.urls[2]) == 0
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    wait_until(lambda: stage_tables_on_shards(pipeline) == [], WAIT_S, "no stage table left on any shard")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_leader_killed_between_two_shards_publishes_is_rolled_forward_by_the_next(stack, shards, tmp_path, placement):
    """The coordinator process SIGKILLs itself (failpoint ``crash``) with one of three shards published."""
    pipeline = make_sharded_pipeline(
        stack, shards.urls, tmp_path, unique_name("shkill"), settings=PLACEMENTS[placement]
    )
    produced = pipeline.produce(900)
    with participants(pipeline, tasks=2):
        crash_a_coordinator_at(pipeline.config_path, "leader.between-shard-publishes", WAIT_S * 2)
        k = _committed_txn(pipeline)
        assert _target_rows(pipeline, shards.urls[1]) == _target_rows(pipeline, shards.urls[2]) == 0
        with coordinator(pipeline, coordinator_id="next"):
            wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by the next")
            wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed")
    assert_exactly_once_over_shards(pipeline, produced, by_partition=placement == "partition")


def test_a_shard_frozen_through_commit_and_publish_delays_its_rows_and_loses_none(stack, shards, tmp_path):
    """Shard 3's server is SIGSTOPped once a txn is counted, before its commit point: the commit (in the
    ledger, on shard 1) goes through, shards 1 and 2 publish, shard 3's rows wait for it to thaw."""
    pipeline = make_sharded_pipeline(stack, shards.urls, tmp_path, unique_name("shfrz"))
    produced = pipeline.produce(900)
    frozen = shards.endpoint(2)
    with participants(pipeline, tasks=2), coordinator(pipeline, coordinator_id="c1"):
        claiming = failpoints.arm("leader.before-commit", "pause*1", who="c1")
        try:
            assert claiming.reached.wait(WAIT_S), "no txn reached its commit point"
            k = _held_txn(pipeline)
            os.killpg(frozen.pid, signal.SIGSTOP)
            failpoints.release("leader.before-commit")
            wait_until(lambda: pipeline.ledger().txn(k).state == "COMMITTED", WAIT_S, f"{k} committed, shard 3 frozen")
            wait_until(
                lambda: _target_rows(pipeline, shards.urls[0]) > 0 and _target_rows(pipeline, shards.urls[1]) > 0,
                WAIT_S,
                "shards 1 and 2 published while shard 3 is frozen",
            )
            assert pipeline.ledger().txn(k).state == "COMMITTED", "not PUBLISHED while a shard has not moved its rows"
        finally:
            os.killpg(frozen.pid, signal.SIGCONT)
            failpoints.disarm()
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed once shard 3 thawed")
        wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published")
    assert_exactly_once_over_shards(pipeline, produced)


def _held_txn(pipeline) -> str:
    """The txn a leader holds at step 5 or its commit point: the oldest STARTED (the next may be too)."""
    return next(t.txn for t in reversed(pipeline.ledger().history(limit=50)) if t.state == "STARTED")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_shard_killed_and_restarted_mid_txn_loses_nothing(stack, shards, tmp_path, placement):
    """Shard 2's server is SIGKILLed while participants stage into it and started again on its data. By a
    sharding key, the chunks whose server sends shard 2 its rows fail after the other shards stored
    theirs: sent again, they are stored once on every shard."""
    pipeline = make_sharded_pipeline(
        stack, shards.urls, tmp_path, unique_name("shcrash"), settings=PLACEMENTS[placement]
    )
    produced = pipeline.produce(600)
    crashed = shards.endpoint(1)
    with participants(pipeline, tasks=2), coordinator(pipeline, coordinator_id="c1"):
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "the first records committed")
        staging = failpoints.arm("stage.before-insert", "pause*1")
        produced += pipeline.produce(600, start_id=produced)
        assert staging.reached.wait(WAIT_S), "no chunk of the second batch was staged"
        os.killpg(crashed.pid, signal.SIGKILL)
        failpoints.release("stage.before-insert")
        crashed.stop()
        crashed.start()
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S * 2, "every record committed after the restart")
    assert_exactly_once_over_shards(pipeline, produced, by_partition=placement == "partition")


def test_one_shards_stage_table_failing_step_5_aborts_the_txn_on_every_shard(stack, shards, tmp_path):
    """A row no participant staged appears in shard 3's stage table while the txn is counted: the txn
    aborts (on every shard: their stage tables are dropped) and its records commit in a later txn."""
    pipeline = make_sharded_pipeline(stack, shards.urls, tmp_path, unique_name("shchk"))
    produced = pipeline.produce(900)
    db = pipeline.cfg.clickhouse.database
    third = client_of(shards.urls[2])
    with participants(pipeline, tasks=2), coordinator(pipeline, coordinator_id="c1"):
        counting = failpoints.arm("leader.before-count", "pause*1", who="c1")
        try:
            assert counting.reached.wait(WAIT_S), "no txn was counted"
            k = _held_txn(pipeline)
            (stage,) = [n for n in stage_tables_on_shards(pipeline) if n.endswith(f"__{k}")][:1]
            tp = pipeline.partitions[0]
            third.command(
                f"INSERT INTO `{db}`.`{stage}` (id, user, amount, _topic, _partition, _offset) "
                f"VALUES (0, 'intruder', 0, '{tp.topic}', {tp.partition}, 1000000)"
            )
        finally:
            failpoints.release("leader.before-count")
        wait_until(lambda: pipeline.ledger().txn(k).state == "ABORTED", WAIT_S, f"{k} aborted")
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed by a later txn")
    assert not any(n.endswith(f"__{k}") for n in stage_tables_on_shards(pipeline)), "k's stage tables dropped"
    assert_exactly_once_over_shards(pipeline, produced)


def test_a_shard_removed_from_the_config_while_a_committed_txn_waits_there_stops_the_next_leader(
    stack, shards, tmp_path
):
    """Change is a fault: the leader dies between a txn's commit and its publish, and the next starts
    with shard 3 gone from ``clickhouse.shards``. It must not publish the other shards and record the
    txn PUBLISHED (shard 3's rows would be lost with its stage table): it stops, naming the txn and the
    shard. Started again with shard 3 listed, it publishes every shard's rows once."""
    pipeline = make_sharded_pipeline(stack, shards.urls, tmp_path, unique_name("shgone"))
    produced = pipeline.produce(900)
    two = tmp_path / "two-shards.toml"
    text = pipeline.config_path.read_text()
    two.write_text(text.replace(f', "{shards.urls[2]}"]', "]"))
    assert two.read_text() != text, "the config without shard 3"
    with participants(pipeline, tasks=2):
        crash_a_coordinator_at(pipeline.config_path, "leader.before-publish", WAIT_S * 2)
        k = _committed_txn(pipeline)
        assert _staged_rows(pipeline, shards.urls[2]) > 0, "the committed txn holds rows for shard 3"
        refused = run_chtxn("coordinator", "--config", str(two), timeout_s=WAIT_S)
        assert refused.returncode != 0
        gone = shard_rules.address(shards.urls[2])
        assert f"txn {k} is committed and not yet published, and has rows staged on {gone}" in refused.stderr
        assert pipeline.ledger().txn(k).state == "COMMITTED", "nothing published without shard 3"
        with coordinator(pipeline, coordinator_id="next"):
            wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by the next")
            wait_until(lambda: union_count(pipeline) == produced, WAIT_S, "every record committed")
    assert_exactly_once_over_shards(pipeline, produced)


def test_the_leaders_metrics_count_each_shards_rows_and_a_down_shards_failed_publishes(stack, shards, tmp_path):
    """Shard 3's server is SIGKILLed while a committed txn with rows for it waits before its publish: the
    leader counts the failed publishes under shard 3 alone (``chtxn_shard_publish_failures_total``), and
    once it is back and everything is published, each shard's ``chtxn_shard_rows_committed_total`` and
    ``chtxn_shard_rows_published_total`` are the rows that shard holds."""
    pipeline = make_sharded_pipeline(stack, shards.urls, tmp_path, unique_name("shmet"), partitions=6)
    produced = pipeline.produce(900)
    wheres = [shard_rules.where(i, url) for i, url in enumerate(shards.urls)]
    down = shards.endpoint(2)

    def for_shard_3(t) -> bool:  # a TxnSummary
        return t.state == "COMMITTED" and any(
            r.rows and shard_rules.shard_of(r.topic, r.partition, 3) == 2 for r in t.ranges
        )

    with participants(pipeline, tasks=2), coordinator(pipeline, coordinator_id="c1") as service:

        def value(name: str, shard: str) -> float | None:
            labels = {"pipeline": pipeline.cfg.name, "shard": shard}
            return service.metrics.registry.get_sample_value(name, labels)

        assert [value("chtxn_shard_publish_failures_total", w) for w in wheres] == [0, 0, 0]
        publishing = failpoints.arm("leader.before-publish", "pause*1", who="c1")
        try:
            assert publishing.reached.wait(WAIT_S), "no txn reached its publish"
            wait_until(
                lambda: any(for_shard_3(t) for t in pipeline.ledger().history(limit=50)),
                WAIT_S,
                "a txn with rows for shard 3 committed, its publish waiting",
            )
            os.killpg(down.pid, signal.SIGKILL)
            down.stop()
        finally:
            failpoints.release("leader.before-publish")
        wait_until(
            lambda: (value("chtxn_shard_publish_failures_total", wheres[2]) or 0) >= 1,
            WAIT_S,
            "a failed publish on shard 3 counted",
        )
        down.start()
        wait_until(lambda: union_count(pipeline) == produced, WAIT_S * 2, "every record published once shard 3 is back")
        assert [value("chtxn_shard_publish_failures_total", w) for w in wheres[:2]] == [0, 0]
        placed = [len(rows) for rows in rows_per_shard(pipeline)]
        assert [value("chtxn_shard_rows_committed_total", w) for w in wheres] == placed
        assert [value("chtxn_shard_rows_published_total", w) for w in wheres] == placed
        assert sum(placed) == produced and all(placed), placed
    assert_exactly_once_over_shards(pipeline, produced)


def test_participants_on_two_shards_hold_under_a_coordinator_on_three_until_they_run_with_three_too(
    stack, shards, tmp_path, caplog
):
    """Change is a fault: a shard added to a running sharded pipeline (issue 39), as a roll-out does it,
    one process after the other. The coordinator is restarted with three shards first (a third shard in
    ``clickhouse.shards``, or in the cluster a Distributed target's shards are learnt from) while the
    participant tasks still place partitions over two: every START says three, so the tasks hold their
    partitions (nothing staged: the shard they would pick may have no stage table in the txn) and the
    txns commit empty while the records wait. Once the tasks run with three shards too, every record
    lands once, on the shard its partition is placed on over three, and ``chtxn verify --deep`` agrees."""
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
