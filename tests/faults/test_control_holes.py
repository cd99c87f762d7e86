"""A control record a reader's consumer skipped is read again, so no txn waits for a timeout.

The embedded broker can serve a control record batch before an earlier one another producer is
still appending, and a consumer at the tail then moves past the earlier one for good (seen in a
paced benchmark run: one participant never saw an END, its txn and the next aborted 30 s later
on the WRITE-STATUS timeout). The failpoint ``control.hide-record`` hides one record of a chosen
kind from one reader, as the broker does, while the record stays on the topic: the reader must
notice the hole and read it again. The real coordinator and participant tasks run in threads
against the embedded stack; the exactly-once oracle (docs/architecture.md §11) ends each test.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from clients import failpoints
from protocol.messages import EndCommit, Heartbeat
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

SETTINGS = {"participant.chunk_rows": 500, "transaction.interval_s": 0.3}


@pytest.mark.parametrize(
    ("reader", "kind"),
    [("task-0", "end-commit"), ("c1", "write-status")],
    ids=["END hidden from a participant", "WRITE-STATUS hidden from the coordinator"],
)
def test_a_control_record_a_reader_skipped_is_read_again_and_no_txn_aborts(stack, tmp_path, reader, kind):
    pipeline = make_pipeline(stack, tmp_path, unique_name("hole"), settings=SETTINGS)
    produced = pipeline.produce(20_000)
    hidden = failpoints.arm("control.hide-record", "raise*1", who=f"{reader}/{kind}")
    with coordinator(pipeline) as service, participants(pipeline, tasks=2):
        assert hidden.reached.wait(60), f"no {kind} reached {reader}"
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed")
        aborted = [(t.txn, t.reason) for t in pipeline.ledger().history(limit=1000) if t.state == "ABORTED"]
        holes = service.metrics.registry.get_sample_value("chtxn_control_holes_total", {"pipeline": pipeline.cfg.name})
    assert aborted == [], aborted  # read before the coordinator stops (its shutdown aborts the open txn)
    if reader == "c1":
        assert holes >= 1  # the leader counted the hole it read again
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def still_reading_an_ended_txn(pipeline: Pipeline, sender: str, after_s: float) -> str | None:
    """A txn ``sender`` heartbeated it was reading more than ``after_s`` after that txn's first END."""
    ended: dict[str, float] = {}
    for at, message in pipeline.control_records():
        if isinstance(message, EndCommit):
            ended.setdefault(message.txn, at)
        elif (
            isinstance(message, Heartbeat)
            and message.sender == sender
            and message.txn in ended
            and at - ended[message.txn] > after_s
        ):
            return message.txn
    return None


def test_a_participant_that_never_read_an_end_gets_it_again_and_no_txn_aborts(stack, tmp_path):
    """Every END is hidden from task-0 until its reader has given up on the hole (it waits 1 s)
    and it still heartbeats the ended txn 3 s later; then the leader's next copy of that END gets
    through. The WRITE-STATUS timeout is 60 s, so the txn commits only if the END is sent again."""
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("missedend"), settings={**SETTINGS, "transaction.write_status_timeout_s": 60.0}
    )
    produced = pipeline.produce(20_000)
    hidden = failpoints.arm("control.hide-record", "raise", who="task-0/end-commit")
    with coordinator(pipeline) as service, participants(pipeline, tasks=2):
        assert hidden.reached.wait(60), "no END reached task-0"
        missed = wait_until(
            lambda: still_reading_an_ended_txn(pipeline, "task-0", 3.0),
            30,
            "task-0 heartbeating a txn 3 s after its END",
        )
        failpoints.disarm()
        wait_until(lambda: pipeline.target_count() == produced, 30, "every record committed")
        history = {t.txn: t for t in pipeline.ledger().history(limit=1000)}
        # The missed txn's commit latency counts from its first END, not from the copy sent again
        # (which it would be well under 2.5 s from); its flush waited for task-0 as long.
        for latency in ("chtxn_commit_latency_seconds", "chtxn_flush_latency_seconds"):
            assert slower_than(service.metrics.registry, latency, pipeline.cfg.name, 2.5) >= 1, latency
    ends = [m.txn for _, m in pipeline.control_records() if isinstance(m, EndCommit)]
    assert ends.count(missed) >= 2, ends  # sent again
    assert history[missed].state in ("COMMITTED", "PUBLISHED"), history[missed]
    assert [t.reason for t in history.values() if t.state == "ABORTED"] == []
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def slower_than(registry: CollectorRegistry, histogram: str, pipeline: str, seconds: float) -> float:
    """How many observations of ``histogram`` exceed ``seconds`` (one of its bucket bounds)."""
    labels = {"pipeline": pipeline}
    count = registry.get_sample_value(f"{histogram}_count", labels) or 0.0
    within = registry.get_sample_value(f"{histogram}_bucket", {**labels, "le": str(seconds)}) or 0.0
    return count - within
