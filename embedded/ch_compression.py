"""ClickHouse's native compressed blocks, as the HTTP interface speaks them with ``compress=1``
(the response body) and ``decompress=1`` (the request body).

A block is, as ``CompressedWriteBuffer`` writes it (``src/Compression/CompressionInfo.h``):

- 16 bytes: CityHash128 (CityHash v1.0.2) of the rest of the block, its low 64 bits first, each
  half little-endian;
- 1 byte: the method, 0x82 LZ4, 0x90 ZSTD or 0x02 NONE;
- 4 bytes: the compressed size, these 9 header bytes included; 4 bytes: the uncompressed size;
- the compressed data (a raw LZ4 block, a ZSTD frame, or the data itself).

A server writes LZ4 blocks of at most ``BLOCK_SIZE`` uncompressed bytes (its default codec and
buffer size). Reading accepts those three methods and verifies every checksum, failing with
ClickHouse's codes and messages (CHECKSUM_DOESNT_MATCH, CANNOT_READ_ALL_DATA, UNKNOWN_CODEC, ...).
"""

from __future__ import annotations

import struct

import lz4.block
import zstandard
from clickhouse_cityhash.cityhash import CityHash128

from embedded.ch_errors import (
    CANNOT_DECOMPRESS,
    CANNOT_READ_ALL_DATA,
    CHECKSUM_DOESNT_MATCH,
    CORRUPTED_DATA,
    NOT_IMPLEMENTED,
    TOO_LARGE_SIZE_COMPRESSED,
    UNKNOWN_CODEC,
    EngineError,
)

NONE = 0x02
LZ4 = 0x82
ZSTD = 0x90
#: ClickHouse's other codecs' method bytes: valid on a server, not decoded here.
_OTHER_CODECS = {
    0x91: "Multiple",
    0x92: "Delta",
    0x93: "T64",
    0x94: "DoubleDelta",
    0x95: "Gorilla",
    0x96: "AES_128_GCM_SIV",
    0x97: "AES_256_GCM_SIV",
    0x98: "FPC",
    0x9A: "GCD",
    0x9B: "ZSTD_QPL",
    0x9C: "SZ3",
}
CHECKSUM_SIZE = 16
HEADER_SIZE = 9
#: DBMS_DEFAULT_BUFFER_SIZE: a server's CompressedWriteBuffer compresses at most this much at once.
BLOCK_SIZE = 1 << 20
#: DBMS_MAX_COMPRESSED_SIZE.
MAX_BLOCK_SIZE = 1 << 30
_HEADER = struct.Struct("<BII")
_MASK64 = (1 << 64) - 1
#: A mismatching block up to this size is searched for a single flipped bit, as a server does for
#: blocks under 1 MiB (in Python each try costs a hash, so the search stops far sooner).
_BIT_FLIP_SEARCH_BYTES = 4096
_HARDWARE_FAILURE = (
    "This is most likely due to hardware failure. If you receive broken data over network and the error does not "
    "repeat every time, this can be caused by bad RAM on network interface controller or bad controller itself or bad "
    "RAM on network switches or bad CPU on network switches (look at the logs on related network switches; note that "
    "TCP checksums don't help) or bad RAM on host (look at dmesg or kern.log for enormous amount of EDAC errors, "
    "ECC-related reports, Machine Check Exceptions, mcelog; note that ECC memory can fail if the number of errors is "
    "huge) or bad CPU on host. If you read data from disk, this can be caused by disk bit rot. This exception protects "
    "ClickHouse from data corruption due to hardware failures."
)


def checksum(block: bytes | bytearray | memoryview) -> bytes:
    """The 16 checksum bytes ClickHouse writes before ``block`` (method byte onwards)."""
    value = CityHash128(bytes(block))
    return struct.pack("<QQ", value >> 64, value & _MASK64)


def compress_block(data: bytes | memoryview, method: int = LZ4) -> bytes:
    """One compressed block holding all of ``data``."""
    if method == LZ4:
        payload = lz4.block.compress(data, mode="default", store_size=False)
    elif method == ZSTD:
        payload = zstandard.ZstdCompressor(level=1).compress(data)
    elif method == NONE:
        payload = bytes(data)
    else:
        raise ValueError(f"cannot compress with method byte {method:#x}")
    block = _HEADER.pack(method, HEADER_SIZE + len(payload), len(data)) + payload
    return checksum(block) + block


def compress(data: bytes | memoryview, method: int = LZ4, block_size: int = BLOCK_SIZE) -> bytes:
    """``data`` as blocks of at most ``block_size`` uncompressed bytes; nothing for no data."""
    view = memoryview(data)
    return b"".join(compress_block(view[i : i + block_size], method) for i in range(0, len(view), block_size))


