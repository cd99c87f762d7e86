"""Fixtures of the embedded stand-ins' tests: a ClickHouse endpoint process per test module."""

from __future__ import annotations

from collections.abc import Iterator

import clickhouse_connect
import pytest

from tests.embedded.endpoint import running_endpoint


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[int]:
    """The port of an embedded ClickHouse endpoint of the test module's own, on a fresh data dir."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    with running_endpoint(tmp_path_factory.mktemp(module) / "data") as p:
        yield p


@pytest.fixture
def client(port: int) -> Iterator[clickhouse_connect.driver.Client]:
    """A clickhouse-connect client of the module's endpoint, closed after the test."""
    c = clickhouse_connect.get_client(host="127.0.0.1", port=port)
    yield c
    c.close()
