"""Publishing after the commit point, at its edges: target ALTERs around a publish, clean-ups
cut short, a second leader meeting the first one's leftovers.

Real ``Leader``s in threads against the embedded stack, with test code playing the participants;
failpoints hold or fail a leader at a chosen step. Every test ends with the exactly-once oracle.
"""

from __future__ import annotations

from collections import Counter

import pytest

from clients import failpoints
from coordinator import leader as leader_module, lease as lease_module
from coordinator.dead_letters.publisher import ensure_table
from coordinator.dead_letters.view import read_letters
from protocol import naming
from protocol.messages import TopicPartition
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import committed_through, good, participants, produce_values
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

WAIT_S = 60.0


def published_rows(pipeline: Pipeline, txn: str) -> int:
    """PUBLISHED ledger rows of ``txn`` (one, once it is published)."""
    db = pipeline.cfg.clickhouse.database
    return int(
        pipeline.client().command(
            f"SELECT count() FROM `{db}`.chtxn_ledger WHERE pipeline = {{p:String}} AND txn = {{t:String}} "
            "AND event = 'PUBLISHED'",
            parameters={"p": pipeline.cfg.name, "t": txn},
        )
    )


def first_txn_with_rows(participants: ScriptedParticipants) -> str:
    return next(s.txn for s in reversed(participants.statuses) if s.rows)


def leftovers(pipeline: Pipeline, txn: str) -> list[str]:
    """The tables of ``txn`` still in the database (its stage table and any table named after it)."""
    return [t for t in pipeline.stage_tables() if f"__{txn}" in t]


def alter(pipeline: Pipeline, clause: str) -> None:
    pipeline.client().command(f"ALTER TABLE `{pipeline.cfg.clickhouse.database}`.events {clause}")


@pytest.mark.parametrize("cut", ["drop-fails", "leader-stalls"])
def test_a_txn_published_after_an_alter_is_published_once_when_its_clean_up_is_cut_short(stack, tmp_path, cut):
    """Issue 29, defect 1: a txn committed before an ALTER of the target is published in the new
    structure; its clean-up then stops half-way (``drop-fails``: the drop raises, the same leader
    retries the publish; ``leader-stalls``: the leader stalls there and a new leader takes over).
    The retried publish or the take-over must not put the rows in again."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("restage1"))
    produced = pipeline.produce(500)
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        publishing = failpoints.arm("leader.before-publish", "pause*1", who="E1")
        e1.start()
        assert publishing.reached.wait(WAIT_S), "E1 never reached its first publish"
        k = first_txn_with_rows(participants)
        alter(pipeline, "ADD COLUMN note String DEFAULT 'new'")
        dropping = failpoints.arm("stage.mid-drop", "raise*1" if cut == "drop-fails" else "pause*1")
        failpoints.release("leader.before-publish")
        assert dropping.reached.wait(WAIT_S), "E1 never cleaned up after its publish"
        if cut == "leader-stalls":
            e2.start()  # E1 is held between its drops: E2 takes over and meets its leftovers
        wait_until(
            lambda: pipeline.target_count() >= produced and not leftovers(pipeline, k),
            WAIT_S,
            f"every record published and {k}'s tables dropped",
        )
        failpoints.release("stage.mid-drop")
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    assert published_rows(pipeline, k) == 1


def test_two_alters_around_one_publish_never_wedge_it(stack, tmp_path):
    """Issue 29, defect 2: the target is ALTERed after the commit point, then again while the
    publish in the first new structure is half done (two statements of one migration). The publish
    must follow the target to its latest structure and finish, every row once."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("twoalters"))
    produced = pipeline.produce(500)
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1):
        publishing = failpoints.arm("leader.before-publish", "pause*1", who="E1")
        e1.start()
        assert publishing.reached.wait(WAIT_S), "E1 never reached its first publish"
        alter(pipeline, "ADD COLUMN note String DEFAULT 'new'")
        moving = failpoints.arm("leader.mid-publish", "pause*1", who="E1")
        failpoints.release("leader.before-publish")
        assert moving.reached.wait(WAIT_S), "E1 never moved a first partition"
        alter(pipeline, "ADD COLUMN note2 UInt8 DEFAULT 7")
        failpoints.release("leader.mid-publish")
        wait_until(lambda: pipeline.target_count() >= produced, WAIT_S, "every record published")
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def produce_batch(
    pipeline: Pipeline, first_id: int, count: int
) -> tuple[dict[TopicPartition, int], set[tuple[str, int, int]]]:
    """``count`` records on each partition, every seventh malformed; returns the end offsets and
    the (topic, partition, offset) of the malformed ones."""
    ends, bad = {}, set()
    for tp in pipeline.partitions:
        values = [
            good(i) if i % 7 != 3 else b'{"id": %d, "user": "broken' % i for i in range(first_id, first_id + count)
        ]
        offsets = produce_values(pipeline, tp.partition, values)
        ends[tp] = offsets[-1] + 1
        bad |= {(tp.topic, tp.partition, o) for o, v in zip(offsets, values) if b"broken" in v}
    return ends, bad


