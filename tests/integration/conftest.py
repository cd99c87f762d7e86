"""Fixtures of the integration tests: the ledger's tables in the module's fresh database."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from clients.clickhouse import make_client
from coordinator.ledger_store import LedgerStore
from protocol.config import ClickHouseSection


@pytest.fixture(scope="module")
def ledger_section(stack, ch_database: str) -> ClickHouseSection:  # TestStack
    """The ``[clickhouse]`` section of the session's ClickHouse, on the module's fresh database."""
    url = urlsplit(stack.clickhouse_url)
    return ClickHouseSection(
        url=f"{url.scheme}://{url.hostname}:{stack.clickhouse_port}",
        database=ch_database,
        user=url.username or "default",
        password=url.password or "",
        target_table="events",
    )


@pytest.fixture(scope="module")
def ledger_tables(ledger_section: ClickHouseSection) -> None:
    """The ledger's tables in the module's database, created once (and idempotently)."""
    store = LedgerStore(make_client(ledger_section), ledger_section.database, "any")
    assert store.ensure_tables() is True
    assert store.ensure_tables() is False  # idempotent
