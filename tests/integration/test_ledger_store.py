"""The ledger against the session's ClickHouse: compare-and-set claims under races, the head,
the resolution rule, history and the audit."""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec
import pytest

from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from protocol import naming
from protocol.ledger import rows as ledger
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.messages import TopicPartition
from tests.integration.ledger_writes import commit_row, rng

RACERS = 4


@pytest.fixture
def new_store(any_store: Callable[..., LedgerHistory]) -> Callable[..., LedgerHistory]:
    """Stores of one fresh pipeline, of either commit point; keyword arguments go to ``LedgerStore``."""
    return any_store


def race(claims: list[Callable[[], bool]]) -> list[bool]:
    """Run ``claims`` at once, one thread each; their results in order."""
    barrier = threading.Barrier(len(claims))
    results: list[bool | BaseException] = [False] * len(claims)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = claims[i]()
        except BaseException as exc:  # reported below, with the claim it came from
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(claims))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    return results  # type: ignore[return-value]  # no errors: every slot holds a result


def test_racing_epoch_claims_have_exactly_one_winner(new_store: Callable[[], LedgerStore]) -> None:
    stores = [new_store() for _ in range(RACERS)]
    assert stores[0].max_epoch() == 0
    for epoch in (1, 2, 3):
        results = race([lambda s=s, i=i, epoch=epoch: s.claim_epoch(epoch, f"coord-{i}") for i, s in enumerate(stores)])
        assert results.count(True) == 1, results
        assert stores[0].epoch_owner(epoch) == f"coord-{results.index(True)}"
        assert stores[1].max_epoch() == epoch


def test_racing_commit_claims_have_exactly_one_winner_per_slot(new_store: Callable[[], LedgerStore]) -> None:
    stores = [new_store() for _ in range(RACERS)]
    ends = {0: 0}
    for seq in (1, 2, 3):
        rows = [
            commit_row(
                s, seq, naming.txn_id(i + 1, seq), rng(0, ends[0], ends[0] + 10 * (i + 1)), epoch=i + 1, who=f"c{i}"
            )
            for i, s in enumerate(stores)
        ]
        results = race([lambda s=s, r=r: s.claim_commit(r) for s, r in zip(stores, rows)])
        assert results.count(True) == 1, results
        winner = rows[results.index(True)]
        owner = stores[2].commit_at(seq)
        assert owner is not None and (owner.txn, owner.epoch, owner.coordinator) == (
            winner.txn,
            winner.epoch,
            winner.coordinator,
        )
        ends[0] = winner.ranges[0].end
        assert stores[3].head() == (seq, {TopicPartition(topic="src", partition=0): ends[0]})
    assert stores[0].audit() == []
    assert len(stores[0].commits()) == 3


def test_a_repeated_claim_is_stored_once_and_wins_only_with_its_claim_id(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    row = msgspec.structs.replace(commit_row(store, 1, "e1_t1", rng(0, 0, 5)), claim_id="claim-1")
    assert store.claim_commit(row) is True
    assert store.claim_commit(row) is True  # the same claim repeated (outcome was unknown): still ours
    assert store.claim_commit(msgspec.structs.replace(row, claim_id="")) is False  # a fresh claim id: another claimer
    assert store.claim_epoch(1, "c1", claim_id="epoch-claim") is True
    assert store.claim_epoch(1, "c1", claim_id="epoch-claim") is True
    assert store.claim_epoch(1, "c1") is False
    count = store._client.command(
        f"SELECT count() FROM {store.table} WHERE pipeline = {{p:String}}", parameters={"p": store.pipeline}
    )
    assert int(count) == 2  # one COMMITTED and one EPOCH row


def test_head_follows_the_chain(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    assert store.head() == (0, {})
    assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10), rng(1, 0, 5)))
    assert store.claim_commit(commit_row(store, 2, "e1_t2", rng(0, 10, 20)))
    assert store.claim_commit(commit_row(store, 3, "e1_t3"))  # an empty commit still takes a slot
    assert store.claim_commit(commit_row(store, 4, "e1_t4", rng(1, 5, 8), rng(2, 0, 1)))

    def tp(p: int) -> TopicPartition:
        return TopicPartition(topic="src", partition=p)

    assert store.head() == (4, {tp(0): 20, tp(1): 8, tp(2): 1})


def test_a_duplicated_slot_resolves_to_the_first_claim_for_ever(new_store: Callable[[], LedgerStore]) -> None:
    """Past the deduplication window a slot can hold two rows; every reader picks the first claim,
    whatever the epochs: a late claim of a newer epoch with a stale head must not rewrite history."""
    store = new_store()
    assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10), epoch=1))
    store.append(LedgerRow(pipeline=store.pipeline, txn="e1_t1", event=LedgerEvent.PUBLISHED, epoch=1, commit_seq=1))
    # what a stale claim past the window leaves: another row in slot 1, under a token not seen yet
    late = commit_row(store, 1, "e2_t1", rng(0, 0, 12), epoch=2, who="c2")
    store._insert(late, "outside-the-window", "insert a duplicate slot")
    owner = store.commit_at(1)
    assert owner is not None and (owner.txn, owner.epoch) == ("e1_t1", 1)
    assert store.head() == (1, {TopicPartition(topic="src", partition=0): 10})
    assert [c.txn for c in store.commits()] == ["e1_t1"]
    assert store.committed_unpublished() == []


