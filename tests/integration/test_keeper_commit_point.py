"""The Keeper-backed commit point (``ledger.commit_point = "keeper"``, ``coordinator.ledger.commit_point``)
against chDB configured for a real ZooKeeper: what it adds to the ledger tests both commit points
pass (test_ledger_store.py, test_ledger_checkpoints.py).

Each test names the broken claim it was run against and failed with, in its docstring. What a claim
costs is counted on the wire: the HTTP requests its client sends (``Requests``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
import urllib3

from clients import failpoints
from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from protocol.config.sections import ClickHouseSection
from protocol.errors import ClickHouseError, SetupError
from protocol.ledger import claims as ledger_claims, rows as ledger
from protocol.ledger.rows import LedgerEvent, LedgerRow
from protocol.messages import TopicPartition
from tests.helpers import unique_name, wait_until
from tests.integration.ledger_writes import commit_row, rng


@pytest.fixture
def new_store(keeper_ledger_section: ClickHouseSection) -> Callable[..., LedgerHistory]:
    """Keeper-mode stores of one fresh pipeline, each with its own client."""
    pipeline = unique_name("p")
    section = keeper_ledger_section
    return lambda **kw: LedgerHistory(make_client(section), section.database, pipeline, commit_point="keeper", **kw)


@pytest.fixture(autouse=True)
def _disarm() -> None:
    yield
    failpoints.disarm()


def slot_rows(store: LedgerStore, seq: int) -> list[LedgerRow]:
    rows = store._query(
        "read a slot's rows",
        f"SELECT {ledger.SELECT_COLUMNS} FROM {store.table} WHERE pipeline = {{pipeline:String}} "
        "AND event = 'COMMITTED' AND commit_seq = {seq:UInt64}",
        seq=seq,
    )
    return [ledger.from_result_row(r) for r in rows]


class Requests(urllib3.PoolManager):
    """The HTTP transport of a real clickhouse-connect client, noting each request it sends as
    ``"<verb> <table>"`` (``KEY_INSERT`` ...): a claim's round trips, counted on the wire. A body
    streamed (compressed) is ``client.insert``'s, which the store uses for ledger rows only."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        body = kwargs.get("body") or b""
        if isinstance(body, (bytes, str)):
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            table = ledger_claims.TABLE if f"`{ledger_claims.TABLE}`" in text else ledger.TABLE
            self.sent.append(f"{text.split(maxsplit=1)[0]} {table}")
        else:
            self.sent.append(ROW_INSERT)
        return super().request(method, url, *args, **kwargs)

    def taken(self) -> list[str]:
        """The requests noted since the last call."""
        sent, self.sent = self.sent, []
        return sent


KEY_INSERT, KEY_READ = f"INSERT {ledger_claims.TABLE}", f"SELECT {ledger_claims.TABLE}"
ROW_INSERT, LEDGER_READ = f"INSERT {ledger.TABLE}", f"SELECT {ledger.TABLE}"


def requests_of(store: LedgerStore) -> Requests:
    """Count the requests of ``store`` from now on (its client sends them through ``Requests``)."""
    store._client.http = requests = Requests()
    return requests


def race(claimers: list[LedgerStore], seq: int) -> dict[str, bool]:
    """Each claimer (``c<i>``, also its ``claim_id``) claims slot ``seq``, all released at once; who won."""
    start = threading.Barrier(len(claimers))
    results: dict[str, bool] = {}

    def claim(store: LedgerStore, who: str) -> None:
        mine = msgspec.structs.replace(commit_row(store, seq, f"t{seq}", rng(0, 0, seq), who=who), claim_id=who)
        start.wait(30)
        results[who] = store.claim_commit(mine)

    threads = [threading.Thread(target=claim, args=(s, f"c{i}")) for i, s in enumerate(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def claim_keys(store: LedgerStore) -> list[tuple[str, str]]:
    """(kind, slot) of every key of the pipeline in the KeeperMap table, sorted."""
    rows = store._client.query(
        f"SELECT kind, slot FROM {ledger_claims.qualified(store._database)} WHERE pipeline = {{p:String}}",
        parameters={"p": store.pipeline},
    ).result_rows
    return sorted((kind, int(slot)) for kind, slot in rows)


def test_a_late_claim_past_any_deduplication_window_leaves_no_second_row(new_store) -> None:
    """With the ledger's deduplication window at one block, a second claim of slot 1 made after
    another insert is not deduplicated by ClickHouse: the token commit point stores its row too
    (readers then fall back on "first claim wins"). The keeper commit point never writes it.
    Broken claim run against: ``TokenCommitPoint`` in place of ``KeeperCommitPoint`` (2 rows)."""
    store = new_store()
    store._client.command(f"ALTER TABLE {store.table} MODIFY SETTING non_replicated_deduplication_window = 1")
    try:
        assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10), epoch=1))
        store.append(LedgerRow(pipeline=store.pipeline, txn="e1_t1", event=LedgerEvent.PUBLISHED, epoch=1))
        assert not store.claim_commit(commit_row(store, 1, "e2_t1", rng(0, 0, 12), epoch=2, who="c2"))
    finally:
        store._client.command(f"ALTER TABLE {store.table} MODIFY SETTING non_replicated_deduplication_window = 100000")
    assert [(r.txn, r.epoch) for r in slot_rows(store, 1)] == [("e1_t1", 1)]
    assert store.head() == (1, {TopicPartition(topic="src", partition=0): 10})


