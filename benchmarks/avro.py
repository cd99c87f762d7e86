"""A small Avro binary encoder and decoder, for the types of ``benchmarks.clickpipes_data.SCHEMA``. Pure.

No Avro library is installed in the project's environment, and the benchmark's producer needs only
one fixed schema, so this covers what that schema uses, by the Avro 1.11 specification:

- ``long`` and ``int``: zig-zag, then base-128 varint (least significant group first);
- ``double``: 8 bytes little-endian IEEE 754; ``boolean``: one byte, 0 or 1;
- ``string``: its UTF-8 length as a ``long``, then the bytes;
- ``record``: its fields in schema order, nothing between them;
- ``array`` and ``map``: one block of ``count`` items (a ``long``), then a 0 ending the blocks
  (an empty one is the 0 alone); a map's item is its key as a ``string``, then its value.

``decode(schema, encode(schema, datum))`` gives back ``datum`` (floats exactly). Any other type
(unions, enums, fixed, bytes, named-type references) raises ``ValueError``: nothing is encoded
half-way under a schema this module does not understand.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol.framing import varint

_DOUBLE = struct.Struct("<d")


def zigzag_varint(n: int) -> bytes:
    """``n`` (a signed 64-bit integer) as Avro encodes a ``long``."""
    return varint((n << 1) ^ (n >> 63))  # zigzag: small magnitudes of either sign stay short


def encode(schema: Any, datum: Any) -> bytes:
    """``datum`` in Avro binary under ``schema`` (a parsed Avro schema: a name or a dict)."""
    out = bytearray()
    _write(schema, datum, out)
    return bytes(out)


def _write(schema: Any, datum: Any, out: bytearray) -> None:
    kind = schema if isinstance(schema, str) else schema.get("type") if isinstance(schema, dict) else None
    if kind in ("long", "int"):
        out += zigzag_varint(datum)
    elif kind == "string":
        data = datum.encode()
        out += zigzag_varint(len(data))
        out += data
    elif kind == "double":
        out += _DOUBLE.pack(datum)
    elif kind == "boolean":
        out.append(1 if datum else 0)
    elif kind == "record":
        for field in schema["fields"]:
            _write(field["type"], datum[field["name"]], out)
    elif kind == "array":
        if datum:
            out += zigzag_varint(len(datum))
            for item in datum:
                _write(schema["items"], item, out)
        out.append(0)
    elif kind == "map":
        if datum:
            out += zigzag_varint(len(datum))
            for key, value in datum.items():
                _write("string", key, out)
                _write(schema["values"], value, out)
        out.append(0)
    else:
        raise ValueError(f"benchmarks.avro does not encode Avro type {schema!r}")


def decode(schema: Any, data: bytes) -> Any:
    """The datum ``data`` encodes under ``schema``; ValueError if bytes are left over or missing."""
    reader = _Reader(data)
    datum = reader.read(schema)
    if reader.pos != len(data):
        raise ValueError(f"{len(data) - reader.pos} bytes left after the datum")
    return datum


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("the Avro datum ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def long(self) -> int:
        z = shift = 0
        while True:
            byte = self.take(1)[0]
            z |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return (z >> 1) ^ -(z & 1)

    def blocks(self) -> int:
        """Items of the next block (0 at the end); a negative count is followed by the block's size."""
        count = self.long()
        if count < 0:
            self.long()
            count = -count
        return count

    def read(self, schema: Any) -> Any:
        kind = schema if isinstance(schema, str) else schema.get("type") if isinstance(schema, dict) else None
        if kind in ("long", "int"):
            return self.long()
        if kind == "string":
            return self.take(self.long()).decode()
        if kind == "double":
            return _DOUBLE.unpack(self.take(8))[0]
        if kind == "boolean":
            return self.take(1)[0] == 1
        if kind == "record":
            return {field["name"]: self.read(field["type"]) for field in schema["fields"]}
        if kind == "array":
            items: list[Any] = []
            while count := self.blocks():
                items.extend(self.read(schema["items"]) for _ in range(count))
            return items
        if kind == "map":
            found: dict[str, Any] = {}
            while count := self.blocks():
                for _ in range(count):
                    key = self.read("string")
                    found[key] = self.read(schema["values"])
            return found
        raise ValueError(f"benchmarks.avro does not decode Avro type {schema!r}")
