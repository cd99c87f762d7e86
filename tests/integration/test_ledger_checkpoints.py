"""Checkpoints and retention against the session's ClickHouse: the head from a checkpoint equals the
chain's, the first claim still wins across one, a seal still fences, expiry keeps what a restart
needs, and the audit runs from the oldest checkpoint left."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest

from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from protocol.config.sections import ClickHouseSection
from protocol.ledger import checkpoint as ledger_checkpoint, rows as ledger, sql as ledger_sql
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.ledger.sql import ALL_SLOTS
from protocol.messages import TopicPartition
from tests.helpers import unique_name
from tests.integration.ledger_writes import commit_row, rng

DAY_S = 86400.0


@pytest.fixture
def new_store(any_store: Callable[..., LedgerHistory]) -> Callable[..., LedgerHistory]:
    """Stores of one fresh pipeline, of either commit point; keyword arguments go to ``LedgerStore``."""
    return any_store


def chain_head(store: LedgerStore) -> tuple[int, dict[TopicPartition, int]]:
    """The head computed from the whole retained chain, as before checkpoints."""
    rows = store._query("read the chain's head", ledger_sql.head_sql(store._database), **ALL_SLOTS)
    return ledger_checkpoint.overlay(None, rows)


def commit_and_publish(store: LedgerStore, seq: int, *ranges: PartitionRange, publish: bool = True) -> LedgerRow:
    row = commit_row(store, seq, f"e1_t{seq}", *ranges)
    store.append(LedgerRow(pipeline=store.pipeline, txn=row.txn, event=LedgerEvent.STARTED, epoch=1, ranges=row.ranges))
    assert store.claim_commit(row)
    store.after_won_slot(seq, epoch=row.epoch, coordinator=row.coordinator)  # what the leader does next
    if publish:
        store.append(msgspec.structs.replace(row, event=LedgerEvent.PUBLISHED, claim_id=""))
    return row


def fill(store: LedgerStore, slots: int, per_partition: int = 10) -> None:
    for seq in range(1, slots + 1):
        p = seq % 3
        start = (seq - 1) // 3 * per_partition
        commit_and_publish(store, seq, rng(p, start, start + per_partition))


def rows_of(store: LedgerStore, event: LedgerEvent) -> int:
    return int(
        store._client.command(
            f"SELECT count() FROM {store.table} WHERE pipeline = {{p:String}} AND event = {{e:String}}",
            parameters={"p": store.pipeline, "e": event.value},
        )
    )


def test_checkpoints_summarise_the_settled_chain_and_reads_start_from_them(new_store) -> None:
    store = new_store(checkpoint_every=4)
    fill(store, 9)
    # slot 4 and 8 triggered checkpoints; each slot was unpublished when it was just won
    assert [c.commit_seq for c in store.checkpoints()] == [3, 7]
    assert store.head() == chain_head(store) == (9, {TopicPartition(topic="src", partition=p): 30 for p in range(3)})
    latest = store.latest_checkpoint()
    assert latest is not None
    assert ledger_checkpoint.offsets_of(latest) == dict(
        ledger_checkpoint.overlay(None, store._query("h", ledger_sql.head_sql(store._database), after=0, through=7))[1]
    )
    assert store.audit() == []


def test_a_checkpoint_never_passes_an_unpublished_commit(new_store) -> None:
    store = new_store(checkpoint_every=1000)
    commit_and_publish(store, 1, rng(0, 0, 10))
    stuck = commit_and_publish(store, 2, rng(0, 10, 20), publish=False)
    commit_and_publish(store, 3, rng(0, 20, 30))
    assert store.checkpoint(epoch=1, coordinator="c1") == 1
    assert [(r.txn, r.commit_seq) for r in store.committed_unpublished()] == [(stuck.txn, 2)]
    store.append(msgspec.structs.replace(stuck, event=LedgerEvent.PUBLISHED, claim_id=""))
    assert store.checkpoint(epoch=1, coordinator="c1") == 3
    assert store.committed_unpublished() == []
    assert store.head() == (3, {TopicPartition(topic="src", partition=0): 30})


def test_the_first_claim_wins_across_a_checkpoint_even_once_its_row_has_expired(new_store) -> None:
    store = new_store()
    fill(store, 3)
    assert store.checkpoint(epoch=1, coordinator="c1") == 3
    original = store.commit_at(2)
    assert original is not None
    late = commit_row(store, 2, "e2_t1", rng(2, 0, 99), epoch=2, who="c2")
    store._insert(late, "outside-the-window", "insert a late claim")  # past the deduplication window
    assert store.commit_at(2) == original
    assert store.claim_commit(msgspec.structs.replace(late, claim_id="late-claim")) is False
    # the original row expires: the late claims are all that is left in slot 2, and none owns it
    store._client.command(
        f"DELETE FROM {store.table} WHERE pipeline = {{p:String}} AND claim_id = {{c:String}}",
        parameters={"p": store.pipeline, "c": original.claim_id},
    )
    assert store.commit_at(2) is None
    assert store.claim_commit(msgspec.structs.replace(late, claim_id="later-claim")) is False
    assert store.head() == (3, {TopicPartition(topic="src", partition=p): 10 for p in range(3)})


def test_a_seal_writes_a_checkpoint_and_still_fences_an_older_epoch(new_store) -> None:
    store = new_store()
    fill(store, 2)
    assert store.seal(2, "c2", head_seq=2)
    store.after_won_slot(3, epoch=2, coordinator="c2", seal=True)  # what the leader does next
    assert store.latest_checkpoint() is not None and store.latest_checkpoint().commit_seq == 3
    assert not store.claim_commit(commit_row(store, 3, "e1_t3", rng(0, 10, 20), epoch=1))  # the stalled leader
    assert store.head() == chain_head(store) == (3, {TopicPartition(topic="src", partition=p): 10 for p in (1, 2)})
    assert not store.seal(3, "c3", head_seq=2)


def test_expiry_keeps_the_head_and_everything_after_the_horizon(new_store) -> None:
    store = new_store(checkpoint_every=3)
    tp0 = TopicPartition(topic="src", partition=0)
    assert store.claim_initial(TopicPartition(topic="src", partition=7), 5, epoch=1, coordinator="c1") == 5
    assert store.claim_epoch(1, "c1")
    fill(store, 7)
    store.append(
        LedgerRow(
            pipeline=store.pipeline,
            txn="e1_t5",
            event=LedgerEvent.LOST,
            epoch=1,
            commit_seq=5,
            reason="stage table gone",
        )
    )
    store.append(LedgerRow(pipeline=store.pipeline, txn="e1_t8", event=LedgerEvent.ABORTED, epoch=1, reason="x"))
    store.append(
        LedgerRow(
            pipeline=store.pipeline,
            txn="",
            event=LedgerEvent.GAP,
            epoch=1,
            ranges=(rng(1, 900, 950),),
            reason="retention",
        )
    )
    last = commit_and_publish(store, 8, rng(2, 20, 30), publish=False)
    assert [c.commit_seq for c in store.checkpoints()] == [2, 5]
    head, unpublished = store.head(), store.committed_unpublished()

    young = new_store(retention_s=DAY_S)  # nothing is a day old
    assert young.expire() == 0
    assert rows_of(store, LedgerEvent.COMMITTED) == 8

    later = new_store(retention_s=DAY_S, wall_clock=lambda: time.time() + 2 * DAY_S)  # two days on
    assert later.expire() == 5
    assert [c.commit_seq for c in later.commits()] == [6, 7, 8]
    assert [c.commit_seq for c in later.checkpoints()] == [5]
    assert rows_of(store, LedgerEvent.PUBLISHED) == 2  # slots 6 and 7
    assert rows_of(store, LedgerEvent.STARTED) == 2  # of slots 7 and 8: stored after checkpoint 5
    assert rows_of(store, LedgerEvent.ABORTED) == 1  # stored after checkpoint 5 too
    for kept in (LedgerEvent.EPOCH, LedgerEvent.INITIAL, LedgerEvent.GAP, LedgerEvent.LOST):
        assert rows_of(store, kept) == 1, kept
    # a restart after the expiry continues from the same head and publishes the same txn
    assert later.head() == head
    assert later.committed_unpublished() == unpublished == [store.commit_at(8)]
    assert later.initial_offsets() == {TopicPartition(topic="src", partition=7): 5}
    assert later.max_epoch() == 1
    assert later.seal(2, "c2", head_seq=head[0])
    later.after_won_slot(head[0] + 1, epoch=2, coordinator="c2", seal=True)
    assert later.head()[1] == head[1] and later.head()[0] == head[0] + 1
    assert later.commit_at(3) is None and not later.claim_commit(commit_row(store, 3, "e9_t1", rng(0, 0, 5), epoch=9))
    assert later.history(limit=10)[0].txn == "e2_t0"
    assert last.txn in [s.txn for s in later.history(limit=10)]
    # the audit runs from the oldest checkpoint left: sound but for the LOST alarm
    assert later.audit() == ["txn e1_t5 (commit 5) was committed but never published: stage table gone"]
    assert head == (
        8,
        {tp0: 20, TopicPartition(topic="src", partition=1): 30, TopicPartition(topic="src", partition=2): 30},
    )
    # the seal's checkpoint (slot 7: slot 8 is unpublished) is the next horizon; slot 8 stays
    assert later.expire() == 7
    assert [c.commit_seq for c in later.commits()] == [8, 9]
    assert later.committed_unpublished() == unpublished
    assert later.head()[1] == head[1]
    assert later.expire() == 7  # again: nothing more goes


def test_the_audit_from_the_oldest_checkpoint_still_finds_overlaps_and_gaps(new_store) -> None:
    store = new_store(checkpoint_every=3)
    fill(store, 4)
    later = new_store(retention_s=DAY_S, wall_clock=lambda: time.time() + 2 * DAY_S)
    assert later.expire() == 2
    # src/2 last committed in slot 2, which has expired: the checkpoint stands for it
    assert later.claim_commit(commit_row(store, 5, "e1_t5", rng(2, 5, 25)))  # 5..9 of src/2 again
    assert later.claim_commit(commit_row(store, 6, "e1_t6", rng(1, 30, 40)))  # 20..29 of src/1 never
    assert [c.commit_seq for c in later.commits()] == [3, 4, 5, 6]
    problems = later.audit()
    assert problems == [
        "src/2: offsets 5..9 are committed twice, by the checkpoint at slot 2 and commit 5 (txn e1_t5)",
        "src/1: offsets 20..29 were never committed, between commit 4 (txn e1_t4) and commit 6 (txn e1_t6)",
    ], problems


def test_ensure_tables_adds_the_indexes_to_a_ledger_of_the_previous_version(ledger_section: ClickHouseSection) -> None:
    database = unique_name("t_old_ledger")
    admin = make_client(msgspec.structs.replace(ledger_section, database="default"))
    admin.command(f"CREATE DATABASE `{database}`")
    try:
        old_ddl = (
            ledger.create_table_sql(database).split(",\n    INDEX")[0]
            + "\n)\nENGINE"
            + ledger.create_table_sql(database).split("\nENGINE", 1)[1]
        )
        assert "INDEX" not in old_ddl
        admin.command(old_ddl)
        store = LedgerStore(admin, database, "old")
        assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10)))
        assert store.ensure_tables() is False
        assert store.ensure_tables() is False  # idempotent
        names = {
            r[0] for r in store._query("indexes", ledger.existing_indexes_sql(), database=database, table=ledger.TABLE)
        }
        assert names == {name for name, _ in ledger.SKIP_INDEXES}
        assert store.head() == (1, {TopicPartition(topic="src", partition=0): 10})
        assert store.txn("e1_t1") is not None
    finally:
        admin.command(f"DROP DATABASE IF EXISTS `{database}` SYNC")
