"""The embedded ClickHouse endpoint, driven only through clickhouse-connect over HTTP.

Each endpoint under test is a separate process (``python -m embedded.clickhouse_server``) on a
free port with a fresh data directory, as the stack launcher runs it.
"""

from __future__ import annotations

import datetime
import gzip
import json
import multiprocessing
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import clickhouse_connect
import lz4.frame
import pandas as pd
import pyarrow as pa
import pytest
import zstandard
from clickhouse_connect.driver.exceptions import DatabaseError

from embedded.ch_engine import MERGE_NICE
from tests.embedded.endpoint import running_endpoint


def make_table(client, name: str, extra: str = "") -> None:
    client.command(f"DROP TABLE IF EXISTS {name}")
    client.command(f"CREATE TABLE {name} (id UInt64, s String) ENGINE = MergeTree ORDER BY id {extra}")


def test_ping_and_root_answer_ok(client, port: int) -> None:
    assert client.ping()
    for path in ("/", "/ping"):
        resp = client.http.request("GET", f"http://127.0.0.1:{port}{path}")
        assert (resp.status, resp.data) == (200, b"Ok.\n")


def test_client_start_up_learns_version_timezone_and_settings(client) -> None:
    assert client.server_version.startswith("26.")
    assert client.server_tz is not None
    assert client.server_settings["max_execution_time"].readonly == 0


def test_merges_are_asked_to_yield_to_statements(client) -> None:
    # The engine shares the machine with the pipeline: its merge threads get a higher nice value.
    rows = client.query(
        "SELECT value FROM system.server_settings WHERE name = 'os_threads_nice_value_merge_mutate'"
    ).result_rows
    assert rows == [(str(MERGE_NICE),)]


def test_create_database_and_system_tables(client) -> None:
    client.command("CREATE DATABASE IF NOT EXISTS sysdb")
    client.command("CREATE DATABASE IF NOT EXISTS sysdb")
    client.command("CREATE TABLE IF NOT EXISTS sysdb.p (id UInt64) ENGINE = MergeTree ORDER BY id PARTITION BY id % 2")
    client.insert("p", [[1], [2], [3]], database="sysdb")
    tables = client.query("SELECT name, engine FROM system.tables WHERE database = 'sysdb'").result_rows
    assert tables == [("p", "MergeTree")]
    parts = client.query(
        "SELECT partition_id, sum(rows) FROM system.parts WHERE database = 'sysdb' AND table = 'p' AND active "
        "GROUP BY partition_id ORDER BY partition_id"
    ).result_rows
    assert parts == [("0", 1), ("1", 2)]


def test_row_and_column_oriented_inserts_round_trip_in_native(client) -> None:
    client.command("DROP TABLE IF EXISTS types")
    client.command(
        "CREATE TABLE types (id UInt64, s String, d DateTime, n Nullable(Int32), a Array(String), "
        "lc LowCardinality(String), f Float64) ENGINE = MergeTree ORDER BY id"
    )
    rows = [
        [1, "x", datetime.datetime(2024, 1, 1, 12, 0), None, ["a", "b"], "k", 1.5],
        [2, "ÿ\t\n", datetime.datetime(2024, 6, 1), -7, [], "k", -0.25],
    ]
    summary = client.insert("types", rows)
    assert summary.written_rows == 2
    columns = [list(col) for col in zip(*rows, strict=True)]
    columns[0] = [3, 4]
    client.insert("types", columns, column_oriented=True)
    got = client.query("SELECT * FROM types ORDER BY id").result_rows
    assert [list(r) for r in got] == [*rows, [3, *rows[0][1:]], [4, *rows[1][1:]]]


def test_arrow_and_pandas_in_and_out(client) -> None:
    make_table(client, "arrow_t")
    client.insert_arrow("arrow_t", pa.table({"id": pa.array([1, 2], pa.uint64()), "s": ["a", "b"]}))
    client.insert_df("arrow_t", pd.DataFrame({"id": [3, 4], "s": ["c", "d"]}))
    table = client.query_arrow("SELECT id, s FROM arrow_t ORDER BY id")
    assert table.column("id").to_pylist() == [1, 2, 3, 4]
    assert [v if isinstance(v, str) else v.decode() for v in table.column("s").to_pylist()] == ["a", "b", "c", "d"]
    df = client.query_df("SELECT id, s FROM arrow_t ORDER BY id")
    assert df["s"].tolist() == ["a", "b", "c", "d"]