def test_a_claimer_dead_between_its_key_and_its_row_is_copied_into_the_ledger_by_the_next(new_store) -> None:
    """Leader c1 wins slot 1's key and dies before its row. The head cannot show slot 1 yet; c2's
    seal of slot 1 loses and copies c1's row from Keeper, so the head moves on and c2 rolls c1's
    txn forward. c1's own retry of the same claim then wins, storing its row once.
    Broken claim run against: a loser that does not copy the winner (the head stayed at 0, so a
    take-over would seal the same slot for ever)."""
    c1, c2 = new_store(), new_store()
    row = msgspec.structs.replace(commit_row(c1, 1, "e1_t1", rng(0, 0, 10), epoch=1), claim_id="c1-claim")
    failpoints.arm("leader.after-keeper-claim", "raise*1", who="c1")
    with pytest.raises(failpoints.FailpointError):
        c1.claim_commit(row)
    assert claim_keys(c1) == [("commit", 1)]
    assert c2.head() == (0, {}), "a key without its row is not in the chain yet"

    assert not c2.seal(2, "c2", head_seq=0)
    winner = c2.commit_at(1)
    assert winner is not None and (winner.txn, winner.claim_id) == ("e1_t1", "c1-claim")
    assert c2.head() == (1, {TopicPartition(topic="src", partition=0): 10})
    assert [c.txn for c in c2.committed_unpublished()] == ["e1_t1"]

    assert c1.claim_commit(row), "the winner's retry (same claim_id) answers its unknown outcome: won"
    assert [r.claim_id for r in slot_rows(c1, 1)] == ["c1-claim"]
    assert c2.seal(2, "c2", head_seq=1)


def test_commit_keys_of_checkpointed_slots_are_forgotten_and_a_late_claim_of_one_owns_nothing(new_store) -> None:
    """A checkpoint deletes the commit keys it covers (Keeper holds about one checkpoint interval of
    keys per pipeline). A stale leader claiming such a slot then gets its key again, and must still lose.
    Broken claim run against: ``KeeperCommitPoint._covered`` always False (the late claim won)."""
    store = new_store(checkpoint_every=3)
    for seq in (1, 2, 3):
        row = commit_row(store, seq, f"e1_t{seq}", rng(0, (seq - 1) * 10, seq * 10), epoch=1)
        assert store.claim_commit(row)
        store.append(msgspec.structs.replace(row, event=LedgerEvent.PUBLISHED, claim_id=""))
    assert store.checkpoint(epoch=1, coordinator="c1") == 3
    assert claim_keys(store) == [], "the covered commit keys are gone"

    late = commit_row(store, 2, "e1_t9", rng(0, 10, 99), epoch=1, who="stale")
    assert not store.claim_commit(late)
    owner = store.commit_at(2)
    assert owner is not None and owner.txn == "e1_t2"
    assert [r.txn for r in slot_rows(store, 2)] == ["e1_t2"], "the late claim wrote no row"
    assert store.head() == (3, {TopicPartition(topic="src", partition=0): 30})


def test_epoch_keys_stay_and_a_lost_epoch_claim_copies_the_winner(new_store) -> None:
    c1, c2 = new_store(), new_store()
    won = LedgerRow(pipeline=c1.pipeline, txn="", event=LedgerEvent.EPOCH, epoch=1, coordinator="c1", claim_id="c1")
    c1._client.command(  # c1 won epoch 1's key and died before its row
        ledger_claims.claim_sql(c1._database),
        parameters=ledger_claims.claim_parameters(c1.pipeline, won),
        settings=ledger_claims.CLAIM_SETTINGS,
    )
    assert c2.max_epoch() == 0
    assert not c2.claim_epoch(1, "c2")
    assert c2.max_epoch() == 1 and c2.epoch_owner(1) == "c1"
    assert c2.claim_epoch(2, "c2")
    assert claim_keys(c2) == [("epoch", 1), ("epoch", 2)]


