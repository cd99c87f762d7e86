"""Records that are not exactly one row, or that ClickHouse refuses: found, set aside, remembered. Pure.

A txn commits only if its stage table holds exactly one row per record staged (the coordinator
compares ``count()`` with the rows reported), so a record ClickHouse would read as two rows, or as
none, must never reach a stage table. Three lines of defence, cheapest first (the code calls them
"bad records step N"):

1. ``precheck``, per record without parsing: tombstones (null values), zero-length values, in JSON
   object formats values that do not start with ``{`` and end with ``}``, and records this process
   already found to break a chunk (``Remembered``).
2. ``has_joins`` / ``split_joined``, JSON object formats only: ClickHouse reads objects placed back
   to back (``}{``, ``} {``, ``},{``, ``}\\n{``) as separate rows. After step 1 every record starts
   with ``{`` and ends with ``}``, so a body of n records holds exactly n - 1 such joins between
   records; one scan of the body finds any more, and only then are records parsed (msgspec) and
   those that are not one JSON object set aside. A join inside a JSON string is a false alarm that
   costs one parse per record of its chunk, never a letter.
3. After the insert, ClickHouse's ``written_rows`` must equal the records sent. When it does not
   (a CSV record of two lines; without metadata columns, a JSON string left open that swallows the
   next record), the chunk is already in the stage table under its token and that txn cannot
   commit. The stager then finds the culprits with ``participant.bisection.isolate`` (probes into
   a Null-engine clone, never the stage table: ``participant.not_one_row``) and ``Remembered``
   keeps them, so the txn that reads them again dead-letters them in step 1 and commits: such a
   record costs one aborted txn, not a loop.

Records ClickHouse refuses (``participant.bisection.isolate_refused``) are found by inserting parts
of their chunk: ClickHouse is the judge, ``json_problem`` only picks the records to try alone first.
It is advice, not a verdict, and never raises: msgspec refuses much that ClickHouse reads (NaN, raw
newlines in strings, bytes that are not UTF-8, numbers past a float, nesting past Python's recursion
limit). Its syntax errors name a problem; its other failures say nothing (it cannot tell).

A letter is ``(record, error, code)``: ``code`` is ClickHouse's error code, 0 when found here.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import msgspec

from protocol.chunking import RecordLike, record_problem

#: The error of a record with a null value (a Kafka tombstone).
TOMBSTONE = (
    "tombstone: null value (a Kafka delete marker); chtxn inserts rows and has no delete to apply, "
    "so the record is set aside here with its key"
)
#: The error of a record with a zero-length value.
EMPTY = "empty record: zero-length value, nothing to insert"
#: The error of a JSON record that is not one object.
NOT_AN_OBJECT = "not a JSON object: JSONEachRow takes exactly one {...} object per record"

#: Errors are kept (and stored with letters) cut to this many characters.
MAX_ERROR_CHARS = 4096

_OPEN, _CLOSE = ord("{"), ord("}")
_BLANKS = b" \t\r\n\f\v"
#: The end of one JSON object and the start of another, as ClickHouse's JSONEachRow reader joins rows.
_JOIN = re.compile(rb"\}[\s,;]*\{")
_JSON = msgspec.json.Decoder()


class Letter(NamedTuple):
    record: RecordLike
    error: str
    code: int = 0


class Remembrance(NamedTuple):
    """What ``Remembered`` keeps of a letter: a fingerprint of the record, not the record."""

    fingerprint: int
    error: str
    code: int


def precheck(
    records: Sequence[RecordLike],
    *,
    json_objects: bool,
    remembered: Mapping[int, Remembrance] | None = None,
) -> tuple[Sequence[RecordLike], list[Letter]]:
    """Bad records step 1: (records that may each be one row, letters for the others), in offset order.

    ``remembered`` maps offsets of this chunk's partition to letters found before
    (``Remembered.recall``). Fast path, nothing suspect: ``records`` itself, no letters.
    """
    if json_objects and not remembered and _all_objects(records):
        return records, []
    suspects = [
        i
        for i, r in enumerate(records)
        if not (v := r.value())
        or (json_objects and (v[0] != _OPEN or len(v) < 2 or (v[-1] != _CLOSE and v.rstrip(_BLANKS)[-1:] != b"}")))
    ]
    if remembered:
        at = {r.offset(): i for i, r in enumerate(records)}
        suspects += [at[o] for o in remembered if o in at]
    if not suspects:
        return records, []
    letters: dict[int, Letter] = {}
    for i in sorted(set(suspects)):
        record = records[i]
        known = remembered.get(record.offset()) if remembered else None
        if known is not None and known.fingerprint == fingerprint(record):
            letters[i] = Letter(record, known.error, known.code)
        elif problem := _one_row_problem(record.value(), json_objects):
            letters[i] = Letter(record, problem)
    if not letters:
        return records, []
    return [r for i, r in enumerate(records) if i not in letters], [letters[i] for i in sorted(letters)]


def _all_objects(records: Sequence[RecordLike]) -> bool:
    """Whether every value starts with ``{`` and ends with ``}`` (so none is null or empty).
    False says nothing: the per-record check then decides."""
    try:
        for r in records:
            v: bytes = r.value()  # type: ignore[assignment]  # None raises TypeError: caught below
            if v[0] != _OPEN or v[-1] != _CLOSE:
                return False
    except (TypeError, IndexError):  # a null or empty value
        return False
    return True


def _one_row_problem(value: bytes | None, json_objects: bool) -> str | None:
    if value is None:
        return TOMBSTONE
    if not value:
        return EMPTY
    if json_objects and not record_problem(value, json_objects=True) and not value.rstrip(_BLANKS).endswith(b"}"):
        return json_problem(value) or NOT_AN_OBJECT  # e.g. cut short, or something after the object
    return record_problem(value, json_objects=json_objects)


def has_joins(body: bytes, records: int) -> bool:
    """Bad records step 2: whether a JSON body of ``records`` prechecked records may hold a record of two
    objects."""
    if body.count(b"}") <= records:  # one closing brace per record: no record can hold a join
        return False
    return len(_JOIN.findall(body)) > records - 1


def split_joined(records: Sequence[RecordLike]) -> tuple[list[RecordLike], list[Letter]]:
    """Bad records step 2, after ``has_joins``: records holding a join that are not one JSON object become
    letters."""
    kept: list[RecordLike] = []
    letters: list[Letter] = []
    for record in records:
        value: bytes = record.value()  # type: ignore[assignment]  # prechecked: never None
        problem = json_problem(value) if _JOIN.search(value) else None
        if problem:
            letters.append(
                Letter(
                    record,
                    f"not one JSON object but several back to back, which ClickHouse "
                    f"would store as several rows ({problem})",
                )
            )
        else:
            kept.append(record)
    return kept, letters


def json_problem(value: bytes) -> str | None:
    """Why ``value`` is surely not one JSON object, found by parsing it; None when it is one, or
    when parsing cannot tell. Never raises.

    msgspec's syntax errors (``DecodeError``) give a problem. Its other failures are limits of the
    parser, not proof against the record, and give None: ``ValidationError`` for a number past a
    float or an int64 (``1e999``), ``RecursionError`` past about 1,000 levels of nesting,
    ``UnicodeDecodeError`` for a string that is not UTF-8 (ClickHouse stores the bytes),
    ``MemoryError`` and anything else.
    """
    try:
        decoded = _JSON.decode(value)
    except msgspec.ValidationError:
        return None
    except msgspec.DecodeError as exc:
        return f"malformed JSON: {exc}"
    except Exception:  # RecursionError, UnicodeDecodeError, MemoryError...: cannot tell
        return None
    if not isinstance(decoded, dict):
        return f"not a JSON object but a {type(decoded).__name__}"
    return None


def fingerprint(record: RecordLike) -> int:
    """A hash of the record's key and value: a topic deleted and created again reuses offsets."""
    return hash((record.key(), record.value()))


class Remembered:
    """Letters found only after their chunk was inserted, by (topic, partition, offset). Thread-safe.

    Bounded: past ``capacity`` the oldest are forgotten (such a record then costs one more aborted
    txn when read again). A process keeps its own: a restarted task finds them again the same way.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._letters: OrderedDict[tuple[str, int, int], Remembrance] = OrderedDict()
        self._offsets: dict[tuple[str, int], set[int]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._letters)

    def remember(self, letters: Iterable[Letter]) -> None:
        with self._lock:
            for letter in letters:
                r = letter.record
                key = (r.topic(), r.partition(), r.offset())
                self._letters[key] = Remembrance(fingerprint(r), letter.error[:MAX_ERROR_CHARS], letter.code)
                self._letters.move_to_end(key)
                self._offsets.setdefault(key[:2], set()).add(key[2])
            while len(self._letters) > self.capacity:
                (topic, partition, offset), _ = self._letters.popitem(last=False)
                held = self._offsets[(topic, partition)]
                held.discard(offset)
                if not held:
                    del self._offsets[(topic, partition)]

    def recall(self, topic: str, partition: int, first: int, end: int) -> dict[int, Remembrance]:
        """Letters remembered for offsets ``[first, end)`` of one partition (usually none: O(1))."""
        with self._lock:
            held = self._offsets.get((topic, partition))
            if not held:
                return {}
            return {o: self._letters[(topic, partition, o)] for o in held if first <= o < end}
