"""An idle pipeline keeps its txn open past the interval and commits records as they arrive
(``transaction.idle_interval_s``, ``protocol.coordinator.flight:Flight.idle``). Real coordinator and
participant tasks on the embedded stack; the ledger tells what was started and committed."""

from __future__ import annotations

import json
import time

from protocol.ledger.view import TxnSummary
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

INTERVAL_S = 0.5
#: Idle txns open this many intervals at least before the test adds records.
OPEN_INTERVALS = 8
WAIT_S = 90.0


def history(pipeline: Pipeline) -> list[TxnSummary]:
    """The pipeline's txns, oldest first."""
    return sorted(pipeline.ledger().history(limit=10_000), key=lambda t: t.started_at)


def open_txn(pipeline: Pipeline) -> TxnSummary | None:
    """The newest txn, if it is started and not ended in any way."""
    txns = history(pipeline)
    return txns[-1] if txns and txns[-1].state == "STARTED" else None


def test_an_idle_txn_stays_open_until_records_arrive_then_they_commit_once(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("idletxn"),
        partitions=2,
        settings={"transaction.interval_s": INTERVAL_S, "transaction.idle_interval_s": 600.0},
    )
    first = pipeline.produce(200)
    with coordinator(pipeline), participants(pipeline, tasks=2):
        wait_until(lambda: pipeline.target_count() == first, WAIT_S, "the first records committed")

        def long_open() -> TxnSummary | None:
            txn = open_txn(pipeline)
            return txn if txn and time.time() - txn.started_at >= OPEN_INTERVALS * INTERVAL_S else None

        idle = wait_until(
            long_open, WAIT_S, f"a txn open for {OPEN_INTERVALS} intervals with nothing to read", interval_s=0.5
        )
        later = [t.txn for t in history(pipeline) if t.started_at > idle.started_at]
        assert later == [], f"txns started after the idle one: {later}"
        committed = len(pipeline.ledger().commits())

        second = pipeline.produce(150, start_id=first)
        wait_until(lambda: pipeline.target_count() == first + second, WAIT_S, "the later records committed")
    ended = next(t for t in history(pipeline) if t.txn == idle.txn)
    assert ended.state in ("COMMITTED", "PUBLISHED"), ended
    assert ended.ended_at - ended.started_at >= OPEN_INTERVALS * INTERVAL_S, "the idle txn ended at an interval"
    # the idle txn, and the ones reading the later records from where its END cut
    assert len(pipeline.ledger().commits()) - committed <= 4
    assert_exactly_once(pipeline, first + second, nothing_lost=True)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr
