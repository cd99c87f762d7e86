"""The embedded endpoint answers as a ClickHouse server does where a client would otherwise get a
silently different result: protocol versions in Native output, query bytes, multipart bodies,
external data, session-scoped temporary tables, parameters in INSERT VALUES, the summary header.

Driven through clickhouse-connect, and through raw HTTP (``urllib``) where the client cannot say
the exact thing a server must answer.
"""

from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.request
import uuid

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from clickhouse_connect.driver.external import ExternalData


def post(
    port: int, body: bytes, query: str = "", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` to ``/?query``; the status, headers and body, errors included."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/?{query}", data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# -- 1. protocol version, query bytes ---------------------------------------------------------------


def test_native_with_protocol_version_writes_block_info_and_full_type_names(port: int) -> None:
    status, _, body = post(port, b"SELECT 1 AS c FORMAT Native", "client_protocol_version=54405")
    assert status == 200
    # block info: field 1 is_overflows=0, field 2 bucket_num=-1, end 0; then 1 column, 1 row.
    assert body == b"\x01\x00\x02\xff\xff\xff\xff\x00" + b"\x01\x01" + b"\x01c\x05UInt8" + b"\x01"
    _, _, tz_body = post(
        port,
        b"SELECT toDateTime(0, 'America/Chicago') AS d, toLowCardinality('x') AS l FORMAT Native",
        "client_protocol_version=54405",
    )
    assert b"\x1bDateTime('America/Chicago')" in tz_body
    assert b"\x16LowCardinality(String)" in tz_body
    _, _, plain = post(port, b"SELECT 1 AS c FORMAT Native")
    assert plain == b"\x01\x01\x01c\x05UInt8\x01"  # no protocol version: no block info, as a server


def test_native_with_protocol_version_frames_every_block(client, port: int) -> None:
    client.command("DROP TABLE IF EXISTS many_blocks")
    client.command(
        "CREATE TABLE many_blocks (id UInt64, s String, a Array(Nullable(String)), m Map(String, UInt8), "
        "lc LowCardinality(Nullable(String)), t Tuple(x UInt8, y String), d DateTime('Asia/Tokyo')) "
        "ENGINE = MergeTree ORDER BY id"
    )
    client.command(
        "INSERT INTO many_blocks SELECT number, toString(number), [toString(number), NULL], map('k', number % 7), "
        "if(number % 3 = 0, NULL, toString(number % 5)), (number % 9, 'y'), toDateTime(number) FROM numbers(20000)"
    )
    rows = client.query("SELECT * FROM many_blocks ORDER BY id", settings={"max_block_size": 777}).result_rows
    assert len(rows) == 20000
    assert rows[4][6].tzinfo is not None and rows[4][6].tzinfo.key == "Asia/Tokyo"
    assert rows[4][:6] == (4, "4", ["4", None], {"k": 4}, "4", {"x": 4, "y": "y"})
    assert rows[19999][:2] == (19999, "19999")


def test_datetime_with_time_zone_keeps_its_zone_through_clickhouse_connect(client) -> None:
    assert client.protocol_version == 54405
    value = client.query("SELECT toDateTime('2024-07-01 12:00:00', 'America/Chicago') AS d").result_rows[0][0]
    assert value.tzinfo is not None and value.tzinfo.key == "America/Chicago"
    assert value == datetime.datetime(2024, 7, 1, 17, 0, tzinfo=datetime.timezone.utc)


def test_utf8_identifiers_in_insert_with_inline_data(client, port: int) -> None:
    client.command("DROP TABLE IF EXISTS `тест`")
    client.command("CREATE TABLE `тест` (id UInt8, s String) ENGINE = MergeTree ORDER BY id")
    status, _, body = post(port, "INSERT INTO `тест` FORMAT TSV\n1\tпривет\n".encode())  # noqa: RUF001 -- Cyrillic on purpose
    assert status == 200, body
    client.command("INSERT INTO `тест` VALUES (2, 'мир')")
    assert client.query("SELECT id, s FROM `тест` ORDER BY id").result_rows == [(1, "привет"), (2, "мир")]


def test_non_utf8_query_bytes_reach_the_engine_unchanged(client, port: int) -> None:
    status, _, body = post(port, b"SELECT hex('\xff\xfe')")
    assert (status, body) == (200, b"FFFE\n")
    bound = client.query("SELECT hex($x$) AS h", parameters={"$x$": b"\x00\xff\xfe\x80"})
    assert bound.result_rows == [("00FFFE80",)]


# -- 2. multipart bodies and external data ----------------------------------------------------------


def test_large_bound_parameters_travel_as_form_data(client) -> None:
    assert client.command("SELECT length({s:String})", parameters={"s": "x" * 5000}) == 5000
    assert client.query("SELECT {a:UInt32} + {b:UInt32}", parameters={"a": 1, "b": 2}, settings={}).result_rows == [
        (3,)
    ]
    forced = clickhouse_connect.get_client(
        host="127.0.0.1", port=client.url.rsplit(":", 1)[1], form_encode_query_params=True
    )
    assert forced.query("SELECT {s:String} AS s", parameters={"s": "über"}).result_rows == [("über",)]


def test_external_data_tables_through_clickhouse_connect(client) -> None:
    ext = ExternalData(file_name="ids", data=b"1\tone\n2\ttwo\n3\tthree\n", structure=["id UInt32", "name String"])
    ext.add_file(file_name="more", data=b"10,ten\n", fmt="CSV", types=["UInt32", "String"])
    result = client.query(
        "SELECT * FROM (SELECT id, name FROM ids WHERE id > 1 UNION ALL SELECT _1, _2 FROM more) ORDER BY 1",
        external_data=ext,
    )  # ORDER BY inside a UNION ALL sorts its last SELECT only
    assert result.result_rows == [(2, "two"), (3, "three"), (10, "ten")]
    # external tables belong to their request only
    with pytest.raises(DatabaseError) as gone:
        client.query("SELECT * FROM ids")
    assert gone.value.code == 60


def test_external_data_through_raw_multipart(port: int) -> None:
    boundary = "b" + uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="query"\r\n\r\n'
        "SELECT sum(x) FROM nums WHERE x > {lo:UInt8}\r\n"
        f'--{boundary}\r\nContent-Disposition: form-data; name="param_lo"\r\n\r\n1\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="nums"; filename="nums.tsv"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n1\n2\n3\n\r\n"
        f"--{boundary}--\r\n"
    ).encode()
    status, _, answer = post(
        port, body, "nums_structure=x+UInt8", {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    assert (status, answer) == (200, b"5\n")


# -- 4. session scope ---------------------------------------------------------------------------


def test_temporary_tables_belong_to_their_session(port: int) -> None:
    sessions = {sid: f"sess_{sid}_{uuid.uuid4().hex[:8]}" for sid in ("A", "B")}
    for sid in ("A", "B"):
        status, _, body = post(port, b"CREATE TEMPORARY TABLE tmp_scoped (x UInt8)", f"session_id={sessions[sid]}")
        assert status == 200, body
        assert (
            post(port, f"INSERT INTO tmp_scoped VALUES ({ord(sid)})".encode(), f"session_id={sessions[sid]}")[0] == 200
        )
    assert post(port, b"SELECT x FROM tmp_scoped", f"session_id={sessions['A']}")[2] == b"65\n"
    assert post(port, b"SELECT x FROM tmp_scoped", f"session_id={sessions['B']}")[2] == b"66\n"
    status, headers, _ = post(port, b"SELECT x FROM tmp_scoped")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60")
    # without a session, a temporary table lasts for its own request only
    assert post(port, b"CREATE TEMPORARY TABLE tmp_once (x UInt8)")[0] == 200
    assert post(port, b"CREATE TEMPORARY TABLE tmp_once (x UInt8)")[0] == 200
    # closing the session drops its tables
    post(port, b"SELECT 1", f"session_id={sessions['A']}&close_session=1")
    status, headers, _ = post(port, b"SELECT x FROM tmp_scoped", f"session_id={sessions['A']}")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60")


def test_requests_without_a_session_carry_nothing_over_to_the_next(port: int) -> None:
    # Such requests share idle engine connections one after another: none may see an earlier
    # one's database, settings, temporary table or failure.
    assert post(port, b"SELECT currentDatabase()", "database=system")[2] == b"system\n"
    assert post(port, b"SELECT getSetting('max_threads') = 3", "max_threads=3")[2] == b"1\n"
    assert post(port, b"SELECT no_such_function_xyz()")[0] != 200
    assert post(port, b"CREATE TEMPORARY TABLE tmp_leak (x UInt8)")[0] == 200
    for _ in range(3):
        assert post(port, b"SELECT currentDatabase(), getSetting('max_threads') = 3")[2] == b"default\t0\n"
        status, headers, _ = post(port, b"SELECT x FROM tmp_leak")
        assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60")


# -- 5. parameters in INSERT VALUES, summary --------------------------------------------------------


def test_query_parameters_inside_insert_values(client) -> None:
    client.command("DROP TABLE IF EXISTS ins_params")
    client.command("CREATE TABLE ins_params (id UInt32, s String) ENGINE = MergeTree ORDER BY id")
    client.command("INSERT INTO ins_params VALUES ({id:UInt32}, {s:String})", parameters={"id": 7, "s": "seven"})
    assert client.query("SELECT id, s FROM ins_params").result_rows == [(7, "seven")]


def test_summary_counts_result_rows_and_written_rows(client, port: int) -> None:
    _, headers, _ = post(port, b"SELECT number FROM numbers(100) WHERE number % 10 = 0")
    summary = json.loads(headers["X-ClickHouse-Summary"])
    assert (summary["result_rows"], summary["read_rows"]) == ("10", "100")
    client.command("DROP TABLE IF EXISTS summary_rows")
    client.command("CREATE TABLE summary_rows (id UInt32) ENGINE = MergeTree ORDER BY id")
    _, headers, _ = post(port, b"INSERT INTO summary_rows FORMAT TSV\n1\n2\n3\n")
    summary = json.loads(headers["X-ClickHouse-Summary"])
    assert (summary["written_rows"], summary["result_rows"]) == ("3", "3")
    insert_select = client.command("INSERT INTO summary_rows SELECT number FROM numbers(5)")
    assert insert_select.written_rows == 5


# -- 6. system logs ----------------------------------------------------------------------------------


def test_query_log_and_part_log_record_each_statement_and_merge_with_its_cpu(client) -> None:
    client.command("DROP TABLE IF EXISTS logged")
    client.command("CREATE TABLE logged (id UInt64) ENGINE = MergeTree ORDER BY id")
    marker = uuid.uuid4().hex
    for _ in range(2):
        client.command(f"INSERT INTO logged SELECT number FROM numbers(200000) SETTINGS log_comment = '{marker}'")
    client.command("OPTIMIZE TABLE logged FINAL")
    client.command("SYSTEM FLUSH LOGS")
    inserts = client.query(
        "SELECT written_rows, ProfileEvents['UserTimeMicroseconds'] FROM system.query_log "
        "WHERE log_comment = %(m)s AND type = 'QueryFinish'",
        parameters={"m": marker},
    ).result_rows
    assert [rows for rows, _ in inserts] == [200000, 200000]
    assert all(cpu_us > 0 for _, cpu_us in inserts)
    parts = client.query(
        "SELECT event_type, rows FROM system.part_log WHERE database = currentDatabase() AND table = 'logged' "
        "ORDER BY event_time_microseconds"
    ).result_rows
    assert parts == [("NewPart", 200000), ("NewPart", 200000), ("MergePartsStart", 0), ("MergeParts", 400000)]