def test_zookeeper_down_fails_the_claim_and_the_same_claim_wins_once_it_is_back(keeper_stack, new_store) -> None:
    """ZooKeeper stopped (its process, by PID): a claim fails with a ClickHouseError (outcome
    unknown), never a False that would be read as "another leader won". Started again (same port,
    same data), the same claim wins, once."""
    store = new_store(retries=2)
    assert store.claim_commit(commit_row(store, 1, "e1_t1", rng(0, 0, 10)))
    row = msgspec.structs.replace(commit_row(store, 2, "e1_t2", rng(0, 10, 20)), claim_id="during-outage")
    keeper = keeper_stack.keeper
    pid = keeper.pid
    keeper.stop()
    try:
        with pytest.raises(ClickHouseError, match=r"KEEPER_EXCEPTION|Keeper|ZooKeeper"):
            store.claim_commit(row)
    finally:
        keeper_stack.restart_keeper()
    assert keeper_stack.keeper.pid != pid
    assert wait_until(lambda: store.claim_commit(row), 60, "the claim to win", ignore=(ClickHouseError,))
    assert [r.claim_id for r in slot_rows(store, 2)] == ["during-outage"]
    assert store.head()[0] == 2


def test_a_server_without_keeper_is_refused_with_what_to_do(ledger_section: ClickHouseSection) -> None:
    store = LedgerStore(make_client(ledger_section), ledger_section.database, "p", commit_point="keeper")
    with pytest.raises(SetupError, match=r'needs a ClickHouse server with Keeper.*ledger.commit_point = "token"'):
        store.ensure_tables()


def test_a_claim_whose_key_insert_answered_holds_the_key_without_reading_it(new_store) -> None:
    """An insert ClickHouse answers without error created the key: the claim goes on to the
    checkpoint read, the row and the slot read back, four requests (an epoch claim three: no
    checkpoint covers an epoch). The late claim of a slot a checkpoint covers stops after two.
    Broken claim run against: main (f2e12e4), which read every key back (five, four and three)."""
    store = new_store(checkpoint_every=2)
    sent = requests_of(store)
    assert store.claim_epoch(1, "c1")
    assert sent.taken() == [KEY_INSERT, ROW_INSERT, LEDGER_READ]
    for seq in (1, 2):
        row = commit_row(store, seq, f"e1_t{seq}", rng(0, (seq - 1) * 10, seq * 10))
        assert store.claim_commit(row)
        assert sent.taken() == [KEY_INSERT, LEDGER_READ, ROW_INSERT, LEDGER_READ]
        store.append(msgspec.structs.replace(row, event=LedgerEvent.PUBLISHED, claim_id=""))
        sent.taken()
    assert store.checkpoint(epoch=1, coordinator="c1") == 2
    sent.taken()

    assert not store.claim_commit(commit_row(store, 1, "e1_t9", rng(0, 0, 99), who="stale"))
    assert sent.taken() == [KEY_INSERT, LEDGER_READ], "the late claim stops at the checkpoint"
    assert [r.txn for r in slot_rows(store, 1)] == ["e1_t1"]


def test_a_lost_claim_reads_the_key_back_and_finds_the_winner(new_store) -> None:
    """The key insert of a slot another claim holds is refused: the loser reads the key back, finds
    the winner's row in the ledger and writes nothing. Broken claim run against: a refused insert
    taken as a win (no key read; the ledger's row of the slot, step 6c, still made it lose here,
    the winner's row being there: the next test shows the double win)."""
    c1, c2 = new_store(), new_store()
    assert c1.claim_commit(commit_row(c1, 1, "e1_t1", rng(0, 0, 10)))
    sent = requests_of(c2)
    assert not c2.claim_commit(commit_row(c2, 1, "e2_t1", rng(0, 0, 12), epoch=2, who="c2"))
    assert sent.taken() == [KEY_INSERT, KEY_READ, LEDGER_READ, LEDGER_READ]
    assert [r.txn for r in slot_rows(c1, 1)] == ["e1_t1"]


def test_a_key_insert_whose_answer_is_lost_reads_the_key_back_and_wins(new_store) -> None:
    """Keeper took the key but the insert's answer never came back (failpoint
    ``keeper.after-key-insert``, as a dropped connection): the claim reads the key back, finds it
    its own and goes on, five requests; its row is stored once. Broken claim run against: a failed
    key insert taken as lost (the claim answered False while its own key stood)."""
    store = new_store()
    row = msgspec.structs.replace(commit_row(store, 1, "e1_t1", rng(0, 0, 10)), claim_id="c1-claim")
    sent = requests_of(store)
    lost = failpoints.arm("keeper.after-key-insert", "raise*1", who="c1")
    assert store.claim_commit(row)
    assert lost.fired == 1
    assert sent.taken() == [KEY_INSERT, KEY_READ, LEDGER_READ, ROW_INSERT, LEDGER_READ]
    assert [r.claim_id for r in slot_rows(store, 1)] == ["c1-claim"]
    assert claim_keys(store) == [("commit", 1)]


