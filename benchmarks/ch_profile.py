"""ClickHouse's CPU in a window, by statement and by merge, from the endpoint's own system logs.

Every embedded endpoint keeps ``system.query_log`` and ``system.part_log``
(``embedded.ch_config``), as a server does by default. ``profile(client, since, until)`` sums
their ``ProfileEvents`` (user plus system CPU time) over the statements that finished and the
merges that ended in the window, grouped into lines:

- a statement's line is its kind and its normalized text (``normalizeQuery``: literals are ``?``),
  with each stage table's name (``<target>__chtxn_<pipeline>__<txn>``) as ``<stage>``, so one line
  holds the same statement of every txn;
- a merge's line is ``merge`` and its table (stage tables as one).

What the logs do not hold is left out: the endpoint's HTTP layer (Python) and ClickHouse's
background threads other than merges. The component ``clickhouse`` of ``benchmarks.cpu`` counts the
whole process; the difference between the two is that rest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.naming import STAGE_MARKER

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

_CPU = "(ProfileEvents['UserTimeMicroseconds'] + ProfileEvents['SystemTimeMicroseconds']) / 1e6"
_STAGE = re.compile(rf"`?[A-Za-z0-9_]*{re.escape(STAGE_MARKER)}[A-Za-z0-9_]*`?")
#: The longest a line's text is kept: enough to tell the statements of chtxn and the plain loop apart.
SHAPE_CHARS = 96


@dataclass(frozen=True)
class Line:
    """One kind of work: how often it ran in the window and the CPU seconds it took."""

    kind: str  # a query kind (Insert, Select, Alter, Create, Drop, System, ...) or "merge"
    shape: str  # the normalized statement, or the merged table
    count: int
    cpu_s: float


def profile(client: Client, since: float, until: float) -> list[Line]:
    """The lines of the window [``since``, ``until``] (unix seconds), most CPU first."""
    client.command("SYSTEM FLUSH LOGS")
    window = {"since": since, "until": until}
    statements = client.query(
        f"SELECT toString(query_kind), normalizeQuery(query), {_CPU} FROM system.query_log "
        "WHERE type != 'QueryStart' AND event_time_microseconds BETWEEN "
        "fromUnixTimestamp64Micro(toInt64({since:Float64} * 1e6)) AND fromUnixTimestamp64Micro(toInt64({until:Float64} * 1e6))",
        parameters=window,
    ).result_rows
    merges = client.query(
        f"SELECT 'merge', table, {_CPU} FROM system.part_log WHERE event_type IN ('MergeParts', 'MutatePart') "
        "AND event_time_microseconds BETWEEN "
        "fromUnixTimestamp64Micro(toInt64({since:Float64} * 1e6)) AND fromUnixTimestamp64Micro(toInt64({until:Float64} * 1e6))",
        parameters=window,
    ).result_rows
    return group([(kind, shape, float(cpu_s)) for kind, shape, cpu_s in [*statements, *merges]])


def per_100k(lines: Sequence[Line], rows: int, top: int = 8) -> list[list[object]]:
    """The ``top`` lines of most CPU as ``[kind, shape, times, CPU s per 100k rows]`` (a results
    file's form), then every other line summed as ``["", "every other line", times, s]``."""
    if not rows:
        return []

    def scaled(cpu_s: float) -> float:
        return round(cpu_s / rows * 1e5, 4)

    rest = lines[top:]
    head: list[list[object]] = [[x.kind, x.shape, x.count, scaled(x.cpu_s)] for x in lines[:top]]
    tail: list[list[object]] = [
        ["", "every other line", sum(x.count for x in rest), scaled(sum(x.cpu_s for x in rest))]
    ]
    return head + (tail if rest else [])


def group(rows: Sequence[tuple[str, str, float]]) -> list[Line]:
    """``(kind, text, cpu_s)`` rows summed into lines by kind and shape, most CPU first."""
    sums: dict[tuple[str, str], tuple[int, float]] = {}
    for kind, text, cpu_s in rows:
        key = (kind or "Other", shape(text))
        count, total = sums.get(key, (0, 0.0))
        sums[key] = (count + 1, total + cpu_s)
    lines = [Line(kind, text, count, total) for (kind, text), (count, total) in sums.items()]
    return sorted(lines, key=lambda line: (-line.cpu_s, line.kind, line.shape))


def shape(text: str) -> str:
    """``text`` with stage tables as ``<stage>`` and white space squeezed, cut to ``SHAPE_CHARS``."""
    squeezed = " ".join(_STAGE.sub("<stage>", text).split())
    return squeezed if len(squeezed) <= SHAPE_CHARS else squeezed[: SHAPE_CHARS - 1] + "…"
