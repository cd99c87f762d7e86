"""ClickHouse's Native format as a server writes it for an HTTP client that sent
``client_protocol_version``.

chDB always writes Native as for protocol 0: no block info and, for a top-level ``DateTime('tz')``
column, the bare type name ``DateTime`` (so a client loses the zone). A server answering a client
of protocol ``N > 0`` (``NativeWriter``) instead writes, before each block, the block info fields
(``is_overflows = 0``, ``bucket_num = -1``), every type name in full, and from protocol 54454 on one
"has custom serialization" byte after each type name.

``reframe`` rewrites chDB's output into that form. It asks for chDB's output with
``output_format_native_encode_types_in_binary_format = 1`` (``BINARY_TYPES_SETTING``) so that the
full type is known, renders each type's name as ClickHouse's ``IDataType::getName`` does, and walks
the column data to find where each block ends. Column types whose data it cannot walk (Dynamic,
JSON, Object, AggregateFunction, SimpleAggregateFunction, QBit, compact Variant) raise
NOT_IMPLEMENTED, as does LowCardinality for a client older than protocol 54405.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from embedded.ch_errors import NOT_IMPLEMENTED, EngineError
from protocol.framing import varint

#: The setting that makes chDB write full types (binary-encoded) into Native output.
BINARY_TYPES_SETTING = "output_format_native_encode_types_in_binary_format"
_WITH_TIME_ZONE_IN_DATETIME = 54337
_WITH_LOW_CARDINALITY = 54405
_WITH_CUSTOM_SERIALIZATION = 54454
_BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"  # field 1: is_overflows=0; field 2: bucket_num=-1; end
_HAS_ADDITIONAL_KEYS = 1 << 9
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FIXED = {
    0x00: ("Nothing", 1),
    0x01: ("UInt8", 1),
    0x02: ("UInt16", 2),
    0x03: ("UInt32", 4),
    0x04: ("UInt64", 8),
    0x05: ("UInt128", 16),
    0x06: ("UInt256", 32),
    0x07: ("Int8", 1),
    0x08: ("Int16", 2),
    0x09: ("Int32", 4),
    0x0A: ("Int64", 8),
    0x0B: ("Int128", 16),
    0x0C: ("Int256", 32),
    0x0D: ("Float32", 4),
    0x0E: ("Float64", 8),
    0x0F: ("Date", 2),
    0x10: ("Date32", 4),
    0x11: ("DateTime", 4),
    0x1D: ("UUID", 16),
    0x28: ("IPv4", 4),
    0x29: ("IPv6", 16),
    0x2D: ("Bool", 1),
    0x31: ("BFloat16", 2),
    0x32: ("Time", 4),
}
_INTERVALS = {
    0x00: "Nanosecond",
    0x01: "Microsecond",
    0x02: "Millisecond",
    0x03: "Second",
    0x04: "Minute",
    0x05: "Hour",
    0x06: "Day",
    0x07: "Week",
    0x08: "Month",
    0x09: "Quarter",
    0x0A: "Year",
    0x1A: "Year",
}
_UNSUPPORTED = {
    0x21: "Set",
    0x24: "Function",
    0x25: "AggregateFunction",
    0x2B: "Dynamic",
    0x2E: "SimpleAggregateFunction",
    0x30: "JSON",
    0x36: "QBit",
}


@dataclass(frozen=True)
class ColumnType:
    """A column type: its ClickHouse name and how its data is laid out in Native.

    ``kind`` is ``fixed`` (``width`` bytes a row), ``string``, ``nullable``, ``array``, ``tuple``,
    ``low_cardinality`` or ``variant``; ``children`` are the nested types (a Map is an array of a
    (key, value) tuple, as it is serialised)."""

    name: str
    kind: str
    width: int = 0
    children: tuple[ColumnType, ...] = ()


def reframe(native: bytes, revision: int, keep_binary_types: bool = False) -> bytes:
    """chDB's Native output (written with ``BINARY_TYPES_SETTING``) as a server writes it for a
    client of protocol ``revision`` (> 0). With ``keep_binary_types`` (the client itself asked for
    binary types) the type encodings are copied, not named."""
    reader = _Reader(native)
    out = bytearray()
    while not reader.at_end():
        out += _BLOCK_INFO
        start = reader.pos
        columns, rows = reader.varuint(), reader.varuint()
        out += native[start : reader.pos]
        for _ in range(columns):
            start = reader.pos
            reader.skip(reader.varuint())  # the column name
            out += native[start : reader.pos]
            type_start = reader.pos
            col_type = _decode_type(reader)
            if (
                col_type.kind == "low_cardinality" or "LowCardinality(" in col_type.name
            ) and revision < _WITH_LOW_CARDINALITY:
                raise _cannot(f"LowCardinality for client_protocol_version {revision} (< {_WITH_LOW_CARDINALITY})")
            if keep_binary_types:
                out += native[type_start : reader.pos]
            else:
                name = col_type.name
                if revision < _WITH_TIME_ZONE_IN_DATETIME and name.startswith("DateTime("):
                    name = "DateTime"
                encoded = name.encode()
                out += varint(len(encoded)) + encoded
            if revision >= _WITH_CUSTOM_SERIALIZATION:
                out.append(0)
            start = reader.pos
            if rows:
                _skip_prefix(reader, col_type)
                _skip_data(reader, col_type, rows)
            out += native[start : reader.pos]
    return bytes(out)


def _cannot(what: str) -> EngineError:
    return EngineError(
        NOT_IMPLEMENTED,
        f"The embedded ClickHouse endpoint cannot write Native output with {what}: query without "
        "client_protocol_version, or in another format (e.g. RowBinaryWithNamesAndTypes)",
    )


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def skip(self, size: int) -> None:
        if self.pos + size > len(self.data):
            raise EngineError(NOT_IMPLEMENTED, "The engine's Native output ended inside a block")
        self.pos += size

    def byte(self) -> int:
        self.skip(1)
        return self.data[self.pos - 1]

    def u64(self) -> int:
        self.skip(8)
        return struct.unpack_from("<Q", self.data, self.pos - 8)[0]

    def varuint(self) -> int:
        result, shift = 0, 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    def text(self) -> str:
        size = self.varuint()
        self.skip(size)
        return self.data[self.pos - size : self.pos].decode()


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _back_quote_if_needed(name: str) -> str:
    return name if _IDENTIFIER.match(name) else "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _decode_type(r: _Reader) -> ColumnType:
    tag = r.byte()
    if tag in _FIXED:
        name, width = _FIXED[tag]
        return ColumnType(name, "fixed", width)
    if tag == 0x12:
        return ColumnType(f"DateTime({_quote(r.text())})", "fixed", 4)
    if tag in (0x13, 0x14):
        precision = r.byte()
        zone = f", {_quote(r.text())}" if tag == 0x14 else ""
        return ColumnType(f"DateTime64({precision}{zone})", "fixed", 8)
    if tag == 0x34:
        return ColumnType(f"Time64({r.byte()})", "fixed", 8)
    if tag == 0x15:
        return ColumnType("String", "string")
    if tag == 0x16:
        size = r.varuint()
        return ColumnType(f"FixedString({size})", "fixed", size)
    if tag in (0x17, 0x18):
        items = []
        for _ in range(r.varuint()):
            label = r.text()
            r.skip(1 if tag == 0x17 else 2)
            value = struct.unpack_from("<b" if tag == 0x17 else "<h", r.data, r.pos - (1 if tag == 0x17 else 2))[0]
            items.append(f"{_quote(label)} = {value}")
        bits = 8 if tag == 0x17 else 16
        return ColumnType(f"Enum{bits}({', '.join(items)})", "fixed", bits // 8)
    if 0x19 <= tag <= 0x1C:
        precision, scale = r.byte(), r.byte()
        return ColumnType(f"Decimal({precision}, {scale})", "fixed", 4 << (tag - 0x19))
    if tag == 0x1E:
        inner = _decode_type(r)
        return ColumnType(f"Array({inner.name})", "array", children=(inner,))
    if tag in (0x1F, 0x20, 0x2F):
        elements = []
        for _ in range(r.varuint()):
            element = r.text() if tag != 0x1F else None
            elements.append((element, _decode_type(r)))
        body = ", ".join(
            t.name if label is None else f"{_back_quote_if_needed(label)} {t.name}" for label, t in elements
        )
        tuple_type = ColumnType(f"Tuple({body})", "tuple", children=tuple(t for _, t in elements))
        if tag == 0x2F:
            return ColumnType(f"Nested({body})", "array", children=(tuple_type,))
        return tuple_type
    if tag == 0x22:
        return ColumnType(f"Interval{_INTERVALS.get(r.byte(), '?')}", "fixed", 8)
    if tag == 0x23:
        inner = _decode_type(r)
        return ColumnType(f"Nullable({inner.name})", "nullable", children=(inner,))
    if tag == 0x26:
        inner = _decode_type(r)
        return ColumnType(f"LowCardinality({inner.name})", "low_cardinality", children=(inner,))
    if tag == 0x27:
        key, value = _decode_type(r), _decode_type(r)
        pair = ColumnType(f"Tuple({key.name}, {value.name})", "tuple", children=(key, value))
        return ColumnType(f"Map({key.name}, {value.name})", "array", children=(pair,))
    if tag == 0x2A:
        variants = tuple(_decode_type(r) for _ in range(r.varuint()))
        return ColumnType(f"Variant({', '.join(v.name for v in variants)})", "variant", children=variants)
    if tag == 0x2C:
        return _custom_type(r.text())
    raise _cannot(f"a column of type {_UNSUPPORTED.get(tag, f'with binary tag 0x{tag:02X}')}")


def _custom_type(name: str) -> ColumnType:
    point = ColumnType("Point", "fixed", 16)
    ring = ColumnType("Ring", "array", children=(point,))
    polygon = ColumnType("Polygon", "array", children=(ring,))
    layouts = {
        "Point": point,
        "Ring": ring,
        "LineString": ColumnType("LineString", "array", children=(point,)),
        "Polygon": polygon,
        "MultiLineString": ColumnType("MultiLineString", "array", children=(ring,)),
        "MultiPolygon": ColumnType("MultiPolygon", "array", children=(polygon,)),
    }
    if name not in layouts:
        raise _cannot(f"a column of type {name}")
    return layouts[name]


def _skip_prefix(r: _Reader, t: ColumnType) -> None:
    """The serialisation state prefix written once per column before its data."""
    if t.kind == "low_cardinality":
        r.skip(8)  # key version
    elif t.kind == "variant" and r.u64() != 0:
        raise _cannot("a Variant column in compact discriminator mode")
    for child in t.children:
        if t.kind != "low_cardinality":
            _skip_prefix(r, child)


def _skip_data(r: _Reader, t: ColumnType, rows: int) -> None:
    if rows == 0:
        return
    if t.kind == "fixed":
        r.skip(rows * t.width)
    elif t.kind == "string":
        for _ in range(rows):
            r.skip(r.varuint())
    elif t.kind == "nullable":
        r.skip(rows)
        _skip_data(r, t.children[0], rows)
    elif t.kind == "array":
        r.skip(rows * 8)
        total = struct.unpack_from("<Q", r.data, r.pos - 8)[0]
        _skip_data(r, t.children[0], total)
    elif t.kind == "tuple":
        for child in t.children:
            _skip_data(r, child, rows)
    elif t.kind == "low_cardinality":
        keys = t.children[0].children[0] if t.children[0].kind == "nullable" else t.children[0]
        while rows > 0:
            index_type = r.u64()
            if index_type & _HAS_ADDITIONAL_KEYS:
                _skip_data(r, keys, r.u64())
            count = r.u64()
            r.skip(count << (index_type & 0xFF))
            rows -= count
    elif t.kind == "variant":
        r.skip(rows)
        discriminators = r.data[r.pos - rows : r.pos]
        for index, child in enumerate(t.children):
            _skip_data(r, child, discriminators.count(index))
