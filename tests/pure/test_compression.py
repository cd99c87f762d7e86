"""ClickHouse's native compressed blocks (``embedded.ch_compression``): blocks the engine itself
wrote decode, every method round-trips, and broken streams fail with a server's codes."""

from __future__ import annotations

import struct

import pytest

from embedded.ch_compression import BLOCK_SIZE, LZ4, NONE, ZSTD, checksum, compress, compress_block, decompress
from embedded.ch_errors import EngineError

#: Blocks ClickHouse's engine (chDB 26) wrote into a TinyLog table's column files: the String
#: 'hello hello hello' with CODEC(LZ4) and CODEC(ZSTD(1)), and 'hi' with CODEC(NONE).
ENGINE_LZ4 = bytes.fromhex("6426e5ab0e5ff8af99a1f3ed27c4bc5f821d00000012000000f0031168656c6c6f2068656c6c6f2068656c6c6f")
ENGINE_ZSTD = bytes.fromhex(
    "1c8cb78300a6c3242bcf3c44152bd5bb90240000001200000028b52ffd20129100001168656c6c6f2068656c6c6f2068656c6c6f"
)
ENGINE_NONE = bytes.fromhex("1045564c7985c4fa6a7445a37753bc4e020c00000003000000026869")
HELLO = b"\x11hello hello hello"


def code_of(body: bytes, **kwargs: object) -> int:
    with pytest.raises(EngineError) as err:
        decompress(body, **kwargs)
    return err.value.code


def test_blocks_written_by_the_engine_decode() -> None:
    assert decompress(ENGINE_LZ4) == HELLO
    assert decompress(ENGINE_ZSTD) == HELLO
    assert decompress(ENGINE_NONE) == b"\x02hi"
    assert decompress(ENGINE_LZ4 + ENGINE_ZSTD + ENGINE_NONE) == HELLO + HELLO + b"\x02hi"


def test_checksums_match_the_engines() -> None:
    assert compress_block(b"\x02hi", NONE) == ENGINE_NONE
    for block in (ENGINE_LZ4, ENGINE_ZSTD):
        assert checksum(block[16:]) == block[:16]


@pytest.mark.parametrize("method", [LZ4, ZSTD, NONE])
@pytest.mark.parametrize("size", [1, 1000, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE - 7])
def test_every_method_round_trips(method: int, size: int) -> None:
    data = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    body = compress(data, method)
    assert decompress(body) == data
    pos, blocks = 0, []
    while pos < len(body):
        block_method, compressed, raw = struct.unpack_from("<BII", body, pos + 16)
        blocks.append(raw)
        assert block_method == method
        pos += 16 + compressed
    assert pos == len(body)
    assert sum(blocks) == size and max(blocks) <= BLOCK_SIZE
    assert len(blocks) == -(-size // BLOCK_SIZE)


def test_no_data_is_no_blocks() -> None:
    assert compress(b"") == b""
    assert decompress(b"") == b""


def test_lz4_is_the_default_method() -> None:
    assert compress(b"x")[16] == LZ4


def test_a_bad_checksum_answers_checksum_doesnt_match() -> None:
    good = compress_block(b"some data " * 10)
    flipped_checksum = bytes([good[3] ^ 0x10]).join((good[:3], good[4:]))
    with pytest.raises(EngineError) as err:
        decompress(flipped_checksum)
    assert (err.value.code, err.value.name) == (40, "CHECKSUM_DOESNT_MATCH")
    assert err.value.text.startswith("Checksum doesn't match: corrupted data. Reference: ")
    assert (
        f"Size of compressed block: {len(good) - 16}. The mismatch is caused by single bit flip in checksum."
        in err.value.text
    )

    plain = compress_block(b"some data " * 10, NONE)
    flipped_data = plain[:-1] + bytes([plain[-1] ^ 0x04])  # the last space becomes "$"
    with pytest.raises(EngineError) as err:
        decompress(flipped_data)
    assert f"single bit flip in data block at byte {len(plain) - 17}, bit 2." in err.value.text
    assert decompress(flipped_data, verify=False) == b"some data " * 9 + b"some data$"


def test_broken_streams_fail_with_a_servers_codes() -> None:
    good = compress_block(b"x" * 100, LZ4)
    assert code_of(good[:20]) == 33  # CANNOT_READ_ALL_DATA: inside the header
    assert code_of(good + good[:-1]) == 33  # inside the data
    assert code_of(good[:16] + b"\x77" + good[17:]) == 432  # UNKNOWN_CODEC
    assert code_of(good[:16] + b"\x92" + good[17:]) == 48  # Delta: a server's, not decoded here

    def reframed(method: int, size: int, raw: int, payload: bytes) -> bytes:
        block = struct.pack("<BII", method, size, raw) + payload
        return checksum(block) + block

    assert code_of(reframed(LZ4, 5, 1, b"")) == 246  # CORRUPTED_DATA: smaller than its header
    assert code_of(reframed(LZ4, (1 << 30) + 1, 1, b"")) == 39  # TOO_LARGE_SIZE_COMPRESSED
    assert code_of(reframed(LZ4, 9 + 4, 50, b"\xff\xff\xff\xff")) == 271  # CANNOT_DECOMPRESS
    assert code_of(reframed(ZSTD, 9 + 4, 50, b"\xff\xff\xff\xff")) == 271
