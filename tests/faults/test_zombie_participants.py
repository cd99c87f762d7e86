"""Two live copies of one participant task (an executor lost while its Python worker runs on).

The real coordinator service and two real ``TaskRunner``s holding the same partitions, against
the embedded stack. Only the holder named in START may stage; the other stands down, and txns
keep committing. Ends with the exactly-once oracle.
"""

from __future__ import annotations

from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import coordinator, task
from tests.pipelines import make_pipeline


def test_two_live_copies_of_a_participant_do_not_stop_commits(stack, tmp_path):
    """Defect 7: the copies take turns heartbeating; before fencing 39 of 40 txns aborted."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("zombie"), settings={"transaction.interval_s": 0.3})
    produced = pipeline.produce(3_000)
    copies = [task(pipeline, pipeline.partitions, "task-0"), task(pipeline, pipeline.partitions, "task-0-zombie")]
    try:
        with coordinator(pipeline):
            wait_until(lambda: pipeline.target_count() == produced, 90, "every record committed")
            more = pipeline.produce(2_000, start_id=produced)  # and it keeps committing
            wait_until(lambda: pipeline.target_count() == produced + more, 90, "the second batch committed")
            produced += more
    finally:
        for copy in copies:
            copy.stop()
    history = pipeline.ledger().history(limit=1000)
    committed = [t for t in history if t.state == "PUBLISHED" and t.total_rows]
    aborted = [t for t in history if t.state == "ABORTED"]
    assert len(aborted) <= len(committed), f"{len(aborted)} aborted vs {len(committed)} committed: {aborted[:3]}"
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    assert report.rows_in_target == produced
