"""ClickHouse's native block compression over HTTP, as a server speaks it: ``compress=1`` sends the
response body (results and errors alike) as a sequence of compressed blocks, LZ4 as a server's
``CompressedWriteBuffer`` writes them; ``decompress=1`` reads the request body as such blocks and
verifies their checksums (CHECKSUM_DOESNT_MATCH, 40, on a bad one).

Raw HTTP only, framing and unframing done here, independently of the endpoint's code: a block is
a 16-byte CityHash128 (v1.0.2) of the rest, then the method byte (0x82 LZ4, 0x90 ZSTD, 0x02 NONE),
the compressed size including this 9-byte header, the uncompressed size, and the data.
"""

from __future__ import annotations

import http.client
import struct
from urllib.parse import urlencode

import lz4.block
import pytest
import zstandard
from clickhouse_cityhash.cityhash import CityHash128

from tests.embedded.endpoint import running_endpoint

LZ4, ZSTD, NONE = 0x82, 0x90, 0x02
MASK64 = (1 << 64) - 1


def checksum(block: bytes) -> bytes:
    """ClickHouse writes the hash's two 64-bit halves low first, each little-endian."""
    value = CityHash128(block)
    return struct.pack("<QQ", value >> 64, value & MASK64)


def frame(data: bytes, method: int = LZ4) -> bytes:
    if method == LZ4:
        payload = lz4.block.compress(data, store_size=False)
    elif method == ZSTD:
        payload = zstandard.ZstdCompressor(level=1).compress(data)
    else:
        payload = data
    block = struct.pack("<BII", method, 9 + len(payload), len(data)) + payload
    return checksum(block) + block


def unframe(body: bytes) -> list[tuple[int, bytes]]:
    """The (method, data) of every block; asserts each block's checksum and sizes."""
    blocks = []
    pos = 0
    while pos < len(body):
        method, size, raw_size = struct.unpack_from("<BII", body, pos + 16)
        block = body[pos + 16 : pos + 16 + size]
        assert len(block) == size, "the body ends inside a block"
        assert body[pos : pos + 16] == checksum(block), "bad checksum"
        payload = block[9:]
        if method == LZ4:
            data = lz4.block.decompress(payload, uncompressed_size=raw_size)
        elif method == ZSTD:
            data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_size)
        else:
            assert method == NONE, hex(method)
            data = payload
        assert len(data) == raw_size
        blocks.append((method, data))
        pos += 16 + size
    return blocks


