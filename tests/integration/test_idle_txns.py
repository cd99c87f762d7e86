"""An idle pipeline keeps its txn open past the interval and commits records as they arrive
(``transaction.idle_interval_s``, ``protocol.coordinator.flight:Flight.idle``); across several tables,
records for a table the next txn has no stage table in are read by the txn right after the idle one
(``Flight.awaits_spare``). Real coordinator and participant tasks on the embedded stack; the ledger
tells what was started and committed."""

from __future__ import annotations

import json
import time

from protocol import naming
from protocol.ledger.view import TxnSummary
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline
from tests.routed import assert_exactly_once_per_table, make_routed_pipeline, produce_to, table_count

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


def wait_for_an_idle_txn(pipeline: Pipeline, interval_s: float) -> TxnSummary:
    """The txn under way once it has been open ``OPEN_INTERVALS`` intervals with nothing to read."""

    def long_open() -> TxnSummary | None:
        txn = open_txn(pipeline)
        return txn if txn and time.time() - txn.started_at >= OPEN_INTERVALS * interval_s else None

    return wait_until(
        long_open, WAIT_S, f"a txn open for {OPEN_INTERVALS} intervals with nothing to read", interval_s=0.5
    )


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

        idle = wait_for_an_idle_txn(pipeline, INTERVAL_S)
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


def test_records_for_a_table_idle_since_the_start_are_read_by_the_txn_right_after_the_idle_one(stack, tmp_path):
    """Table t1 never had a record: neither the idle txn nor the spare made for the next one has a stage
    table for it. Its first records end the idle txn only once a spare with t1's stage table is ready,
    so the txn its END carries reads them (before, that txn held t1, and t1 waited a txn more)."""
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("idleroute"), tables=2, idle_interval_s=600.0)
    name = pipeline.cfg.name
    produced = {"t0": produce_to(pipeline, f"{name}_t0", 100), "t1": 0}
    t1_prefix = naming.stage_table("t1", name, "")

    def stages_in_t1(txn: TxnSummary) -> bool:
        return any(stage.startswith(t1_prefix) for stage in naming.split_stages(txn.stage_table))

    with coordinator(pipeline), participants(pipeline, tasks=2):
        for attempt in range(1, 4):
            wait_until(lambda: table_count(pipeline, "t0") == produced["t0"], WAIT_S, "t0's records committed")
            idle = wait_for_an_idle_txn(pipeline, pipeline.cfg.transaction.interval_s)
            if not stages_in_t1(idle):
                break
            # t1's log end was not known yet when this txn's stage tables were chosen (the first txns
            # have one in every table): end it with records in t0 and wait for the next idle one
            produced["t0"] += produce_to(pipeline, f"{name}_t0", 10, start_id=attempt * 1_000)
        assert not stages_in_t1(idle), idle
        produced["t1"] = produce_to(pipeline, f"{name}_t1", 120)
        wait_until(lambda: table_count(pipeline, "t1") == produced["t1"], WAIT_S, "t1's records committed")
    after = [t.txn for t in history(pipeline) if t.started_at > idle.started_at]
    commits = {c.txn: c for c in pipeline.ledger().commits()}
    assert after and after[0] in commits, (after, sorted(commits))
    t1_rows = sum(r.end - r.start for r in commits[after[0]].ranges if r.topic == f"{name}_t1")
    assert t1_rows > 0, f"{after[0]}, the txn after the idle {idle.txn}, read none of t1's records"
    assert_exactly_once_per_table(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr
