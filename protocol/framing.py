"""How a chunk's records travel to ClickHouse: framed as they are, never parsed, and the INSERT that
has ClickHouse fill the metadata columns.

Guarantees (docs/architecture.md §4):

1. A body is the records' values, untouched, framed by the input format's family (``frame``):
   line formats joined with ``b"\\n"``, self-delimiting binary formats (RowBinary, AvroConfluent)
   concatenated, and Protobuf records (one message each, as Kafka carries them) each led by its
   length as a varint, which ClickHouse's ``Protobuf`` format reads. No record is read past its
   length.
2. When the table has metadata columns (``_topic``, ``_partition``, ``_offset``), ClickHouse
   derives them on the insert side: ``MetadataInsert.statement`` is ``INSERT INTO t (columns)
   SELECT ..., {chtxn_topic:String}, {chtxn_partition:UInt32}, <offset> FROM input('<structure>')
   FORMAT <format>``, where row ``n`` of the body (``rowNumberInAllBlocks()``) gets the ``n``-th
   offset of the records: ``first + n`` for consecutive offsets, or the ``n``-th element of the
   offsets the query parameters ``chtxn_starts`` and ``chtxn_lengths`` list as runs.
3. Row ``n`` is record ``n``: ClickHouse's parallel parsing keeps the order of rows (its segments
   are parsed apart and delivered in order), and the statement runs with ``max_threads = 1``
   (``ROW_ORDER_SETTINGS``), so no step between the parser and ``rowNumberInAllBlocks()`` runs on
   several streams (with more threads, the pipeline after a table function is resized, and rows
   are numbered out of order). The participant still counts: a chunk whose rows are not as many
   as its records fails (stager step 5), because then row ``n`` is not record ``n``.
4. Columns the records may omit keep the table's ``DEFAULT``: input() reads such a column as
   ``Nullable`` and the SELECT takes ``ifNull(column, <its default expression>)``, which is what an
   omitted field gets in a plain ``INSERT ... FORMAT`` (``input_format_defaults_for_omitted_fields``).
   ``MATERIALIZED``, ``ALIAS`` and ``EPHEMERAL`` columns are the table's to compute.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import chain

from protocol.chunking import RecordLike
from protocol.errors import SetupError

#: Target columns ClickHouse fills for chtxn on the insert side, when the target has them.
METADATA_COLUMNS = ("_topic", "_partition", "_offset")
#: Input formats whose records are JSON objects (ClickHouse aliases of JSONEachRow included).
JSON_OBJECT_FORMATS = frozenset({"JSONEachRow", "JSONLines", "NDJSON"})
#: Formats of one record per line: the body is the records joined with line breaks.
LINE_FORMATS = JSON_OBJECT_FORMATS | frozenset(
    {
        "CSV",
        "TSV",
        "TabSeparated",
        "TSVRaw",
        "TabSeparatedRaw",
        "JSONCompactEachRow",
        "JSONStringsEachRow",
        "JSONCompactStringsEachRow",
    }
)
#: Formats whose rows delimit themselves: the body is the records back to back.
CONCATENATED_FORMATS = frozenset({"RowBinary", "AvroConfluent"})
#: Formats whose rows are led by their length: the participant writes each record's length.
LENGTH_DELIMITED_FORMATS = frozenset({"Protobuf"})
#: Every format chtxn loads one record per row, with metadata columns and row-level checks.
RECORD_FORMATS = LINE_FORMATS | CONCATENATED_FORMATS | LENGTH_DELIMITED_FORMATS

#: Settings of every metadata insert: row ``n`` of the body is numbered ``n`` (guarantee 3).
ROW_ORDER_SETTINGS = {"max_threads": 1}

#: Column kinds a plain ``INSERT ... FORMAT`` writes (``system.columns.default_kind``).
_INSERTED_KINDS = frozenset({"", "DEFAULT"})
#: Types that cannot be wrapped in ``Nullable``.
_NOT_NULLABLE = ("Array(", "Map(", "Tuple(", "Nested(", "Nullable(", "Object(", "JSON", "Variant(", "Dynamic")


#: What each metadata column is filled with (guarantee 2).
_FILLS = {
    "_topic": "{chtxn_topic:String}",
    "_partition": "{chtxn_partition:UInt32}",
    "_offset": "{chtxn_first:UInt64} + rowNumberInAllBlocks()",
}
#: ``_offset`` of row ``n`` when the records' offsets have gaps: the ``n``-th offset of the runs.
_OFFSET_OF_RUNS = (
    "arrayFlatten(arrayMap((s, n) -> range(s, s + n), {chtxn_starts:Array(UInt64)}, {chtxn_lengths:Array(UInt64)}))"
    "[rowNumberInAllBlocks() + 1]"
)


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table, as ``system.columns`` describes it."""

    name: str
    type: str
    default_kind: str = ""
    default_expression: str = ""


