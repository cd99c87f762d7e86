"""Continuous txns end to end: a participant killed between the END of txn k (which started
k+1) and its WRITE-STATUS for k. The coordinator aborts k once the holder falls silent, k+1 with
it; Spark restarts the task, which re-reads both from the ledger head. The exactly-once oracle
holds (docs/architecture.md §11).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.processes import Processes, committed
from tests.helpers import unique_name, wait_until
from tests.pipelines import assert_exactly_once, chained_ends, make_pipeline

pytestmark = pytest.mark.e2e

FIRES = "failpoint participant.before-write-status fires"


def test_a_participant_killed_between_end_and_its_write_status(stack, tmp_path):
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("e2ekillend"), partitions=2, settings={"participant.chunk_rows": 2_000}
    )
    produced = pipeline.produce(20_000)
    procs = Processes(pipeline, tmp_path)
    try:
        procs.coordinator()
        # Every task stalls once before its first WRITE-STATUS: the test kills it there.
        procs.participants(2, env={"CHTXN_FAILPOINTS": "participant.before-write-status=stall(12)*1"})
        wait_until(lambda: procs.alive() or FIRES in procs.tail("participant"), 180, "a task at its WRITE-STATUS")
        stalled = wait_until(lambda: set(procs.python_workers()), 30, "the PySpark Python workers")
        for pid in stalled:  # every task is held before its first WRITE-STATUS, after an END
            os.kill(pid, signal.SIGKILL)
        more = pipeline.produce(20_000, start_id=produced)
        committed(pipeline, produced + more, procs)
    finally:
        procs.stop_all()
    aborted = {t.txn: t.reason for t in pipeline.ledger().history(limit=1000, state="ABORTED")}
    dead = [txn for txn, reason in aborted.items() if "stopped sending heartbeats" in reason]
    assert dead, f"no txn aborted for a silent participant: {aborted}"
    chained = chained_ends(pipeline)
    assert any(k in chained and aborted.get(chained[k], "").startswith(f"cascade: {k} aborted") for k in dead), (
        f"no txn chained after a dead participant's txn aborted with it: {aborted}, chained {chained}"
    )
    assert_exactly_once(pipeline, produced + more)