def letters_in_topic(pipeline: Pipeline) -> Counter[tuple[str, int, int]]:
    return Counter((x.topic, x.partition, x.offset) for x in read_letters(pipeline.cfg))


def test_a_stale_leader_never_stops_the_new_leaders_dead_letters(stack, tmp_path):
    """Issue 29, defect 4: a stale leader, stalled between its move and its dead-letter publish,
    goes on after a new leader published letters. It must not fence the new leader's
    dead-letter publisher for good: later txns' rows and letters are published, each once."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("dlqfence"), settings={"participant.chunk_rows": 5})
    ensure_table(pipeline.client(), pipeline.cfg.clickhouse.database)
    ends, bad = produce_batch(pipeline, 0, 40)
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with participants(pipeline, tasks=1), leaders(e1, e2):
        stalled = failpoints.arm("leader.before-dead-letters", "pause*1", who="E1")
        e1.start()
        assert stalled.reached.wait(WAIT_S), "E1 never reached a dead-letter publish"
        e2.start()
        wait_until(
            lambda: committed_through(pipeline, ends) and set(letters_in_topic(pipeline)) == bad,
            WAIT_S,
            "E2 commits the first batch and publishes its letters",
        )
        failpoints.release("leader.before-dead-letters")  # E1 goes on: its dead-letter publish comes last
        assert "stepped down" in str(e1.ended(WAIT_S))
        more_ends, more_bad = produce_batch(pipeline, 40, 40)
        wait_until(
            lambda: committed_through(pipeline, more_ends) and set(letters_in_topic(pipeline)) == bad | more_bad,
            WAIT_S,
            "E2 commits the second batch and publishes its letters",
        )
        wait_until(lambda: pipeline.target_count() == 160 - len(bad | more_bad), WAIT_S, "every good record published")
    twice = {where: n for where, n in letters_in_topic(pipeline).items() if n > 1}
    assert twice == {}, f"letters published more than once: {twice}"
    assert_exactly_once(pipeline, 160 - len(bad | more_bad), pipeline.dead_letter_offsets(), nothing_lost=True)


def test_take_over_drops_the_probe_tables_a_participant_left_mid_isolation(stack, tmp_path):
    """Issue 29, defect 8: a participant that dies while isolating bad records leaves its probe
    table (``<stage>__probe_<crc>``), of a txn that went on to commit or of one that never did.
    The next take-over recognises and drops both."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("probes"))
    produced = pipeline.produce(100)
    db, name = pipeline.cfg.clickhouse.database, pipeline.cfg.name
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1):
        e1.start()
        wait_until(lambda: pipeline.target_count() == produced, WAIT_S, "every record published")
    k = first_txn_with_rows(participants)
    probes = [
        naming.probe_table(naming.stage_table("events", name, txn), f"{name}/{txn}/chunk") for txn in (k, "e1_t999")
    ]
    for probe in probes:
        pipeline.client().command(f"CREATE TABLE `{db}`.`{probe}` AS `{db}`.events ENGINE = Null")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e2):
        took_over = failpoints.arm("leader.after-take-over", "pause*1", who="E2")
        e2.start()
        assert took_over.reached.wait(WAIT_S), "E2 never took over"
        assert [t for t in pipeline.stage_tables() if t in probes] == []
        failpoints.release("leader.after-take-over")
        more = pipeline.produce(100, start_id=100)
        wait_until(lambda: pipeline.target_count() == produced + more, WAIT_S, "every record published")
    assert_exactly_once(pipeline, produced + more, nothing_lost=True)


