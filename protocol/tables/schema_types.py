"""Schema evolution rules (``[schema]``): the top-level fields of JSON records a table lacks, the
ClickHouse type of a new column from the values seen, and the DDL that adds it. Pure: text in,
text out; ``participant.schema_evolution`` runs the queries.

Type inference (``column_type``), from the JSON kinds of the values of one field in one chunk:

- only ``true``/``false`` -> ``Bool``; only integers within Int64 -> ``Int64``;
- floats, or integers mixed with floats -> ``Float64``;
- strings -> ``String``; objects and arrays -> ``String`` holding their JSON text
  (ClickHouse's ``input_format_json_read_objects_as_strings`` / ``..._arrays_as_strings``);
- integers beyond Int64, and any other mix (a boolean and a number, a number and a string, ...)
  -> ``String`` holding the value's text: no narrower type holds every value seen without loss;
- only nulls -> no type yet: the field waits for a chunk where it has a value. Until then its
  rows store nothing for it (ClickHouse skips a field the table lacks), which is what the
  column's default, the value a null gets, would have said.

A new column is never ``Nullable``: a null reads as the column's default (``0``, ``""``,
``false``), as ClickHouse stores nulls in a non-nullable column.

Fields chtxn never adds: the metadata columns (``_topic``, ``_partition``, ``_offset``), which
chtxn fills itself when the target has them, and a field with an empty name, which cannot be a
column (its record becomes a dead letter). A null value counts as absent everywhere here.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol.framing import METADATA_COLUMNS


class Kind(enum.Enum):
    """The JSON kind of a value, as far as type inference needs it."""

    NULL = "null"
    BOOL = "a boolean"
    INT = "an integer"
    BIG_INT = "an integer beyond Int64"
    FLOAT = "a float"
    STRING = "a string"
    OBJECT = "an object"
    ARRAY = "an array"


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FIRST: dict[int, Kind] = {
    ord("{"): Kind.OBJECT,
    ord("["): Kind.ARRAY,
    ord('"'): Kind.STRING,
    ord("t"): Kind.BOOL,
    ord("f"): Kind.BOOL,
    ord("n"): Kind.NULL,
}
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def kind_of_raw(raw: bytes) -> Kind:
    """The kind of one JSON value's text, without parsing it (``raw`` is valid JSON: msgspec read it)."""
    kind = _FIRST.get(raw[0])
    if kind is not None:
        return kind
    if b"." in raw or b"e" in raw or b"E" in raw:
        return Kind.FLOAT
    if len(raw) < 19:  # at most 18 digits: within Int64
        return Kind.INT
    return Kind.INT if _INT64_MIN <= int(raw) <= _INT64_MAX else Kind.BIG_INT


def kind_of_value(value: object) -> Kind:
    """The kind of a value Python's ``json`` decoded (the fallback reader)."""
    if value is None:
        return Kind.NULL
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, int):
        return Kind.INT if _INT64_MIN <= value <= _INT64_MAX else Kind.BIG_INT
    if isinstance(value, float):
        return Kind.FLOAT
    if isinstance(value, str):
        return Kind.STRING
    return Kind.OBJECT if isinstance(value, dict) else Kind.ARRAY


def column_type(kinds: Collection[Kind]) -> str | None:
    """The ClickHouse type of a new column whose values were of ``kinds`` (module docstring); None
    when there was no value but null."""
    seen = set(kinds) - {Kind.NULL}
    if not seen:
        return None
    if seen == {Kind.BOOL}:
        return "Bool"
    if seen == {Kind.INT}:
        return "Int64"
    if seen and seen <= {Kind.INT, Kind.FLOAT, Kind.BIG_INT} and Kind.FLOAT in seen:
        return "Float64"
    return "String"


def name_problem(name: str) -> str | None:
    """Why field ``name`` cannot become a column; None when it can."""
    return "an empty name cannot be a ClickHouse column" if not name else None


def addable(name: str) -> bool:
    """Whether ``add-columns`` would make field ``name`` a column (metadata columns are chtxn's)."""
    return name not in METADATA_COLUMNS and name_problem(name) is None


@dataclass
class FieldScan:
    """What ``scan_fields`` found in a chunk's records about the fields the table lacks.

    ``kinds``: field -> the kinds of its values, in the order the fields were first met;
    ``unknown``: record index -> its fields with a non-null value the table lacks, in record order;
    ``unread``: indexes of records neither msgspec nor Python's ``json`` could read (left to
    ClickHouse, which refuses the malformed ones).
    """

    kinds: dict[str, set[Kind]] = field(default_factory=dict)
    unknown: dict[int, list[str]] = field(default_factory=dict)
    unread: list[int] = field(default_factory=list)

    def types(self) -> dict[str, str]:
        """field -> inferred ClickHouse type, for the fields that had a non-null value."""
        found = {name: column_type(kinds) for name, kinds in self.kinds.items()}
        return {name: kind for name, kind in found.items() if kind is not None}


def scan_fields(values: Sequence[bytes], known: Collection[str]) -> FieldScan:
    """The top-level fields of the JSON objects ``values`` that ``known`` (a table's column names)
    lacks. Each value is read once by msgspec, field values left as raw text (only the fields
    ``known`` lacks are looked at); a record msgspec refuses (``NaN``, raw control characters in a
    string) is read by Python's ``json`` instead."""
    known_set = known if isinstance(known, (set, frozenset)) else set(known)
    scan = FieldScan()
    for i, value in enumerate(values):
        try:
            fields: Mapping[str, object] = _FIELDS.decode(value)
            kind_of: Callable[[Any], Kind] = _kind_of_raw_value
        except (msgspec.DecodeError, RecursionError):
            parsed = _fallback(value)
            if parsed is None:
                scan.unread.append(i)
                continue
            fields, kind_of = parsed, kind_of_value
        if known_set.issuperset(fields):
            continue
        unknown = []
        for name, found in fields.items():
            if name in known_set:
                continue
            kind = kind_of(found)
            scan.kinds.setdefault(name, set()).add(kind)
            if kind is not Kind.NULL:
                unknown.append(name)
        if unknown:
            scan.unknown[i] = unknown
    return scan


