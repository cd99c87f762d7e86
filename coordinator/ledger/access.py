"""What the commit points (``coordinator.ledger.commit_point``) and the ledger's upkeep
(``coordinator.ledger.upkeep``) use of the ledger store (``coordinator.ledger.store.LedgerStore``):
its table's I/O, with the store's retries and settings, and the reads they build on.

The store makes both and hands itself in; they see it through ``LedgerAccess`` only, so neither
imports the store, and the store's other methods are not theirs to call.
"""

from __future__ import annotations

from typing import Any, Protocol

from clients.clickhouse import ClickHouseRetrying
from protocol.ledger.rows import LedgerEvent, LedgerRow


class Forgetting(Protocol):
    """A commit point, as the upkeep sees it: claims a checkpoint covers can be forgotten."""

    def forget_through(self, commit_seq: int) -> None: ...


class LedgerAccess(Protocol):
    """One pipeline's ledger, as its commit point and its upkeep use it."""

    _client: Any
    _database: str
    _read_settings: dict[str, Any]

    @property
    def pipeline(self) -> str: ...

    @property
    def commit_point(self) -> Forgetting: ...

    def _retry(self, what: str) -> ClickHouseRetrying: ...

    def _query(self, what: str, sql: str, **params: Any) -> list[tuple]: ...

    def _command(self, what: str, sql: str, **params: Any) -> None: ...

    def _insert(self, row: LedgerRow, token: str, what: str) -> None: ...

    def _slot_winner(self, event: LedgerEvent, slot: int) -> LedgerRow | None: ...

    def latest_checkpoint(self) -> LedgerRow | None: ...

    def committed_unpublished(self, *, after: int | None = None) -> list[LedgerRow]: ...

    def checkpoint(self, *, epoch: int, coordinator: str) -> int: ...

    def expire(self) -> int: ...
