"""``protocol.ledger.commit_points``: which commit point is in force, from the ledger's record and the
switch markers in the chain after it."""

from __future__ import annotations

from protocol.ledger import commit_points
from protocol.ledger.commit_points import Fact
from protocol.ledger.rows import LedgerEvent, LedgerRow


def commit(slot: int, txn: str) -> LedgerRow:
    return LedgerRow(pipeline="p", txn=txn, event=LedgerEvent.COMMITTED, epoch=1, commit_seq=slot)


def record(since: int, mode: str) -> LedgerRow:
    return commit_points.record_row(pipeline="p", since=since, mode=mode, who="op", claim_id="x")


def test_nothing_recorded_and_no_switch_is_none() -> None:
    assert commit_points.current(None, [commit(1, "e1_t1"), commit(2, "reset_s2")]) is None


def test_the_record_is_in_force_until_a_later_switch_marker() -> None:
    assert commit_points.current(record(0, "token"), [commit(1, "e1_t1")]) == Fact(mode="token", since=0, who="op")
    switched = commit_points.current(record(0, "token"), [commit(1, "e1_t1"), commit(2, "switch_keeper_s2")])
    assert switched == Fact(mode="keeper", since=2, recorded=False)


def test_a_marker_the_record_already_covers_changes_nothing() -> None:
    fact = commit_points.current(record(5, "token"), [commit(5, "switch_keeper_s5")])
    assert fact == Fact(mode="token", since=5, who="op")


def test_only_well_formed_switch_txns_are_markers() -> None:
    assert commit_points.switch_mode(commit_points.switch_txn("keeper", 12)) == "keeper"
    assert commit_points.switch_mode("switch_token_s3") == "token"
    for txn in ("switch_zookeeper_s3", "switch_keeper_sx", "e1_t3", "reset_s3", ""):
        assert commit_points.switch_mode(txn) is None, txn


def test_a_mismatch_names_the_switch_procedure() -> None:
    text = commit_points.mismatch("orders", Fact(mode="token", since=0), "keeper")
    assert 'ledger.commit_point = "token"' in text and "chtxn commit-point switch --to keeper" in text
    assert "chtxn pause" in text and "chtxn resume" in text
