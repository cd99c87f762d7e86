"""The size trigger holds: a txn ended because its rows reached ``size_trigger_rows`` holds at
most 25% more (participants report at once when they cross their share, and stop reading past
it until END). Real coordinator and participant tasks, a backlog to read, the trigger far below
what one interval brings."""

from __future__ import annotations

from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import make_pipeline

TRIGGER = 4_000


def test_txns_ended_by_the_size_trigger_stay_within_a_quarter_of_it(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("sizetrig"), partitions=2, settings={
        "transaction.size_trigger_rows": TRIGGER, "transaction.interval_s": 5.0,
        "participant.chunk_rows": 500, "participant.poll_batch": 200,
    })
    produced = pipeline.produce(40_000)
    with coordinator(pipeline), participants(pipeline, tasks=2):
        wait_until(lambda: pipeline.target_count() == produced, 120, "every record committed")
    rows = [c.total_rows for c in pipeline.ledger().commits() if c.total_rows]
    by_trigger = rows[:-1]  # the last data txn ends by the interval, with what was left
    assert len(by_trigger) >= 5, rows
    assert all(TRIGGER <= r <= TRIGGER * 1.25 for r in by_trigger), rows
    report = pipeline.oracle()
    assert report.ok, report.anomalies
