"""Bad records found by inserting parts of their chunk, ClickHouse the judge. Pure: the inserts are callables.

- ``isolate`` (bad records step 3, ``participant.bad_records``): the records that are not one row
  each, by probes into a table that keeps nothing (``participant.not_one_row``).
- ``isolate_refused``: the records ClickHouse refuses, for their data or for memory, by inserts
  of parts of a refused chunk under sub-tokens; the rest of the chunk is staged. The JSON
  pre-check (``participant.bad_records.json_problem``) only picks the records to try alone
  first: it is advice, not a verdict.

A record becomes a letter only when ClickHouse refuses it alone, with ClickHouse's error and code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from participant.bad_records import Letter
from protocol.chcodes import ErrorClass, classify, is_memory
from protocol.chunking import RecordLike
from protocol.errors import ClickHouseError

#: The start of the error of a record ClickHouse runs out of memory for, alone, while it has memory to spare.
TOO_BIG_FOR_MEMORY = (
    "too big for ClickHouse's memory: this record failed alone, again, while the server had memory "
    "for other queries, so parsing it needs more than a query may use (max_memory_usage)"
)


class Refused(Exception):
    """A probe's data was refused by ClickHouse (a DATA-class error)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def isolate(records: Sequence[RecordLike], probe: Callable[[Sequence[RecordLike]], int]) -> list[Letter]:
    """Bad records step 3: the records that are not one row each, by bisection; ``probe(part)`` returns the rows
    ClickHouse made of ``part`` (into a table that keeps nothing) or raises ``Refused``.

    A part whose row count matches is taken as sound; one that does not, or is refused, is split
    until single records are judged. Every mismatch of the whole is traced to at least one record.
    """
    letters: list[Letter] = []

    def judge(part: Sequence[RecordLike]) -> None:
        if not part:
            return
        try:
            rows = probe(part)
        except Refused as exc:
            if len(part) == 1:
                letters.append(Letter(part[0], str(exc), exc.code))
                return
        else:
            if rows == len(part):
                return
            if len(part) == 1:
                letters.append(Letter(part[0], f"not one row: ClickHouse made {rows} rows of this record"))
                return
        mid = len(part) // 2
        judge(part[:mid])
        judge(part[mid:])

    judge(records)
    return letters


def isolate_refused(
    records: Sequence[RecordLike],
    refusal: ClickHouseError,
    insert: Callable[[Sequence[RecordLike], bool], int],
    has_memory: Callable[[], bool],
    *,
    suspect: Callable[[RecordLike], bool] | None = None,
) -> tuple[int, list[Letter]]:
    """Stage what ClickHouse takes of ``records``, refused as a whole with ``refusal``: (rows
    staged, letters of the records it refuses), by bisection.

    ``insert(part, retry_memory)`` inserts ``part`` (retrying ``RETRY`` codes, and ``MEMORY``
    codes only when ``retry_memory``) and returns its rows, or raises ``ClickHouseError``.
    ``has_memory()`` says whether the server can give a query memory now. ``suspect(record)``
    picks records to try alone first when the refusal is ``DATA`` (the JSON pre-check): the rest
    then goes in whole, and nothing is bisected when the suspects were the culprits.

    A record becomes a letter only when ClickHouse refuses it alone:

    - ``DATA`` code: at once, with ClickHouse's error and code.
    - ``MEMORY`` code: a part refused for memory is split without retrying (smaller parts need
      less memory), and only while ``has_memory()``. A single record refused for memory is
      inserted alone again with retries; it becomes a letter (``TOO_BIG_FOR_MEMORY``) only if that
      fails too and ``has_memory()`` holds before and after.

    Raises the ``ClickHouseError`` for anything else, and for a memory error while the server has
    no memory to spare (its load, not a record): the chunk fails, its txn aborts, nothing is
    dead-lettered. Parts inserted before that stay under their sub-tokens.
    """
    letters: list[Letter] = []

    def again_alone(record: RecordLike) -> int:
        try:
            return insert([record], True)
        except ClickHouseError as exc:
            if classify(exc.code) is ErrorClass.DATA:
                letters.append(Letter(record, str(exc), exc.code))
                return 0
            if not is_memory(exc.code) or not has_memory():
                raise
            letters.append(Letter(record, f"{TOO_BIG_FOR_MEMORY}: {exc}", exc.code))
            return 0

    def judge(part: Sequence[RecordLike], failure: ClickHouseError | None = None) -> int:
        if not part:
            return 0
        if failure is None:
            try:
                return insert(part, False)
            except ClickHouseError as exc:
                failure = exc
        if classify(failure.code) is ErrorClass.DATA:
            if len(part) == 1:
                letters.append(Letter(part[0], str(failure), failure.code))
                return 0
        elif is_memory(failure.code) and has_memory():
            if len(part) == 1:
                return again_alone(part[0])
        else:
            raise failure
        mid = len(part) // 2
        return judge(part[:mid]) + judge(part[mid:])

    flags = [suspect(r) for r in records] if suspect and classify(refusal.code) is ErrorClass.DATA else []
    if not any(flags):
        return judge(records, refusal), letters
    rows = judge([r for r, flagged in zip(records, flags) if not flagged])
    rows += sum(judge([r]) for r, flagged in zip(records, flags) if flagged)
    return rows, letters