def request(
    port: int, body: bytes, params: dict[str, str] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/?" + urlencode(params or {}), body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp, data


def query(port: int, sql: str) -> bytes:
    status, _, body = request(port, sql.encode())
    assert status == 200, body
    return body


# -- compress=1 -----------------------------------------------------------------------------------


def test_compress_sends_the_result_as_lz4_blocks(port: int) -> None:
    status, resp, body = request(port, b"SELECT number FROM numbers(10) FORMAT TSV", {"compress": "1"})
    assert status == 200
    assert resp.getheader("Content-Type") == "text/tab-separated-values; charset=UTF-8"  # not reflected in headers
    assert resp.getheader("Content-Encoding") is None
    blocks = unframe(body)
    assert [method for method, _ in blocks] == [LZ4]
    assert blocks[0][1] == b"".join(b"%d\n" % i for i in range(10))


def test_compress_zero_sends_plain_text(port: int) -> None:
    status, _, body = request(port, b"SELECT 1", {"compress": "0"})
    assert (status, body) == (200, b"1\n")


def test_compressed_blocks_hold_at_most_one_mebibyte_also_when_streamed(port: int) -> None:
    sql = b"SELECT number, toString(number) FROM numbers(300000) FORMAT TSV"
    status, resp, body = request(port, sql, {"compress": "1"})
    assert status == 200
    assert resp.getheader("Transfer-Encoding") == "chunked"
    blocks = unframe(body)
    assert len(blocks) > 1
    assert all(method == LZ4 and len(data) <= 1 << 20 for method, data in blocks)
    assert b"".join(data for _, data in blocks) == query(port, sql.decode())


def test_network_compression_method_does_not_change_the_http_blocks(port: int) -> None:
    # A server's HTTP handler compresses with the default codec, whatever this setting says.
    status, _, body = request(port, b"SELECT 'x'", {"compress": "1", "network_compression_method": "zstd"})
    assert status == 200
    assert unframe(body) == [(LZ4, b"x\n")]


def test_compressed_blocks_inside_http_content_encoding(port: int) -> None:
    status, resp, body = request(
        port,
        b"SELECT number FROM numbers(3)",
        {"compress": "1", "enable_http_compression": "1"},
        {"Accept-Encoding": "zstd"},
    )
    assert (status, resp.getheader("Content-Encoding")) == (200, "zstd")
    assert unframe(zstandard.ZstdDecompressor().decompressobj().decompress(body)) == [(LZ4, b"0\n1\n2\n")]


def test_an_error_is_sent_in_compressed_blocks_with_its_status(port: int) -> None:
    status, resp, body = request(port, b"SELECT throwIf(1, 'boom compressed')", {"compress": "1"})
    assert (status, resp.getheader("X-ClickHouse-Exception-Code")) == (500, "395")
    [(method, text)] = unframe(body)
    assert method == LZ4
    assert text.startswith(b"Code: 395. DB::Exception: ") and b"boom compressed" in text


def test_an_error_part_way_through_a_stream_arrives_in_a_compressed_block(port: int) -> None:
    sql = b"SELECT number, throwIf(number = 300000, 'boom late') FROM numbers(400000) SETTINGS max_block_size = 10000"
    status, resp, body = request(port, sql, {"compress": "1"})
    assert status == 200
    tag = resp.getheader("X-ClickHouse-Exception-Tag")
    data = b"".join(data for _, data in unframe(body))
    assert data.startswith(b"0\t0\n1\t0\n")
    block = data[data.index(b"__exception__") :]
    assert block.startswith(f"__exception__\r\n{tag}\r\nCode: 395. DB::Exception: ".encode())
    assert block.endswith(f" {tag}\r\n__exception__\r\n".encode())


def test_an_authentication_failure_is_plain_text(tmp_path) -> None:
    with running_endpoint(tmp_path / "data", "--password", "secret") as p:
        status, resp, body = request(p, b"SELECT 1", {"compress": "1", "user": "default", "password": "wrong"})
    assert (status, resp.getheader("X-ClickHouse-Exception-Code")) == (403, "516")
    assert body.startswith(b"Code: 516. DB::Exception: ")  # refused before the reply is set up


# -- decompress=1 ---------------------------------------------------------------------------------


@pytest.fixture
def table(port: int) -> str:
    query(port, "DROP TABLE IF EXISTS framed")
    query(port, "CREATE TABLE framed (id UInt32, s String) ENGINE = MergeTree ORDER BY id")
    return "framed"


def test_decompress_reads_an_insert_body_of_blocks(port: int, table: str) -> None:
    body = frame(b"1\tone\n2\ttwo\n") + frame(b"3\tthree\n", ZSTD) + frame(b"4\tfour\n", NONE)
    status, _, reply = request(port, body, {"query": f"INSERT INTO {table} FORMAT TSV", "decompress": "1"})
    assert (status, reply) == (200, b"")
    assert query(port, f"SELECT * FROM {table} ORDER BY id") == b"1\tone\n2\ttwo\n3\tthree\n4\tfour\n"


def test_decompress_reads_the_query_itself_from_the_body(port: int, table: str) -> None:
    status, _, _ = request(port, frame(f"INSERT INTO {table} FORMAT TSV\n5\tfive\n".encode()), {"decompress": "1"})
    assert status == 200
    status, _, body = request(port, frame(b"SELECT s FROM framed"), {"decompress": "1", "compress": "1"})
    assert (status, unframe(body)) == (200, [(LZ4, b"five\n")])


def test_a_corrupted_checksum_answers_checksum_doesnt_match(port: int, table: str) -> None:
    good = frame(b"6\tsix\n")
    bad = bytes([good[0] ^ 0x01]) + good[1:]
    status, resp, body = request(port, bad, {"query": f"INSERT INTO {table} FORMAT TSV", "decompress": "1"})
    assert (status, resp.getheader("X-ClickHouse-Exception-Code")) == (500, "40")
    assert body.startswith(b"Code: 40. DB::Exception: Checksum doesn't match: corrupted data. Reference: ")
    assert (
        b"Size of compressed block: %d. The mismatch is caused by single bit flip in checksum." % (len(good) - 16)
        in body
    )
    assert b"(CHECKSUM_DOESNT_MATCH)" in body
    assert query(port, f"SELECT count() FROM {table}") == b"0\n"


def test_a_corrupted_block_is_refused_and_checksumming_can_be_turned_off(port: int, table: str) -> None:
    good = frame(b"7\tseven\n", NONE)
    bad = good[:-3] + b"X" + good[-2:]  # "seven" -> "sevXn"
    insert = {"query": f"INSERT INTO {table} FORMAT TSV", "decompress": "1"}
    status, resp, _ = request(port, bad, insert)
    assert (status, resp.getheader("X-ClickHouse-Exception-Code")) == (500, "40")
    status, _, _ = request(port, bad, {**insert, "http_native_compression_disable_checksumming_on_decompress": "1"})
    assert status == 200
    assert query(port, f"SELECT s FROM {table}") == b"sevXn\n"


def test_malformed_block_streams_answer_as_a_server(port: int, table: str) -> None:
    insert = {"query": f"INSERT INTO {table} FORMAT TSV", "decompress": "1"}
    good = frame(b"8\teight\n")
    cases = {
        good[:-3]: "33",  # CANNOT_READ_ALL_DATA: the body ends inside a block
        good[:16] + b"\x77" + good[17:]: "432",  # UNKNOWN_CODEC
    }
    for body, code in cases.items():
        status, resp, text = request(port, body, insert)
        assert resp.getheader("X-ClickHouse-Exception-Code") == code, text
        assert status == 500
    # An error with compress=1 travels in blocks, as every error after the reply is set up.
    status, resp, body = request(port, good[:-3], {**insert, "compress": "1"})
    assert resp.getheader("X-ClickHouse-Exception-Code") == "33"
    assert unframe(body)[0][1].startswith(b"Code: 33. DB::Exception: Cannot read all data.")
    assert query(port, f"SELECT count() FROM {table}") == b"0\n"