def test_raw_inserts_with_query_in_body_or_url(client) -> None:
    make_table(client, "raw_t")
    client.raw_insert("raw_t", None, b'{"id":1,"s":"a"}\n{"id":2,"s":"b"}\n', fmt="JSONEachRow")
    client.raw_insert("raw_t", ["id", "s"], "3,c\n4,d\n", fmt="CSV")
    client.command("INSERT INTO raw_t FORMAT JSONEachRow", data='{"id":5,"s":"e"}\n')
    client.command("INSERT INTO raw_t VALUES (6, 'f')")
    assert client.query("SELECT id, s FROM raw_t ORDER BY id").result_rows == [
        (1, "a"),
        (2, "b"),
        (3, "c"),
        (4, "d"),
        (5, "e"),
        (6, "f"),
    ]


def _lz4_frames(data: bytes) -> bytes:
    half = len(data) // 2
    return lz4.frame.compress(data[:half]) + lz4.frame.compress(data[half:])


@pytest.mark.parametrize(
    "method, encode",
    [
        ("lz4", _lz4_frames),
        ("zstd", lambda d: zstandard.ZstdCompressor().compress(d[:100]) + zstandard.ZstdCompressor().compress(d[100:])),
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
    ],
)
def test_content_encoded_raw_insert(client, method: str, encode) -> None:
    table = f"enc_{method}"
    make_table(client, table)
    rows = b"".join(b'{"id":%d,"s":"v%d"}\n' % (i, i) for i in range(1000))
    client.raw_insert(table, None, encode(rows), fmt="JSONEachRow", compression=method)
    assert client.query(f"SELECT count(), sum(id) FROM {table}").result_rows == [(1000, 499500)]


@pytest.mark.parametrize("compress", ["lz4", "zstd", "gzip", False])
def test_client_compression_both_ways(port: int, compress) -> None:
    c = clickhouse_connect.get_client(host="127.0.0.1", port=port, compress=compress)
    table = f"cc_{compress or 'none'}"
    make_table(c, table)
    rows = [[i, f"value {i}"] for i in range(50_000)]
    c.insert(table, rows)
    assert [list(r) for r in c.query(f"SELECT id, s FROM {table} ORDER BY id").result_rows] == rows


def test_response_compressed_only_when_asked(client) -> None:
    asked = client.raw_stream(
        "SELECT 1", settings={"enable_http_compression": 1}, transport_settings={"Accept-Encoding": "zstd"}
    )
    assert asked.headers.get("Content-Encoding") == "zstd"
    assert zstandard.ZstdDecompressor().decompressobj().decompress(asked.read(decode_content=False)) == b"1\n"
    refused = client.raw_stream(
        "SELECT 1", settings={"enable_http_compression": 0}, transport_settings={"Accept-Encoding": "zstd"}
    )
    assert refused.headers.get("Content-Encoding") is None
    assert refused.read() == b"1\n"


def test_reply_headers_and_summary(client) -> None:
    resp = client.raw_stream("SELECT number FROM numbers(3)", fmt="JSONEachRow", settings={"query_id": "q-headers-1"})
    assert resp.headers["X-ClickHouse-Query-Id"] == "q-headers-1"
    assert resp.headers["X-ClickHouse-Format"] == "JSONEachRow"
    assert resp.headers["X-ClickHouse-Timezone"]
    assert resp.headers["X-ClickHouse-Server-Display-Name"]
    assert json.loads(resp.headers["X-ClickHouse-Summary"])["read_rows"] == "3"
    assert [int(json.loads(line)["number"]) for line in resp.read().splitlines()] == [0, 1, 2]
    default_format = client.http.request("POST", f"{client.url}/?default_format=JSONCompact", body=b"SELECT 1 AS x")
    assert default_format.headers["X-ClickHouse-Format"] == "JSONCompact"
    assert json.loads(default_format.data)["data"] == [[1]]
    make_table(client, "summary_t")
    summary = client.insert("summary_t", [[1, "a"], [2, "b"]], settings={"query_id": "q-insert-1"})
    assert (summary.written_rows, summary.query_id()) == (2, "q-insert-1")
    assert client.command("SELECT 1 WHERE 0") == ""  # an empty result still names its format


def test_settings_apply_to_one_statement_and_sessions_keep_set(client, port: int) -> None:
    assert client.command("SELECT getSetting('max_execution_time')", settings={"max_execution_time": 7}) == 7
    assert client.command("SELECT getSetting('max_execution_time')") == 0
    client.command("SET max_execution_time = 9")
    assert client.command("SELECT getSetting('max_execution_time')") == 9
    other = clickhouse_connect.get_client(host="127.0.0.1", port=port)
    assert other.command("SELECT getSetting('max_execution_time')") == 0
    with pytest.raises(DatabaseError) as err:
        client.command("SELECT 1", settings={"no_such_setting_xyz": 1})
    assert err.value.code == 115


def test_database_parameter_and_server_side_binding(port: int, client) -> None:
    client.command("CREATE DATABASE IF NOT EXISTS other_db")
    scoped = clickhouse_connect.get_client(host="127.0.0.1", port=port, database="other_db")
    assert scoped.command("SELECT currentDatabase()") == "other_db"
    assert client.command("SELECT currentDatabase()") == "default"
    assert client.query("SELECT {x:UInt32} + 1 AS y", parameters={"x": 41}).result_rows == [(42,)]


def test_deduplication_token_stores_a_repeated_insert_once(client) -> None:
    make_table(client, "dedup_t", "SETTINGS non_replicated_deduplication_window = 100")
    for _ in range(3):
        client.insert(
            "dedup_t", [[1, "a"], [2, "b"]], settings={"insert_deduplication_token": "p/e1_t1/t/0/0", "async_insert": 0}
        )
    client.raw_insert(
        "dedup_t",
        None,
        b'{"id":1,"s":"a"}\n',
        fmt="JSONEachRow",
        settings={"insert_deduplication_token": "p/e1_t1/t/0/1"},
    )
    client.raw_insert(
        "dedup_t",
        None,
        b'{"id":1,"s":"a"}\n',
        fmt="JSONEachRow",
        settings={"insert_deduplication_token": "p/e1_t1/t/0/1"},
    )
    assert client.command("SELECT count() FROM dedup_t") == 3


def test_errors_carry_clickhouse_codes(client) -> None:
    with pytest.raises(DatabaseError) as unknown:
        client.query("SELECT * FROM no_such_table_here")
    assert unknown.value.code == 60 and "UNKNOWN_TABLE" in str(unknown.value)
    with pytest.raises(DatabaseError) as syntax:
        client.command("SELEC 1")
    assert syntax.value.code == 62
    make_table(client, "bad_t")
    with pytest.raises(DatabaseError) as bad:
        client.raw_insert("bad_t", None, b'{"id":1,"s":"ok"}\n{"id":"zz","s":"x"}\n', fmt="JSONEachRow")
    assert bad.value.code == 27
    assert client.command("SELECT count() FROM bad_t") == 0
    readonly = client.http.request("GET", f"{client.url}/?query=DROP+TABLE+bad_t")
    assert (readonly.status, readonly.headers["X-ClickHouse-Exception-Code"]) == (500, "164")
    assert client.command("EXISTS TABLE bad_t") == 1


def test_move_partition_from_stage_to_target(client) -> None:
    make_table(client, "target", "PARTITION BY id % 3")
    client.command("DROP TABLE IF EXISTS stage")
    client.command("CREATE TABLE stage AS target")
    client.insert("target", [[100, "old"]])
    client.insert("stage", [[i, f"v{i}"] for i in range(9)])
    parts = client.query("SELECT DISTINCT partition_id FROM system.parts WHERE table = 'stage' AND active").result_rows
    for (partition_id,) in parts:
        client.command(f"ALTER TABLE stage MOVE PARTITION ID '{partition_id}' TO TABLE target")
    assert client.command("SELECT count() FROM stage") == 0
    assert client.command("SELECT count() FROM target") == 10


