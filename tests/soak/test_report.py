"""How a soak judges its run: recovery from the commit chain, stuck spells, failing verdicts (pure)."""

from __future__ import annotations

from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from tests.soak.faults import FaultRecord
from tests.soak.report import SoakResult, recovery_times, stuck_spells
from tests.soak.schedule import FaultPlan

TOPIC = "t"


def commit(seq: int, at: float, *ends: int) -> LedgerRow:
    ranges = tuple(PartitionRange(topic=TOPIC, partition=p, start=0, end=e) for p, e in enumerate(ends))
    return LedgerRow(
        pipeline="p",
        txn=f"e1_t{seq}",
        event=LedgerEvent.COMMITTED,
        epoch=1,
        commit_seq=seq,
        ranges=ranges,
        event_time=at,
    )


def fault(kind: str, started: float, ended: float, acked: dict[int, int]) -> FaultRecord:
    return FaultRecord(
        plan=FaultPlan(index=0, kind=kind, quiet_s=1.0, hold_s=ended - started),
        started=started,
        ended=ended,
        acked_at_end=acked,
    )


def test_recovery_is_the_first_commit_covering_what_was_acknowledged_when_the_fault_ended():
    commits = [commit(1, 100.0, 10, 10), commit(2, 105.0, 20, 15), commit(3, 107.5, 20, 30)]
    covered_late, never = fault("leader-kill", 101.0, 103.0, {0: 20, 1: 25}), fault("leader-kill", 108, 109, {0: 99})
    already = fault("worker-kill", 106.0, 106.0, {0: 20, 1: 15})
    recovery_times([covered_late, never, already], commits, TOPIC)
    assert covered_late.recovery_s == 4.5
    assert never.recovery_s is None
    assert already.recovery_s == 0.0  # covered before the fault's end: clamped


def test_a_long_silence_is_stuck_only_outside_fault_windows():
    commits = [commit(1, 10.0, 1), commit(2, 80.0, 2), commit(3, 200.0, 3)]
    during_fault = fault("clickhouse-cut", 15.0, 75.0, {})
    spells = stuck_spells(commits, [during_fault], start=0.0, end=205.0, stuck_after_s=60.0)
    assert len(spells) == 1 and "from +80.0s to +200.0s" in spells[0]


def test_duplicates_losses_and_stuck_spells_fail_the_soak():
    result = SoakResult(seed=1, duration_s=60, git_commit="x", pipeline="p", logs="")
    result.oracle = {
        "ok": True,
        "anomalies": [],
        "partitions": [{"expected_rows": 10, "distinct_offsets": 10, "duplicates": 0}],
    }
    result.verify = {"ok": True}
    assert result.ok and result.losses == 0
    result.oracle = {
        "ok": False,
        "anomalies": ["t-0: ..."],
        "partitions": [{"expected_rows": 10, "distinct_offsets": 8, "duplicates": 3}],
    }
    assert (result.duplicates, result.losses) == (3, 2) and not result.ok
    result.oracle = {"ok": True, "anomalies": [], "partitions": []}
    result.stuck = ["drain did not finish"]
    assert result.failures() == ["stuck: drain did not finish"]
