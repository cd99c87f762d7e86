"""Large results stream as a server streams them: a 200 with chunked body, and an error part-way
through arrives inside the stream (ClickHouse's ``__exception__`` block, tagged by
``X-ClickHouse-Exception-Tag``), not as an up-front 500."""

from __future__ import annotations

import http.client
import json

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

FAILS_LATE = "SELECT number, throwIf(number = 300000, 'boom late') FROM numbers(400000) SETTINGS max_block_size = 10000"


def test_error_part_way_through_arrives_inside_a_200_stream(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/", body=FAILS_LATE.encode())
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Transfer-Encoding") == "chunked"
    tag = resp.getheader("X-ClickHouse-Exception-Tag")
    assert tag
    body = resp.read()
    assert body.startswith(b"0\t0\n1\t0\n")
    block = body[body.index(b"__exception__") :]
    assert block.startswith(f"__exception__\r\n{tag}\r\nCode: 395. DB::Exception: ".encode())
    assert b"boom late" in block
    assert block.endswith(f" {tag}\r\n__exception__\r\n".encode())


def test_clickhouse_connect_reads_a_streamed_result_and_a_streamed_error(port: int) -> None:
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port)
    rows = client.query("SELECT number, toString(number) FROM numbers(300000)").result_rows
    assert len(rows) == 300000 and rows[-1] == (299999, "299999")
    with pytest.raises(DatabaseError) as err:
        client.query(FAILS_LATE).result_rows  # noqa: B018 -- the rows are read lazily
    assert "boom late" in str(err.value)
    assert client.command("SELECT 1") == 1


def test_early_error_keeps_its_http_status(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/", body=b"SELECT throwIf(1, 'boom early')")
    resp = conn.getresponse()
    assert (resp.status, resp.getheader("X-ClickHouse-Exception-Code")) == (500, "395")
    assert b"boom early" in resp.read()


def test_formats_with_a_header_or_footer_read_as_one_output_over_many_blocks(port: int) -> None:
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port)
    sql = "SELECT number FROM numbers(5) SETTINGS max_block_size = 2"
    assert client.raw_query(sql, fmt="CSVWithNames") == b'"number"\n0\n1\n2\n3\n4\n'
    assert client.raw_query(sql, fmt="Values") == b"(0),(1),(2),(3),(4)"
    assert [row["number"] for row in json.loads(client.raw_query(sql, fmt="JSON"))["data"]] == [0, 1, 2, 3, 4]
    assert client.query_arrow(sql).column("number").to_pylist() == [0, 1, 2, 3, 4]