@contextmanager
def held_after_key_insert(store, row, who: str) -> Iterator[list[bool]]:
    """``store`` claims ``row`` (as ``who``) in a thread, held once its key insert has answered; the body
    runs meanwhile, then the claim goes on. Yields the claim's outcome, filled once it has ended."""
    held = failpoints.arm("keeper.after-key-insert", "pause*1", who=who)
    won: list[bool] = []
    claimer = threading.Thread(target=lambda: won.append(store.claim_commit(row)))
    claimer.start()
    try:
        assert held.reached.wait(30), f"{who}'s key insert never answered"
        yield won
    finally:
        failpoints.release("keeper.after-key-insert")
        claimer.join(60)


def test_two_claimers_of_one_slot_one_held_after_its_key_insert_exactly_one_wins(new_store) -> None:
    """c1's key insert is answered (taken) and c1 is held there, before it reads anything; c2 claims
    the same slot, is refused, reads c1's key and copies c1's row into the ledger. c1 goes on: its
    own row is the copy's (stored once) and c1 wins; c2 lost. Then four claimers race for each of
    five slots: one winner per slot, one row per slot, the winner's.
    Broken claim run against: a refused insert taken as a win (c2 won too)."""
    c1, c2 = new_store(), new_store()
    row = msgspec.structs.replace(commit_row(c1, 1, "e1_t1", rng(0, 0, 10)), claim_id="c1-claim")
    with held_after_key_insert(c1, row, "c1") as won:
        assert not c2.claim_commit(commit_row(c2, 1, "e2_t1", rng(0, 0, 12), epoch=2, who="c2"))
        copied = c2.commit_at(1)
        assert copied is not None and copied.claim_id == "c1-claim", "c2 copied c1's row"
    assert won == [True]
    assert [r.claim_id for r in slot_rows(c1, 1)] == ["c1-claim"]

    claimers = [new_store() for _ in range(4)]
    for seq in range(2, 7):
        results = race(claimers, seq)
        winners = [who for who, won_it in results.items() if won_it]
        assert len(results) == len(claimers) and len(winners) == 1, results
        assert [r.claim_id for r in slot_rows(c1, seq)] == winners


def test_a_stale_claimer_whose_refused_key_is_forgotten_meanwhile_takes_it_again_and_owns_nothing(new_store) -> None:
    """A stale claimer's key insert of slot 2 is refused (the winner's key is there) and the claimer
    is held before it reads the key; meanwhile a checkpoint covers slot 2 and forgets its key. The
    claimer reads no key, tries again, and this time its insert takes the key: a late claim, which
    must stop at the checkpoint and write no row, even past the ledger's deduplication window.
    Broken claim run against: ``KeeperCommitPoint._covered`` always False (a second row in slot 2)."""
    store, stale = new_store(checkpoint_every=3), new_store()
    store._client.command(f"ALTER TABLE {store.table} MODIFY SETTING non_replicated_deduplication_window = 1")
    try:
        for seq in (1, 2):
            row = commit_row(store, seq, f"e1_t{seq}", rng(0, (seq - 1) * 10, seq * 10))
            assert store.claim_commit(row)
            store.append(msgspec.structs.replace(row, event=LedgerEvent.PUBLISHED, claim_id=""))
        late = commit_row(stale, 2, "e1_t9", rng(0, 10, 99), who="stale")
        with held_after_key_insert(stale, late, "stale") as won:
            row = commit_row(store, 3, "e1_t3", rng(0, 20, 30))
            assert store.claim_commit(row)
            store.append(msgspec.structs.replace(row, event=LedgerEvent.PUBLISHED, claim_id=""))
            assert store.checkpoint(epoch=1, coordinator="c1") == 3
            assert claim_keys(store) == [], "the covered keys are forgotten"
    finally:
        store._client.command(f"ALTER TABLE {store.table} MODIFY SETTING non_replicated_deduplication_window = 100000")
    assert won == [False]
    assert claim_keys(store) == [("commit", 2)], "the late claim took the key again (the next checkpoint forgets it)"
    assert [r.txn for r in slot_rows(store, 2)] == ["e1_t2"], "the late claim wrote no row"
    assert store.head() == (3, {TopicPartition(topic="src", partition=0): 30})