def hold_publishes_until_committed(pipeline: Pipeline, leader: LeaderThread, txns: int) -> None:
    """``leader`` commits txns but publishes none (its first publish pauses) until ``txns`` wait."""
    held = failpoints.arm("leader.before-publish", "pause", who=leader.name)
    leader.start()
    assert held.reached.wait(WAIT_S), f"{leader.name} never reached a publish"
    wait_until(
        lambda: len(pipeline.ledger().committed_unpublished()) >= txns,
        WAIT_S,
        f"{txns} committed txns waiting for their publish",
    )


def test_a_long_roll_forward_keeps_the_new_leaders_lease(stack, tmp_path, monkeypatch, caplog):
    """Issue 29, defect 8: a take-over that rolls many committed txns forward takes longer than
    ``LOOP_STALL_LIMIT_S`` in all, but makes progress at every txn: the new leader keeps
    heartbeating (a lapsed lease would let a standby roll forward beside it)."""
    monkeypatch.setattr(lease_module, "LOOP_STALL_LIMIT_S", 3.0)
    pipeline = make_pipeline(stack, tmp_path, unique_name("longroll"))
    pipeline.produce(200)
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1, e2):
        hold_publishes_until_committed(pipeline, e1, 6)
        failpoints.arm("leader.before-publish", "stall(1)", who="E2")  # each roll-forward takes 1 s
        took_over = failpoints.arm("leader.after-take-over", "pause*1", who="E2")
        e2.start()
        assert took_over.reached.wait(WAIT_S), "E2 never took over"
        lapsed = [r for r in caplog.records if r.threadName == "leader-heartbeat-e2" and "no longer" in r.getMessage()]
        assert lapsed == [], "E2's lease lapsed during its take-over"
        failpoints.release("leader.after-take-over")
        wait_until(lambda: not pipeline.ledger().committed_unpublished(), WAIT_S, "every committed txn published")
    assert_exactly_once(pipeline, pipeline.target_count(), nothing_lost=True)


def test_a_leader_whose_publishes_keep_failing_still_stops(stack, tmp_path, monkeypatch):
    """Issue 29, defect 8: SIGTERM (``stop``) of a leader whose publishes fail every time ends it
    after ``SHUTDOWN_GRACE_S``; the next leader publishes what it left."""
    monkeypatch.setattr(leader_module, "SHUTDOWN_GRACE_S", 3.0)
    pipeline = make_pipeline(stack, tmp_path, unique_name("wedgestop"))
    produced = pipeline.produce(200)
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1, e2):
        failing = failpoints.arm("leader.before-publish", "raise", who="E1")
        e1.start()
        assert failing.reached.wait(WAIT_S), "E1 never tried a publish"
        wait_until(lambda: failing.fired >= 3, WAIT_S, "E1's publish failed three times")
        e1.stop.set()
        assert "gave up" in str(e1.ended(WAIT_S))
        e2.start()
        wait_until(
            lambda: pipeline.target_count() >= produced and not pipeline.ledger().committed_unpublished(),
            WAIT_S,
            "E2 publishes what E1 left",
        )
    assert_exactly_once(pipeline, produced, nothing_lost=True)