def frame(records: Sequence[RecordLike], input_format: str) -> bytes:
    """The body of ``records`` (none null: ``protocol.chunking.record_problem``), by guarantee 1."""
    values: list[bytes] = [r.value() for r in records]  # type: ignore[misc]  # never None: prechecked
    if input_format in LENGTH_DELIMITED_FORMATS:
        return b"".join(chain.from_iterable((varint(len(v)), v) for v in values))
    if input_format in CONCATENATED_FORMATS:
        return b"".join(values)
    return b"\n".join(values)


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf base-128 varint."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def offset_runs(offsets: Sequence[int]) -> tuple[list[int], list[int]]:
    """``offsets`` (ascending) as runs of consecutive offsets: their first offsets and lengths."""
    starts: list[int] = []
    lengths: list[int] = []
    expected = -1
    for offset in offsets:
        if offset == expected:
            lengths[-1] += 1
        else:
            starts.append(offset)
            lengths.append(1)
        expected = offset + 1
    return starts, lengths


class MetadataInsert:
    """The INSERT of a table's chunks that has ClickHouse fill its metadata columns (guarantee 2).

    ``columns`` are the inserted columns, ``name type`` each in insert order (the data columns the
    records fill, then the metadata columns), as another server's insert of the selected rows names
    them (``protocol.shards.ShardRouter``)."""

    def __init__(self, database: str, table: str, columns: Sequence[Column], input_format: str) -> None:
        self.metadata = tuple(c.name for c in columns if c.name in METADATA_COLUMNS)
        data = [c for c in columns if c.name not in METADATA_COLUMNS and c.default_kind in _INSERTED_KINDS]
        structure, selected = [], []
        for c in data:
            name = ident(c.name)
            if c.default_kind == "DEFAULT" and c.default_expression and _nullable(c.type) != c.type:
                structure.append(f"{name} {_nullable(c.type)}")
                selected.append(f"ifNull({name}, {c.default_expression})")
            else:
                structure.append(f"{name} {c.type}")
                selected.append(name)
        self.database, self.table = database, table
        types = {c.name: c.type for c in columns}
        self.columns = [f"{ident(c.name)} {c.type}" for c in data] + [f"{ident(m)} {types[m]}" for m in self.metadata]
        self.names = ", ".join([ident(c.name) for c in data] + [ident(m) for m in self.metadata])
        self.head = f"INSERT INTO {ident(database)}.{ident(table)} ({self.names}) "
        tail = f" FROM input({quote(', '.join(structure))}) FORMAT {input_format}"
        self._consecutive = "SELECT " + ", ".join(selected + [_FILLS[m] for m in self.metadata]) + tail
        runs = {**_FILLS, "_offset": _OFFSET_OF_RUNS}
        self._gappy = "SELECT " + ", ".join(selected + [runs[m] for m in self.metadata]) + tail

    def statement(self, topic: str, partition: int, records: Sequence[RecordLike]) -> tuple[str, dict[str, object]]:
        """The statement and its query parameters for ``records`` (of ``topic``/``partition``, in
        ascending offsets): only the first and last offsets are read when they are consecutive."""
        select, params = self.select(topic, partition, records)
        return self.head + select, params

    def select(self, topic: str, partition: int, records: Sequence[RecordLike]) -> tuple[str, dict[str, object]]:
        """``statement`` without its ``INSERT INTO ... (columns)``: the rows of ``records``."""
        params: dict[str, object] = {"chtxn_topic": topic, "chtxn_partition": partition}
        if "_offset" not in self.metadata:
            return self._consecutive, params
        first = records[0].offset()
        if records[-1].offset() - first == len(records) - 1:
            return self._consecutive, {**params, "chtxn_first": first}
        starts, lengths = offset_runs([r.offset() for r in records])
        return self._gappy, {**params, "chtxn_starts": starts, "chtxn_lengths": lengths}


def _nullable(type_: str) -> str:
    """``type_`` able to hold NULL, or ``type_`` itself when ClickHouse cannot wrap it."""
    if type_.startswith("LowCardinality(") and type_.endswith(")"):
        inner = type_[len("LowCardinality(") : -1]
        return type_ if inner.startswith(_NOT_NULLABLE) else f"LowCardinality(Nullable({inner}))"
    return type_ if type_.startswith(_NOT_NULLABLE) else f"Nullable({type_})"


def ident(name: str) -> str:
    """``name`` as a ClickHouse identifier."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote(value: str) -> str:
    """``value`` as a ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_format(input_format: str, columns: Collection[str]) -> None:
    """Refuse metadata columns with an input format chtxn cannot load one record per row."""
    if problem := format_problem(input_format, columns):
        raise SetupError(problem)


def format_problem(input_format: str, columns: Collection[str], table: str = "the target table") -> str:
    """Why chtxn cannot fill the metadata columns among ``columns`` of ``table`` from records of
    ``input_format`` (and what to do); "" when it can."""
    present = [c for c in METADATA_COLUMNS if c in columns]
    if not present or input_format in RECORD_FORMATS:
        return ""
    return (
        f"{table} has metadata columns {', '.join(present)} but clickhouse.input_format is "
        f"{input_format!r}, which chtxn does not load one record per row: set clickhouse.input_format to one "
        f"of {', '.join(sorted(RECORD_FORMATS))}, or drop or rename those columns"
    )
