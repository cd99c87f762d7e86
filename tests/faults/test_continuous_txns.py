"""Continuous txns under faults: the END of txn k carries the START of k+1, so k+1 is reading
(and staging) while k is flushed, counted and claimed. Whatever happens to k then, both are
read again and the exactly-once oracle (docs/architecture.md §11) holds.

The real coordinator and real participant tasks run in threads against the embedded stack;
failpoints hold the leader at a chosen step, so the interleaving is the same on every run.
"""

from __future__ import annotations

import threading
import time

from clients import failpoints
from protocol import naming
from protocol.messages import EndCommit, StartCommit, WriteStatus
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, assert_exactly_once, chained_ends, control_messages, make_pipeline

SETTINGS = {"participant.chunk_rows": 500, "transaction.interval_s": 0.3}


def being_counted(pipeline: Pipeline) -> tuple[str, str] | None:
    """(k, k+1): the oldest txn not yet decided whose END started the next one."""
    decided = {t.txn for t in pipeline.ledger().history(limit=1000) if t.state in ("COMMITTED", "PUBLISHED", "ABORTED")}
    pending = sorted((naming.parse_txn_id(k), k, nxt) for k, nxt in chained_ends(pipeline).items() if k not in decided)
    return (pending[0][1], pending[0][2]) if pending else None


def staged_rows(pipeline: Pipeline, txn: str) -> int:
    table = naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, txn)
    if table not in pipeline.stage_tables():
        return 0
    return (
        pipeline.client().query(f"SELECT count() FROM `{pipeline.cfg.clickhouse.database}`.`{table}`").result_rows[0][0]
    )


def test_an_abort_of_k_while_k_plus_1_is_staging_re_reads_both(stack, tmp_path):
    """k is held before its count while k+1, started by k's END, stages rows. A stray row in k's
    stage table then fails k's count: k aborts, k+1 aborts with it (cascade), and every record of
    both is read again from the ledger head."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("contabort"), settings=SETTINGS)
    produced = pipeline.produce(40_000)
    counting = failpoints.arm("leader.before-count", "pause*1", who="c1")
    with coordinator(pipeline), participants(pipeline, tasks=2):
        assert counting.reached.wait(120), "no txn reached its count"
        k, k_next = wait_until(
            lambda: being_counted(pipeline), 30, "the txn being counted, and the one its END started"
        )
        # k may have read every record before its END: these can only go to k+1, which cannot end
        # before k is decided.
        produced += pipeline.produce(2_000, start_id=produced)
        wait_until(lambda: staged_rows(pipeline, k_next) > 0, 60, f"{k_next} staging while {k} is counted")
        stage_k = naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, k)
        pipeline.client().command(
            f"INSERT INTO `{pipeline.cfg.clickhouse.database}`.`{stage_k}` SELECT * FROM "
            f"`{pipeline.cfg.clickhouse.database}`.`{stage_k}` LIMIT 1"
        )  # k's count no longer matches
        failpoints.release("leader.before-count")
        wait_until(lambda: pipeline.target_count() == produced, 120, "every record committed after the abort")
    states = {t.txn: t for t in pipeline.ledger().history(limit=1000)}
    assert states[k].state == "ABORTED" and "row-count mismatch" in states[k].reason, states[k]
    assert states[k_next].state == "ABORTED" and states[k_next].reason.startswith(f"cascade: {k} aborted"), states[
        k_next
    ]
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def capped_starts(pipeline: Pipeline) -> list[StartCommit]:
    starts = [
        m.next if isinstance(m, EndCommit) else m
        for m in control_messages(pipeline)
        if isinstance(m, StartCommit) or (isinstance(m, EndCommit) and m.next is not None)
    ]
    return [s for s in starts if s.chunk_rows > 0]


def test_an_abort_while_chunks_are_capped_by_start_re_reads_them_exactly_once(stack, tmp_path):
    """Events trickle in at ~8,000/s, so each START caps the txn's chunks well below
    participant.chunk_rows (20,000). Once capped chunks are being staged, one insert that landed is
    reported as failed: its txn aborts, and its records, read again in txns that may be capped
    differently, are committed exactly once."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("capabort"), settings={"transaction.interval_s": 1.0})
    stop = threading.Event()
    sent = [0]

    def trickle() -> None:  # load over time, not a wait: 800 events per 0.1 s until stopped
        started = time.monotonic()
        while not stop.is_set() and sent[0] < 400_000:
            sent[0] += pipeline.produce(800, start_id=sent[0])
            stop.wait(max(0.0, started + sent[0] / 8_000 - time.monotonic()))

    producer = threading.Thread(target=trickle, name="trickle")
    with coordinator(pipeline), participants(pipeline, tasks=2):
        producer.start()
        try:
            wait_until(lambda: capped_starts(pipeline), 60, "a START capping its chunks")
            failed = failpoints.arm("stage.after-insert", "raise*1", who="task-0")
            assert failed.reached.wait(60), "no capped chunk was staged"
            fired_at = sent[0]
            wait_until(lambda: sent[0] >= fired_at + 16_000, 60, "two more seconds of events after the failure")
        finally:
            stop.set()
            producer.join(60)
        wait_until(lambda: pipeline.target_count() == sent[0], 120, "every record committed after the abort")
    history = pipeline.ledger().history(limit=1000)
    assert any(t.state == "ABORTED" and "staging crashed" in t.reason for t in history), [t.reason for t in history]
    statuses = [m for m in control_messages(pipeline) if isinstance(m, WriteStatus)]
    assert any(ws.chunks > 1 and ws.rows < 20_000 for ws in statuses), "no txn was cut into capped chunks"
    assert_exactly_once(pipeline, sent[0], nothing_lost=True)