def decompress(body: bytes | memoryview, verify: bool = True) -> bytes:
    """The data of a body made of blocks back to back; with ``verify``, every checksum is checked
    (``http_native_compression_disable_checksumming_on_decompress`` turns that off on a server)."""
    view = memoryview(body)
    out: list[bytes] = []
    pos = 0
    while pos < len(view):
        head_end = pos + CHECKSUM_SIZE + HEADER_SIZE
        if head_end > len(view):
            raise _short(len(view) - pos, CHECKSUM_SIZE + HEADER_SIZE)
        method, size, raw_size = _HEADER.unpack_from(view, pos + CHECKSUM_SIZE)
        _check_method(method)
        if size > MAX_BLOCK_SIZE:
            raise EngineError(
                TOO_LARGE_SIZE_COMPRESSED,
                f"Too large size_compressed_without_checksum: {size}. Most likely corrupted data.",
            )
        if raw_size > MAX_BLOCK_SIZE:
            raise EngineError(
                TOO_LARGE_SIZE_COMPRESSED, f"Too large size_decompressed: {raw_size}. Most likely corrupted data."
            )
        if size < HEADER_SIZE:
            raise EngineError(
                CORRUPTED_DATA,
                f"Can't decompress data: the compressed data size ({size}, this should include header size) is less "
                f"than the header size ({HEADER_SIZE})",
            )
        end = pos + CHECKSUM_SIZE + size
        if end > len(view):
            raise _short(len(view) - pos - CHECKSUM_SIZE - HEADER_SIZE, size - HEADER_SIZE)
        block = view[pos + CHECKSUM_SIZE : end]
        if verify:
            _verify(bytes(view[pos : pos + CHECKSUM_SIZE]), block)
        out.append(_decode(method, block[HEADER_SIZE:], raw_size))
        pos = end
    return b"".join(out)


def _check_method(method: int) -> None:
    if method in (LZ4, ZSTD, NONE):
        return
    if method in _OTHER_CODECS:
        raise EngineError(
            NOT_IMPLEMENTED,
            f"The embedded endpoint reads compressed blocks of LZ4, ZSTD or NONE, not {_OTHER_CODECS[method]} "
            f"(method byte {method:#x})",
        )
    raise EngineError(UNKNOWN_CODEC, f"Unknown codec family code: {method}")


def _short(read: int, expected: int) -> EngineError:
    return EngineError(CANNOT_READ_ALL_DATA, f"Cannot read all data. Bytes read: {read}. Bytes expected: {expected}.")


def _decode(method: int, payload: memoryview, raw_size: int) -> bytes:
    if method == NONE:
        return bytes(payload)
    try:
        if method == LZ4:
            data = lz4.block.decompress(payload, uncompressed_size=raw_size)
        else:
            data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_size)
    except (lz4.block.LZ4BlockError, zstandard.ZstdError) as ex:
        name = "LZ4" if method == LZ4 else "ZSTD"
        raise EngineError(CANNOT_DECOMPRESS, f"Cannot decompress {name}-encoded data: {ex}") from None
    if len(data) != raw_size:
        raise EngineError(
            CANNOT_DECOMPRESS, f"Cannot decompress: {len(data)} bytes decoded, the header says {raw_size}"
        )
    return data


def _verify(expected: bytes, block: memoryview) -> None:
    """Raise CHECKSUM_DOESNT_MATCH as a server words it (``validateChecksum``) unless ``expected``
    is the checksum of ``block``."""
    actual = checksum(block)
    if actual == expected:
        return
    exp_first, exp_second = struct.unpack("<QQ", expected)
    act_first, act_second = struct.unpack("<QQ", actual)
    message = (
        f"Checksum doesn't match: corrupted data. Reference: {exp_first:016x}{exp_second:016x}. "
        f"Actual: {act_first:016x}{act_second:016x}. Size of compressed block: {len(block)}"
    )
    if len(block) <= _BIT_FLIP_SEARCH_BYTES:
        data = bytearray(block)
        for bit in range(len(data) * 8):
            data[bit // 8] ^= 1 << (bit % 8)
            if checksum(data) == expected:
                raise EngineError(
                    CHECKSUM_DOESNT_MATCH,
                    f"{message}. The mismatch is caused by single bit flip in data block at byte {bit // 8}, "
                    f"bit {bit % 8}. {_HARDWARE_FAILURE}",
                )
            data[bit // 8] ^= 1 << (bit % 8)
    if bin(exp_first ^ act_first).count("1") + bin(exp_second ^ act_second).count("1") == 1:
        message += f". The mismatch is caused by single bit flip in checksum. {_HARDWARE_FAILURE}"
    raise EngineError(CHECKSUM_DOESNT_MATCH, message)
