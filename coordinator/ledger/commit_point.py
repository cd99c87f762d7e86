"""How a claimer wins a commit slot or an epoch (``ledger.commit_point``), through one pipeline's
``coordinator.ledger.access.LedgerAccess`` (the ledger store).

- ``TokenCommitPoint``: the row is inserted into the ledger with the slot's deduplication token
  and read back; the claim is won if the surviving row is this claim's (``protocol.ledger.sql``).
- ``KeeperCommitPoint``: the slot's key is inserted into the KeeperMap table of claims in strict
  mode, then the winner writes its row into the ledger (``protocol.ledger.claims``) and reads the
  slot back: the ledger's row decides, so a token-mode claim that reached the ledger first wins
  the slot even against the key (one winner whatever the mix of commit points).

Both answer ``claim`` with True (won), False (another claim owns the slot) or a
``ClickHouseError``, which leaves the outcome unknown: claiming the same row again (same
``claim_id``) is safe and answers it.
"""

from __future__ import annotations

import logging
from typing import Any

from clients.clickhouse import is_clickhouse_failure
from clients.failpoints import FailpointError, hit
from coordinator.ledger.access import LedgerAccess
from protocol.errors import ClickHouseError, SetupError
from protocol.ledger import claims as ledger_claims
from protocol.ledger.rows import LedgerEvent, LedgerRow

log = logging.getLogger(__name__)


class TokenCommitPoint:
    """The claim is the ledger insert itself, deduplicated by the slot's token. No I/O in the constructor."""

    name = "token"

    def __init__(self, store: LedgerAccess) -> None:
        self._store = store

    def ensure_table(self) -> None:
        """Nothing to create: the ledger is the commit point."""

    def claim(self, row: LedgerRow, token: str, what: str) -> bool:
        self._store._insert(row, token, what)
        winner = self._store._slot_winner(row.event, ledger_claims.slot_of(row))
        return winner is not None and winner.claim_id == row.claim_id

    def owner(self, event: LedgerEvent, slot: int) -> LedgerRow | None:
        return self._store._slot_winner(event, slot)

    def forget_through(self, commit_seq: int) -> None:
        """Nothing to forget: the ledger's expiry covers the claims."""


