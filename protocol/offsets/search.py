"""The first offset whose record is at or after a time, from the records' own timestamps.

``chtxn reset --to-time`` asks the broker (ListOffsets by timestamp), then checks the answer
against the records: a broker may answer wrongly (the embedded broker answers offset 0 for any
time). ``answer_holds`` is that check; ``search`` finds the offset by a binary search over the log
when the answer does not hold. Both see the log through ``first_at(offset)``: the offset and the
timestamp (unix ms) of the first record at or after ``offset``, or None past the last record.
Timestamps are taken as non-decreasing along the log (producers' CreateTime, as Kafka's own time
index assumes); where they are not, the search still returns an offset whose record is at or
after the time, with the record before it earlier than the time.
"""

from __future__ import annotations

from collections.abc import Callable

#: Offsets stepped back over, looking for the record before an answer, before searching instead.
STEP_BACK = 64

Record = tuple[int, int]  # (offset, timestamp in unix ms)
FirstAt = Callable[[int], "Record | None"]


def answer_holds(first_at: FirstAt, low: int, high: int, when_ms: int, answer: int) -> bool:
    """The broker's ``answer`` is the first offset of ``[low, high)`` whose record is at or after
    ``when_ms`` (``high``, or a negative answer, when no record is that late)."""
    try:
        return _holds(first_at, low, high, when_ms, answer)
    except _TooFar:
        return False


def _holds(first_at: FirstAt, low: int, high: int, when_ms: int, answer: int) -> bool:
    if answer < 0 or answer >= high:
        last = _last_before(first_at, low, high)
        return last is None or last[1] < when_ms
    if answer < low:
        return False
    found = first_at(answer)
    if found is None or found[0] != answer or found[1] < when_ms:
        return False
    before = _last_before(first_at, low, answer)
    return before is None or before[1] < when_ms


def search(first_at: FirstAt, low: int, high: int, when_ms: int) -> int:
    """The first offset of ``[low, high)`` whose record is at or after ``when_ms``; ``high`` if none."""
    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi) // 2
        found = first_at(mid)
        if found is None or found[1] >= when_ms:
            hi = mid
        else:
            lo = found[0] + 1
    found = first_at(lo) if lo < high else None
    return found[0] if found is not None and found[1] >= when_ms else high


def _last_before(first_at: FirstAt, low: int, end: int) -> Record | None:
    """The last record before offset ``end`` (None if ``[low, end)`` holds none), stepping back over
    offsets that hold no record (transaction markers), at most ``STEP_BACK`` of them."""
    at = end - 1
    while at >= max(low, end - STEP_BACK):
        found = first_at(at)
        if found is not None and found[0] < end:
            return found
        at -= 1
    if at >= low:
        raise _TooFar
    return None


class _TooFar(Exception):
    """More than ``STEP_BACK`` offsets without a record: the answer is not checked, it is searched for."""
