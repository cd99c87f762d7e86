"""Statements on the embedded endpoint run side by side and can be cancelled, as on a server:
``system.processes`` lists them under the query ids clients chose, ``KILL QUERY WHERE query_id``
stops one, and so does its client closing the connection.

No test measures time: concurrency is shown by two statements seen running at the same moment.
"""

from __future__ import annotations

import socket
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from tests.helpers import wait_until

#: Runs for ~10 s unless cancelled; the engine checks for cancellation between its 1-row blocks.
LONG_QUERY = "SELECT sum(sleepEachRow(0.01)) FROM numbers(1000) SETTINGS max_block_size = 1"
QUERY_WAS_CANCELLED = 394


def new_client(port: int):  # clickhouse_connect Client
    return clickhouse_connect.get_client(host="127.0.0.1", port=port, autogenerate_session_id=False)


def running_ids(port: int) -> set[str]:
    rows = new_client(port).query("SELECT query_id FROM system.processes").result_rows
    return {qid for (qid,) in rows}


def start_long_query(pool: ThreadPoolExecutor, port: int, query_id: str) -> Future:
    return pool.submit(lambda: new_client(port).query(LONG_QUERY, settings={"query_id": query_id}))


def assert_cancelled(future: Future) -> None:
    with pytest.raises(DatabaseError) as err:
        future.result(timeout=60)
    assert err.value.code == QUERY_WAS_CANCELLED, str(err.value)


def test_two_statements_are_seen_running_at_once(port: int) -> None:
    ids = [f"conc-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        futures = [start_long_query(pool, port, qid) for qid in ids]
        try:
            wait_until(lambda: set(ids) <= running_ids(port), 30, "both statements listed in system.processes")
        finally:
            new_client(port).command(f"KILL QUERY WHERE query_id IN ('{ids[0]}', '{ids[1]}') SYNC")
        for future in futures:
            assert_cancelled(future)


def test_kill_query_by_query_id_cancels_only_that_statement(port: int) -> None:
    victim, survivor = f"victim-{uuid.uuid4().hex[:8]}", f"survivor-{uuid.uuid4().hex[:8]}"
    client = new_client(port)
    with ThreadPoolExecutor(2) as pool:
        doomed = start_long_query(pool, port, victim)
        kept = pool.submit(
            lambda: new_client(port).query(
                "SELECT sum(sleepEachRow(0.001)) FROM numbers(100) SETTINGS max_block_size = 1",
                settings={"query_id": survivor},
            )
        )
        wait_until(lambda: victim in running_ids(port), 30, "the victim statement to run")
        killed = client.query(f"KILL QUERY WHERE query_id = '{victim}' SYNC").result_rows
        assert [row[0] for row in killed] == ["finished"]
        assert_cancelled(doomed)
        assert kept.result(timeout=60).result_rows == [(0,)]
    assert victim not in running_ids(port)


def test_closing_the_connection_cancels_its_statement(port: int) -> None:
    query_id = f"abandoned-{uuid.uuid4().hex[:8]}"
    body = LONG_QUERY.encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST /?query_id={query_id} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: query_id in running_ids(port), 30, "the statement to run")
    wait_until(lambda: query_id not in running_ids(port), 30, "the abandoned statement to be cancelled")
    assert new_client(port).command("SELECT 1") == 1
