"""Fixtures of the integration tests: the ledger's tables in the module's fresh database, and
ledger stores of either commit point (``ledger.commit_point``): ``token`` on the session's
ClickHouse, ``keeper`` on the one configured for a real ZooKeeper (``keeper_stack``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from protocol.config.sections import ClickHouseSection
from tests.helpers import unique_name

COMMIT_POINTS = ("token", "keeper")


def _section(stack, database: str) -> ClickHouseSection:  # stack: a TestStack
    url = urlsplit(stack.clickhouse_url)
    return ClickHouseSection(
        url=f"{url.scheme}://{url.hostname}:{stack.clickhouse_port}",
        database=database,
        user=url.username or "default",
        password=url.password or "",
        target_table="events",
    )


def _ensure_tables(section: ClickHouseSection, commit_point: str) -> None:
    store = LedgerStore(make_client(section), section.database, "any", commit_point=commit_point)
    assert store.ensure_tables() is True
    assert store.ensure_tables() is False  # idempotent


@pytest.fixture(scope="module")
def ledger_section(stack, ch_database: str) -> ClickHouseSection:  # TestStack
    """The ``[clickhouse]`` section of the session's ClickHouse, on the module's fresh database."""
    return _section(stack, ch_database)


@pytest.fixture(scope="module")
def ledger_tables(ledger_section: ClickHouseSection) -> None:
    """The ledger's tables in the module's database, created once (and idempotently)."""
    _ensure_tables(ledger_section, "token")


@pytest.fixture(scope="module")
def keeper_ledger_section(keeper_stack) -> Iterator[ClickHouseSection]:  # TestStack
    """A fresh database of the module on the ClickHouse configured for ZooKeeper, with the ledger's
    tables and the KeeperMap table of claims."""
    name = unique_name("t_keeper")
    admin = keeper_stack.clickhouse_client()
    admin.command(f"CREATE DATABASE `{name}`")
    section = _section(keeper_stack, name)
    _ensure_tables(section, "keeper")
    yield section
    admin.command(f"DROP DATABASE IF EXISTS `{name}` SYNC")
    admin.close()


@pytest.fixture(params=COMMIT_POINTS)
def any_store(request: pytest.FixtureRequest) -> Callable[..., LedgerHistory]:
    """Stores of one fresh pipeline with the commit point of the test's parameter, each with its own
    client (as separate coordinators have); keyword arguments go to ``LedgerStore``."""
    if request.param == "keeper":
        section = request.getfixturevalue("keeper_ledger_section")
    else:
        section = request.getfixturevalue("ledger_section")
        request.getfixturevalue("ledger_tables")
    pipeline = unique_name("p")
    return lambda **kw: LedgerHistory(
        make_client(section), section.database, pipeline, commit_point=request.param, **kw
    )
