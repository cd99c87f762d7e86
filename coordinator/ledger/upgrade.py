"""Creates the ledger's tables (``ensure``), or brings a ledger table made by an earlier chtxn version
up to this one's shape (``upgrade``): the skip indexes (``protocol.ledger.rows.SKIP_INDEXES``) and the
columns added since (``protocol.ledger.rows.ADDED_COLUMNS``).

Idempotent and additive: nothing is dropped or rewritten, rows stored before read each added
column as its default, and a coordinator of the earlier version keeps writing (its inserts name
their columns). ``chtxn init`` and every coordinator start run it (``LedgerStore.ensure_tables``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.dead_letters import letters as dead_letters
from protocol.ledger import rows as ledger


def ensure(
    query: Callable[..., list[tuple]],
    command: Callable[[str, str], None],
    database: str,
    *,
    replicated: bool,
    cluster: str,
    ensure_commit_point: Callable[[], None],
) -> bool:
    """Create the dead-letter table, the commit point's table (``ensure_commit_point``) and the
    ledger if missing, else ``upgrade`` the ledger; True if this call created the ledger."""
    command(
        "create the dead-letter table", dead_letters.create_table_sql(database, replicated=replicated, cluster=cluster)
    )
    ensure_commit_point()
    exists = query("check the ledger table", f"EXISTS TABLE {ledger.qualified(database)}")
    if int(exists[0][0]) == 1:
        upgrade(query, command, database, cluster)
        return False
    command("create the ledger table", ledger.create_table_sql(database, replicated=replicated, cluster=cluster))
    return True


def upgrade(
    query: Callable[..., list[tuple]], command: Callable[[str, str], None], database: str, cluster: str = ""
) -> None:
    """Add what the ledger of ``database`` lacks. ``query(what, sql, **params)`` reads and
    ``command(what, sql)`` runs a statement, both retrying (``LedgerStore``)."""
    where: dict[str, Any] = {"database": database, "table": ledger.TABLE}
    indexes = {r[0] for r in query("list the ledger's indexes", ledger.existing_indexes_sql(), **where)}
    for name, _ in ledger.SKIP_INDEXES:
        if name not in indexes:
            for statement in ledger.add_index_sql(database, name, cluster=cluster):
                command(f"add index {name} to the ledger", statement)
    columns = {r[0] for r in query("list the ledger's columns", ledger.existing_columns_sql(), **where)}
    for name, _ in ledger.ADDED_COLUMNS:
        if name not in columns:
            command(f"add column {name} to the ledger", ledger.add_column_sql(database, name, cluster=cluster))
