"""Commit points mixed on one ledger (a token-mode coordinator beside a keeper-mode one) against
chDB configured for a real ZooKeeper; interleavings scripted with failpoints.

Each test names the failure it showed on main (0e354a1) in its docstring.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from clients import failpoints
from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from protocol.config.sections import ClickHouseSection
from tests.helpers import unique_name
from tests.integration.ledger_writes import commit_row, rng


@pytest.fixture
def stores(keeper_ledger_section: ClickHouseSection) -> Callable[[str], LedgerHistory]:
    """Stores of one fresh pipeline claiming by the commit point named, each with its own client."""
    section = keeper_ledger_section
    pipeline = unique_name("p")
    return lambda mode: LedgerHistory(make_client(section), section.database, pipeline, commit_point=mode)


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    failpoints.disarm()


def test_a_keeper_claim_and_a_token_claim_of_one_slot_have_one_winner(stores) -> None:
    """The keeper claimer K wins slot 2's key and is held before its row; the token claimer T
    inserts its row for slot 2 and reads it back: T's. K then writes its row (deduplicated away:
    T's is the slot's) and must lose. On main both were told they won slot 2 (K never read the
    ledger back): the ledger named T's txn, the key K's."""
    token, keeper = stores("token"), stores("keeper")
    assert token.claim_commit(commit_row(token, 1, "e1_t1", rng(0, 0, 10), epoch=1, who="T"))
    held = failpoints.arm("leader.after-keeper-claim", "pause*1", who="K")
    outcome: dict[str, bool | BaseException] = {}

    def claim() -> None:
        try:
            outcome["K"] = keeper.claim_commit(commit_row(keeper, 2, "e2_t1", rng(0, 10, 30), epoch=2, who="K"))
        except BaseException as exc:  # surfaced below
            outcome["K"] = exc

    k = threading.Thread(target=claim, daemon=True)
    k.start()
    assert held.reached.wait(60), "K never won slot 2's key"
    t_won = token.claim_commit(commit_row(token, 2, "e1_t2", rng(0, 10, 20), epoch=1, who="T"))
    failpoints.release("leader.after-keeper-claim")
    k.join(60)
    assert not k.is_alive()
    assert t_won is True, "T's row is the ledger's row of slot 2"
    assert outcome["K"] is False, f"two winners of slot 2: T and K ({outcome['K']})"
    owner = token.commit_at(2)
    assert owner is not None and owner.txn == "e1_t2"
    assert keeper.commit_at(2) == owner