class KeeperCommitPoint:
    """The claim is a strict-mode KeeperMap insert of the slot's key; the winner's row then goes into
    the ledger. No I/O in the constructor."""

    name = "keeper"

    def __init__(self, store: LedgerAccess, *, keeper_path: str, cluster: str = "") -> None:
        self._store = store
        self.keeper_path = keeper_path
        self._cluster = cluster

    def ensure_table(self) -> None:
        """Create the claims table if missing; a server without Keeper is refused with what to do."""
        store = self._store
        ddl = ledger_claims.create_table_sql(store._database, self.keeper_path, cluster=self._cluster)
        try:
            store._retry("create the KeeperMap table of claims")(store._client.command, ddl)
        except ClickHouseError as exc:
            raise SetupError(
                f'ledger.commit_point = "keeper" needs a ClickHouse server with Keeper (or ZooKeeper) configured, '
                f"and creating {store._database}.{ledger_claims.TABLE} on Keeper path {self.keeper_path} failed: "
                f'{exc}. Configure <zookeeper> on the server, or set ledger.commit_point = "token"'
            ) from exc

    def claim(self, row: LedgerRow, token: str, what: str) -> bool:
        # Commit step 6a (keeper): the key. Exactly one claimer of a slot gets it.
        winner = self._claim_key(row, what)
        slot = ledger_claims.slot_of(row)
        if winner.claim_id != row.claim_id:
            self._copy(winner, token, what)
            return False
        if self._covered(row):  # a late claim of a forgotten slot got the key again: it owns nothing
            log.warning("a claim of a slot a checkpoint covers got its key; it owns nothing", extra={"slot": slot})
            return False
        if row.stage_table:  # a txn's commit (not a seal's or an epoch's)
            hit("leader.after-keeper-claim", row.coordinator)
        # Commit step 6b (keeper): the winner's row in the ledger (a retry finds the key its own).
        self._store._insert(row, token, what)
        # Commit step 6c (keeper): the ledger's row of the slot decides. It is this claim's unless a
        # claimer of the token commit point wrote the slot's row first (two commit points on one
        # ledger, ``coordinator.ledger.commit_points``): then that row owns the slot and this claim lost.
        owner = self._store._slot_winner(row.event, slot)
        if owner is None or owner.claim_id != row.claim_id:
            log.error(
                "a claim of another commit point owns the slot: this claim lost",
                extra={
                    "slot": slot,
                    "owner": owner.txn if owner else "?",
                    "owner_coordinator": owner.coordinator if owner else "",
                },
            )
            return False
        return True

    def owner(self, event: LedgerEvent, slot: int) -> LedgerRow | None:
        """The ledger's row of the slot, else the key's (its row not yet copied), else None."""
        found = self._store._slot_winner(event, slot)
        if found is not None:
            return found
        kind = ledger_claims.kind_of(event)
        if event is LedgerEvent.COMMITTED and self._covered_slot(slot):
            return None  # decided long ago; its rows expired (a key found now is a late claim)
        return self._read_key(ledger_claims.key(self._store.pipeline, kind, slot), f"read the claim of {kind} {slot}")

    def forget_through(self, commit_seq: int) -> None:
        """Delete the commit keys up to ``commit_seq``; call only once a checkpoint covers it."""
        store = self._store
        store._retry(f"forget the commit claims through slot {commit_seq}")(
            store._client.command,
            ledger_claims.forget_sql(store._database),
            parameters={"pipeline": store.pipeline, "through": commit_seq},
            settings=ledger_claims.READ_SETTINGS,
        )

    # -- plumbing -----------------------------------------------------------------------------

    def _copy(self, winner: LedgerRow, token: str, what: str) -> None:
        """Put the winner's row into the ledger unless it is there: it may have died between its key
        and its row. Not for a slot a checkpoint covers (its key is a late claim's)."""
        if self._covered(winner) or self._store._slot_winner(winner.event, ledger_claims.slot_of(winner)) is not None:
            return
        self._store._insert(winner, token, f"copy the winning claim of {what} into the ledger")

    def _claim_key(self, row: LedgerRow, what: str) -> LedgerRow:
        """Insert ``row``'s key unless it exists; the row the key holds afterwards.

        An insert answered without error created the key (``protocol.ledger.claims``; over HTTP an
        error raised after ClickHouse began its answer still reaches the client, as the exception
        code header or a broken response). A failed insert is not trusted either way (an existing
        key and an unreachable Keeper are one code; a lost answer may hide a key taken): the key
        read back answers. A key still missing is retried."""
        store = self._store
        parameters = ledger_claims.claim_parameters(store.pipeline, row)
        key = str(parameters["key"])

        def attempt() -> LedgerRow:
            failure: BaseException | None = None
            try:
                store._client.command(
                    ledger_claims.claim_sql(store._database),
                    parameters=parameters,
                    settings=ledger_claims.CLAIM_SETTINGS,
                )
            except Exception as exc:
                if not is_clickhouse_failure(exc):
                    raise
                failure = exc
            try:
                hit("keeper.after-key-insert", row.coordinator)
            except FailpointError as exc:  # the answer lost on its way back
                failure = failure or exc
            if failure is None:
                return row  # Keeper created the key in this very insert
            held = self._read_key_once(key)
            if held is None:
                raise ClickHouseError(f"{what}: Keeper took no key {key} ({failure})", retryable=True)
            return held

        won: LedgerRow = store._retry(what)(attempt)
        return won

    def _read_key(self, key: str, what: str) -> LedgerRow | None:
        return self._store._retry(what)(self._read_key_once, key)

    def _read_key_once(self, key: str) -> LedgerRow | None:
        store = self._store
        rows = store._client.query(
            ledger_claims.owner_sql(store._database),
            parameters={"key": key},
            settings={**store._read_settings, **ledger_claims.READ_SETTINGS},
        ).result_rows
        return ledger_claims.decode_row(rows[0][0]) if rows else None

    def _covered(self, row: LedgerRow) -> bool:
        return row.event is LedgerEvent.COMMITTED and self._covered_slot(row.commit_seq)

    def _covered_slot(self, slot: int) -> bool:
        latest = self._store.latest_checkpoint()
        return latest is not None and latest.commit_seq >= slot


def commit_point(store: LedgerAccess, name: str, **kwargs: Any) -> TokenCommitPoint | KeeperCommitPoint:
    """The commit point called ``name`` (``ledger.commit_point``) of ``store``."""
    if name == "keeper":
        return KeeperCommitPoint(store, **kwargs)
    if name == "token":
        return TokenCommitPoint(store)
    raise ValueError(f'ledger.commit_point must be "token" or "keeper", not {name!r}')