ROWS_PER_INSERT = 20


def _insert_worker(args: tuple[int, int, int]) -> int:
    port, worker, inserts = args
    local = threading.local()

    def one(i: int) -> None:
        if not hasattr(local, "client"):
            local.client = clickhouse_connect.get_client(host="127.0.0.1", port=port)
        local.client.insert("conc", [[worker, i, r] for r in range(ROWS_PER_INSERT)])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(inserts)))
    return inserts


def test_concurrent_inserts_from_processes_and_threads_lose_nothing(client, port: int) -> None:
    client.command("DROP TABLE IF EXISTS conc")
    client.command("CREATE TABLE conc (w UInt32, i UInt32, r UInt32) ENGINE = MergeTree ORDER BY (w, i, r)")
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        done = pool.map(_insert_worker, [(port, w, 50) for w in range(8)])
    assert done == [50] * 8
    count, distinct = client.query("SELECT count(), uniqExact(w, i, r) FROM conc").result_rows[0]
    assert count == distinct == 8 * 50 * ROWS_PER_INSERT


def test_rows_survive_an_endpoint_restart_and_input_data_stays_inside_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_endpoint(data) as first:
        c = clickhouse_connect.get_client(host="127.0.0.1", port=first)
        make_table(c, "durable")
        c.insert("durable", [[i, "x"] for i in range(1234)])
        c.command(
            "INSERT INTO durable (id, s) SELECT id, s FROM input('id UInt64, s String') FORMAT CSV", data=b"9999,y\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "data.stderr"]  # nothing beside it
    assert (data / "input").is_dir()
    with running_endpoint(data) as second:
        c = clickhouse_connect.get_client(host="127.0.0.1", port=second)
        assert c.query("SELECT count(), sum(id) FROM durable").result_rows == [(1235, 1234 * 1233 // 2 + 9999)]


def test_authentication_accepted_and_refused(tmp_path: Path) -> None:
    with running_endpoint(tmp_path / "data", "--user", "ingest", "--password", "s3cret") as p:
        basic = clickhouse_connect.get_client(host="127.0.0.1", port=p, username="ingest", password="s3cret")
        assert basic.command("SELECT 1") == 1
        headers = clickhouse_connect.get_client(
            host="127.0.0.1", port=p, headers={"X-ClickHouse-User": "ingest", "X-ClickHouse-Key": "s3cret"}
        )
        assert headers.command("SELECT 2") == 2
        for user, password in (("ingest", "wrong"), ("default", ""), ("other", "s3cret")):
            with pytest.raises(DatabaseError) as refused:
                clickhouse_connect.get_client(host="127.0.0.1", port=p, username=user, password=password)
            assert refused.value.code == 516
        ok = basic.http.request("POST", f"http://127.0.0.1:{p}/?user=ingest&password=s3cret", body=b"SELECT 3")
        assert (ok.status, ok.data) == (200, b"3\n")
        bad = basic.http.request("POST", f"http://127.0.0.1:{p}/?user=ingest&password=nope", body=b"SELECT 3")
        assert (bad.status, bad.headers["X-ClickHouse-Exception-Code"]) == (403, "516")
        assert basic.http.request("GET", f"http://127.0.0.1:{p}/ping").data == b"Ok.\n"


def test_an_insert_from_input_numbers_rows_and_a_parse_error_quoting_non_utf8_bytes_keeps_its_code(client) -> None:
    make_table(client, "from_input")
    client.command(
        "INSERT INTO from_input (id, s) SELECT id, concat(s, '!') FROM input('id UInt64, s String') FORMAT CSV",
        data=b"1,a\n2,b\n",
    )
    assert client.query("SELECT id, s FROM from_input ORDER BY id").result_rows == [(1, "a!"), (2, "b!")]
    with pytest.raises(DatabaseError, match=r"(?s)Code: 117\..*\(INCORRECT_DATA\)"):
        client.command(
            "INSERT INTO from_input (id, s) SELECT id, s FROM input('id UInt64, s String') FORMAT JSONEachRow",
            data=b'{"id": 3, "s": \xe9\xe9}',
        )