def _kind_of_raw_value(raw: msgspec.Raw) -> Kind:
    return kind_of_raw(bytes(raw))


def _fallback(value: bytes) -> Mapping[str, object] | None:
    """``value`` read by Python's ``json`` (NaN, Infinity and control characters in strings
    allowed); None when it is not one JSON object it can read."""
    try:
        parsed = json.loads(value.decode("utf-8"), strict=False)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return parsed if isinstance(parsed, dict) else None


def unknown_field_error(names: Sequence[str]) -> str:
    """The dead letter's error of a record carrying fields the target has no column for."""
    first = names[0]
    error = f'unknown field {first}: the target has no column {first} (schema.evolve = "off")'
    if len(names) > 1:
        error += f"; other unknown fields: {', '.join(names[1:])}"
    return error


def bad_name_error(name: str) -> str:
    """The dead letter's error of a record carrying a field that cannot be a column."""
    return (
        f'field {name!r}: {name_problem(name)}, so schema.evolve = "add-columns" cannot keep its value '
        "(the record is set aside instead of storing its row without it)"
    )


# ---- DDL -----------------------------------------------------------------------------------


def ident(name: str) -> str:
    """``name`` as a ClickHouse identifier."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def add_columns_sql(qualified: str, columns: Iterable[tuple[str, str, str | None]], *, on_cluster: str = "") -> str:
    """One ``ALTER TABLE`` adding each (name, type, after) of ``columns`` unless it exists: after
    column ``after``, ``FIRST`` when it is "", at the end when None. ``on_cluster`` is the
    `` ON CLUSTER ...`` clause or ""."""
    clauses = []
    for name, kind, after in columns:
        where = "" if after is None else " FIRST" if after == "" else f" AFTER {ident(after)}"
        clauses.append(f"ADD COLUMN IF NOT EXISTS {ident(name)} {kind}{where}")
    return f"ALTER TABLE {qualified}{on_cluster} {', '.join(clauses)}"


def stage_additions(
    target: Sequence[tuple[str, str]], stage: Collection[str], fields: Collection[str]
) -> list[tuple[str, str, str | None]]:
    """(name, the target's type, after) of each of ``fields`` that the ``target`` (its (name, type)
    columns in order) has and the ``stage`` table (its column names) lacks, in the target's order,
    each placed after the nearest column before it in the target that the stage table has (or is
    given here). While the stage table's columns are the target's in the target's order less some,
    this keeps them so whatever order fields arrive in: the structure check of commit step 5
    compares columns in order."""
    present = set(stage)
    additions: list[tuple[str, str, str | None]] = []
    before = ""
    for name, kind in target:
        if name in fields and name not in present:
            additions.append((name, kind, before))
            present.add(name)
        if name in present:
            before = name
    return additions


# ---- naming the field of a refused record ----------------------------------------------------

_INTS = ("Int", "UInt")
_FLOATS = ("Float", "Decimal", "BFloat")
_WRAPPERS = ("Nullable(", "LowCardinality(")


def conflict(value: bytes, columns: Mapping[str, str]) -> tuple[str, str, Kind] | None:
    """(field, column type, kind) of the first field of record ``value`` whose value column
    ``columns[field]`` cannot read, as far as the JSON kind tells; None when none is found. Advice
    for naming the field in a dead letter's error, never a verdict: ClickHouse judges."""
    try:
        fields = _FIELDS.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None
    for name, raw in fields.items():
        column = columns.get(name)
        if column is None:
            continue
        text = bytes(raw)
        kind = kind_of_raw(text)
        if not accepts(column, kind, text):
            return name, column, kind
    return None


def accepts(column: str, kind: Kind, raw: bytes) -> bool:
    """Whether a column of type ``column`` reads a JSON value of ``kind`` (text ``raw``), by the
    rules of ClickHouse's JSONEachRow reader for numbers, booleans and strings; True for any
    type it does not judge."""
    base = column
    while base.startswith(_WRAPPERS):
        base = base[base.index("(") + 1 : -1]
    if kind is Kind.NULL or base.startswith(("String", "FixedString")):
        return True
    if base.startswith(_INTS) and base[len(base.rstrip("0123456789")) :]:
        if kind is Kind.STRING:
            return raw[1:-1].lstrip(b"-+").isdigit()
        return kind in (Kind.INT, Kind.BIG_INT, Kind.BOOL)
    if base.startswith(_FLOATS):
        if kind is Kind.STRING:
            try:
                float(raw[1:-1])
            except ValueError:
                return False
            return True
        return kind in (Kind.INT, Kind.BIG_INT, Kind.FLOAT, Kind.BOOL)
    if base == "Bool":
        return kind is Kind.BOOL or (kind is Kind.INT and raw in (b"0", b"1"))
    return True


def conflict_error(found: tuple[str, str, Kind], error: str) -> str:
    """``error`` (ClickHouse's) of a refused record, led by the field ``conflict`` found."""
    name, column, kind = found
    return f"field {name}: column {name} is {column} and cannot hold {kind.value} (ClickHouse: {error})"
