"""HTTP bodies as ClickHouse reads and writes them: chunked transfer, Content-Encoding both ways.

Request bodies may be sent with ``Transfer-Encoding: chunked`` (clickhouse-connect streams inserts
that way) and encoded with ``lz4``, ``zstd``, ``gzip``, ``deflate`` or ``br`` (``br`` needs the
``brotli`` package). clickhouse-connect compresses each insert block as its own lz4 or zstd frame,
so a body may be several frames back to back; all of them are decoded. Responses are compressed
only when the client allows it (``enable_http_compression`` and ``Accept-Encoding``), choosing in
ClickHouse's order of preference: zstd, br, lz4, gzip, deflate.
"""

from __future__ import annotations

import gzip
import importlib
import zlib
from collections.abc import Callable
from io import BufferedIOBase
from typing import Any, Protocol

import lz4.frame
import zstandard

from embedded.ch_errors import CANNOT_DECOMPRESS, UNEXPECTED_END_OF_FILE, UNKNOWN_COMPRESSION_METHOD, EngineError

_brotli: Any  # the optional brotli module (it has no type hints), or None
try:
    _brotli = importlib.import_module("brotli")
except ImportError:
    _brotli = None

_RESPONSE_PREFERENCE = ("zstd", "br", "lz4", "gzip", "deflate")


def read_body(rfile: BufferedIOBase, transfer_encoding: str | None, content_length: str | None) -> bytes:
    """The whole request body, de-chunked; raises UNEXPECTED_END_OF_FILE when the peer stops early."""
    if transfer_encoding and "chunked" in transfer_encoding.lower():
        parts: list[bytes] = []
        while True:
            line = rfile.readline(65537)
            if not line:
                raise EngineError(UNEXPECTED_END_OF_FILE, "Request body ended inside a chunk header")
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(_read_exact(rfile, size))
            rfile.readline(3)
    if content_length:
        return _read_exact(rfile, int(content_length))
    return b""


def _read_exact(rfile: BufferedIOBase, size: int) -> bytes:
    data = rfile.read(size)
    if len(data) != size:
        raise EngineError(UNEXPECTED_END_OF_FILE, f"Request body ended after {len(data)} of {size} bytes")
    return data


def decode_body(body: bytes, content_encoding: str | None) -> bytes:
    """Undo ``Content-Encoding``; unknown methods raise UNKNOWN_COMPRESSION_METHOD."""
    method = (content_encoding or "").strip().lower()
    if not body or method in ("", "identity", "none"):
        return body
    try:
        if method == "lz4":
            return _frames(body, lambda: lz4.frame.LZ4FrameDecompressor())
        if method == "zstd":
            return _frames(body, lambda: zstandard.ZstdDecompressor().decompressobj())
        if method in ("gzip", "x-gzip"):
            return gzip.decompress(body)
        if method == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, -zlib.MAX_WBITS)
        if method == "br" and _brotli is not None:
            return _brotli.decompress(body)
    except EngineError:
        raise
    except Exception as ex:
        raise EngineError(CANNOT_DECOMPRESS, f"Cannot decode the {method} request body: {ex}") from ex
    hint = " (install the brotli package to accept br)" if method == "br" else ""
    raise EngineError(
        UNKNOWN_COMPRESSION_METHOD,
        f"Unknown Content-Encoding '{content_encoding}' of the request body: use lz4, zstd, gzip, deflate or br{hint}",
    )


class _FrameDecoder(Protocol):
    """What ``_frames`` needs of a decoder: lz4's and zstd's share no base type."""

    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...
    def decompress(self, data: bytes) -> bytes: ...


def _frames(body: bytes, new_decoder: Callable[[], _FrameDecoder]) -> bytes:
    """Decode every frame of a body made of back-to-back frames."""
    out: list[bytes] = []
    rest = body
    while rest:
        decoder = new_decoder()
        out.append(decoder.decompress(rest))
        if not decoder.eof:
            raise EngineError(CANNOT_DECOMPRESS, "The compressed request body ends inside a frame")
        rest = decoder.unused_data
    return b"".join(out)


def choose_response_encoding(accept_encoding: str | None) -> str | None:
    """The Content-Encoding to answer with for this ``Accept-Encoding``, or None."""
    offered = (accept_encoding or "").lower()
    for method in _RESPONSE_PREFERENCE:
        if method in offered and (method != "br" or _brotli is not None):
            return method
    return None


def encode_body(body: bytes, method: str) -> bytes:
    """Compress a response body with ``method`` (one that ``choose_response_encoding`` returned)."""
    if method == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(body)
    if method == "lz4":
        return lz4.frame.compress(body)
    if method == "gzip":
        return gzip.compress(body, compresslevel=3)
    if method == "deflate":
        return zlib.compress(body, 3)
    if method == "br" and _brotli is not None:
        return _brotli.compress(body, quality=3)
    raise ValueError(f"unsupported response encoding {method!r}")


class _StreamCompressor(Protocol):
    def compress(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


class StreamEncoder:
    """Compresses a response body written in pieces with ``method`` (one that
    ``choose_response_encoding`` returned): ``compress`` each piece, then ``flush`` once."""

    def __init__(self, method: str):
        self._obj: _StreamCompressor
        if method == "zstd":
            self._obj = zstandard.ZstdCompressor(level=3).compressobj()
        elif method == "lz4":
            self._obj = _Lz4Stream()
        elif method in ("gzip", "deflate"):
            self._obj = zlib.compressobj(3, zlib.DEFLATED, 31 if method == "gzip" else zlib.MAX_WBITS)
        elif method == "br" and _brotli is not None:
            self._obj = _BrotliStream()
        else:
            raise ValueError(f"unsupported response encoding {method!r}")

    def compress(self, data: bytes) -> bytes:
        return self._obj.compress(data)

    def flush(self) -> bytes:
        return self._obj.flush()


class _Lz4Stream:
    def __init__(self) -> None:
        self._frame = lz4.frame.LZ4FrameCompressor()
        self._begun = False

    def compress(self, data: bytes) -> bytes:
        head = b"" if self._begun else self._frame.begin()
        self._begun = True
        return head + self._frame.compress(data)

    def flush(self) -> bytes:
        return self.compress(b"") + self._frame.flush()


class _BrotliStream:
    def __init__(self) -> None:
        self._obj = _brotli.Compressor(quality=3)

    def compress(self, data: bytes) -> bytes:
        return self._obj.process(data)

    def flush(self) -> bytes:
        return self._obj.finish()