def test_a_seal_fences_a_late_commit_of_an_older_epoch(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10), epoch=1))
    assert store.seal(2, "c2", head_seq=1)
    assert not store.claim_commit(commit_row(store, 2, "e1_t2", rng(0, 10, 20), epoch=1))  # the stalled leader
    assert store.head() == (2, {TopicPartition(topic="src", partition=0): 10})
    assert not store.seal(3, "c3", head_seq=1), "a seal of a stale head loses to the commit it missed"


def test_committed_unpublished(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    rows = [commit_row(store, i, f"e1_t{i}", rng(0, 10 * (i - 1), 10 * i)) for i in (1, 2, 3)]
    for row in rows:
        assert store.claim_commit(row)
    store.append(LedgerRow(pipeline=store.pipeline, txn="e1_t2", event=LedgerEvent.PUBLISHED, epoch=1, commit_seq=2))
    assert [(r.txn, r.commit_seq) for r in store.committed_unpublished()] == [("e1_t1", 1), ("e1_t3", 3)]


def test_history_and_txn(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    p = store.pipeline

    def event(txn: str, kind: LedgerEvent, **fields: object) -> None:
        store.append(LedgerRow(pipeline=p, txn=txn, event=kind, epoch=1, coordinator="c1", **fields))  # type: ignore[arg-type]  # fields of mixed types

    event("e1_t1", LedgerEvent.STARTED, ranges=(rng(0, 0, 0),), started_at=1000.0)
    committed = commit_row(store, 1, "e1_t1", rng(0, 0, 7))
    assert store.claim_commit(
        msgspec.structs.replace(committed, started_at=1000.0, ended_at=1000.5, committed_at=1000.75)
    )
    event("e1_t1", LedgerEvent.PUBLISHED, commit_seq=1, ranges=(rng(0, 0, 7),), published_at=1001.0)
    event("e1_t2", LedgerEvent.STARTED, ranges=(rng(0, 7, 7),), started_at=1002.0)
    event("e1_t2", LedgerEvent.ABORTED, reason="participant src/0 stopped heartbeating")
    event("e1_t3", LedgerEvent.STARTED, ranges=(rng(0, 7, 7),), started_at=1003.0)
    event("e1_t3", LedgerEvent.STARTED, ranges=(rng(0, 7, 7),), started_at=1003.0)  # a retry: stored once

    listed = store.history(limit=10)
    assert [(s.txn, s.state) for s in listed] == [("e1_t3", "STARTED"), ("e1_t2", "ABORTED"), ("e1_t1", "PUBLISHED")]
    assert [s.txn for s in store.history(limit=1)] == ["e1_t3"]
    assert [s.txn for s in store.history(limit=10, state="aborted")] == ["e1_t2"]
    assert store.history(limit=10, state="COMMITTED") == []
    with pytest.raises(ValueError, match="unknown txn state"):
        store.history(state="DONE")

    t1 = store.txn("e1_t1")
    assert t1 is not None
    assert (t1.state, t1.commit_seq, t1.total_rows, t1.ranges) == ("PUBLISHED", 1, 7, (rng(0, 0, 7),))
    assert (t1.consume_ms, t1.commit_ms, t1.publish_ms) == (500.0, 250.0, 250.0)
    assert t1.events == ("STARTED", "COMMITTED", "PUBLISHED")
    t2 = store.txn("e1_t2")
    assert t2 is not None and t2.reason == "participant src/0 stopped heartbeating"
    t3 = store.txn("e1_t3")
    assert t3 is not None and t3.events == ("STARTED",)
    assert store.txn("e9_t9") is None


def test_audit_finds_overlaps_and_gaps(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10)))
    assert store.claim_commit(commit_row(store, 2, "e1_t2", rng(0, 8, 20)))
    assert store.claim_commit(commit_row(store, 3, "e1_t3", rng(0, 25, 30)))
    store.append(
        LedgerRow(
            pipeline=store.pipeline,
            txn="",
            event=LedgerEvent.GAP,
            epoch=1,
            ranges=(PartitionRange(topic="src", partition=0, start=20, end=25),),
            reason="retention",
        )
    )
    problems = store.audit()
    assert len(problems) == 2, problems
    assert "offsets 8..9 are committed twice" in problems[0]
    assert "offsets 20..24 were never committed" in problems[1] and "recorded as skipped" in problems[1]


def test_claims_and_appends_check_their_rows(new_store: Callable[[], LedgerStore]) -> None:
    store = new_store()
    with pytest.raises(ValueError):
        store.append(commit_row(store, 1, "e1_t1"))
    with pytest.raises(ValueError):
        store.claim_commit(commit_row(store, 0, "e1_t1"))
    with pytest.raises(ValueError):
        store.claim_epoch(0, "c1")
    assert ledger.TABLE in store.table
