"""Where a partition starts: gaps left by retention (``on_gap``) and the initial offset of a new one.

The embedded broker cannot delete records (no DeleteRecords), so retention is played by a
``SourceOffsets`` subclass, patched into the leaders, whose low watermarks are raised by the test:
everything the coordinator decides from them is real. Real leaders in threads, test code as
participants.
"""

from __future__ import annotations

from typing import ClassVar

from confluent_kafka import Consumer, TopicPartition as KafkaTP

from clients import failpoints
from coordinator import leader as leader_module
from coordinator.offsets.source import SourceOffsets
from protocol.messages import TopicPartition
from tests.helpers import unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline, make_pipeline


class Retention(SourceOffsets):
    """A leader's view of the source with the broker's low watermarks raised to ``Retention.low`` (records deleted)."""

    low: ClassVar[dict[TopicPartition, int]] = {}

    def watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        return {tp: (max(low, self.low.get(tp, 0)), high) for tp, (low, high) in super().watermarks(tps).items()}


def committed_starts(pipeline: Pipeline, tp: TopicPartition) -> list[int]:
    return [r.start for c in pipeline.ledger().commits() for r in c.ranges if r.tp == tp and r.end > r.start]


def gap_rows(pipeline: Pipeline) -> list[tuple]:
    return [(g.tp, g.start, g.end) for row in pipeline.ledger().gaps() for g in row.ranges]


def test_on_gap_skip_goes_on_from_the_low_watermark_and_records_the_gap_once(stack, tmp_path, monkeypatch):
    """Defect 4: with on_gap = skip the head must not win over the skipped-to offset (START from
    deleted offsets aborts every txn), for a gap found at take-over and one that opens while
    leading; each gap is one GAP row, however many leaders meet it."""
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("gapskip"), partitions=1, settings={"pipeline.on_gap": "skip"}
    )
    tp = pipeline.partitions[0]
    pipeline.produce(100)
    monkeypatch.setattr(leader_module, "SourceOffsets", Retention)
    Retention.low = {}
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1):
        e1.start()
        wait_until(lambda: pipeline.target_count() == 100, 60, "the first 100 records committed")
        e1.stop.set()
        e1.ended(60)
        pipeline.produce(100, start_id=100)
        Retention.low = {tp: 150}  # retention took 100..149 before they were read
        e2 = LeaderThread(pipeline, 2, "E2").start()
        wait_until(lambda: pipeline.target_count() == 150, 60, "offsets 150..199 committed")
        assert committed_starts(pipeline, tp)[-1] == 150
        Retention.low = {tp: 260}  # a gap that opens while E2 leads (its records are gone before they come)
        wait_until(
            lambda: gap_rows(pipeline) == [(tp, 100, 150), (tp, 200, 260)] or None, 30, "the second gap recorded"
        )
        pipeline.produce(100, start_id=200)
        wait_until(lambda: pipeline.target_count() == 190, 60, "offsets 260..299 committed")
        assert committed_starts(pipeline, tp)[-1] == 260
        e2.stop.set()
        e2.ended(60)
        e3 = LeaderThread(pipeline, 3, "E3").start()  # meets no new gap
        wait_until(
            lambda: (
                pipeline.ledger().max_epoch() == 3
                and pipeline.ledger().commit_at(pipeline.ledger().head()[0]).epoch == 3
            ),
            60,
            "E3 commits",
        )
        e3.stop.set()
        e3.ended(60)
    assert gap_rows(pipeline) == [(tp, 100, 150), (tp, 200, 260)]
    aborts = [
        t.reason
        for t in pipeline.ledger().history(limit=500, state="ABORTED")
        if "started at" in t.reason and not t.reason.startswith("cascade")
    ]
    assert len(aborts) <= 1, f"txns from deleted offsets kept aborting: {aborts}"
    anomalies = pipeline.ledger().audit()
    assert len(anomalies) == 2 and all("recorded as skipped" in a for a in anomalies), anomalies


def test_on_gap_fail_stops_the_leader_with_the_gap_and_what_to_do(stack, tmp_path, monkeypatch):
    pipeline = make_pipeline(stack, tmp_path, unique_name("gapfail"), partitions=1)
    tp = pipeline.partitions[0]
    pipeline.produce(50)
    monkeypatch.setattr(leader_module, "SourceOffsets", Retention)
    Retention.low = {}
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1):
        e1.start()
        wait_until(lambda: pipeline.target_count() == 50, 60, "the first 50 records committed")
        e1.stop.set()
        e1.ended(60)
        pipeline.produce(50, start_id=50)
        Retention.low = {tp: 70}
        e2 = LeaderThread(pipeline, 2, "E2").start()
        outcome = e2.ended(60)
    assert "offsets 50..69 are gone (retention)" in str(outcome) and 'on_gap = "skip"' in str(outcome), outcome
    assert gap_rows(pipeline) == [(tp, 50, 70)]
    assert pipeline.target_count() == 50


def test_start_from_latest_is_chosen_once_and_kept_by_the_next_leader(stack, tmp_path):
    """Defect 9: the initial offset of a never-committed partition is recorded in the ledger, so a
    leader change never moves it (records produced between two leaders are not skipped)."""
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("latest"), partitions=1, settings={"pipeline.start_from": "latest"}
    )
    tp = pipeline.partitions[0]
    pipeline.produce(100)
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1):
        failpoints.arm("leader.before-commit", "raise", who="E1")  # E1 dies before any commit
        e1.start()
        first = wait_until(lambda: participants.starts and participants.starts[0], 60, "E1's first START")
        e1.ended(60)
        pipeline.produce(100, start_id=100)
        reader = Consumer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "group.id": "w"})
        high = wait_until(
            lambda: (
                (h := reader.get_watermark_offsets(KafkaTP(tp.topic, tp.partition), timeout=10, cached=False)[1])
                > first.offsets[0].offset
                and h
            ),
            30,
            "the high watermark to move past E1's choice",
        )
        reader.close()
        e2 = LeaderThread(pipeline, 2, "E2").start()
        second = wait_until(lambda: [s for s in participants.starts if s.epoch == 2][:1], 60, "E2's first START")[0]
        assert second.offsets[0].offset == first.offsets[0].offset < high
        wait_until(lambda: pipeline.target_count() >= 100, 60, "the records after E1's choice committed")
        e2.stop.set()
        e2.ended(60)
    assert pipeline.ledger().initial_offsets() == {tp: first.offsets[0].offset}
