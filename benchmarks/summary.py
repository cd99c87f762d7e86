"""Medians and spreads over repetitions, and the JSON document of one ``make bench`` run. Pure.

A repetition is a flat dict of figures (``benchmarks.bench.repetition``): numbers, ``None``
where a figure was not measured (ceilings skipped, no paced phase), and nested dicts of details
(CPU by component, abort reasons) that are kept raw but not summarised.

The document (``assemble``) holds, besides the raw repetitions:

- ``summary``: every numeric figure as ``{"median", "min", "max", "n"}`` over the repetitions
  that measured it (``n`` of them); ``None`` figures are left out, and a figure no repetition
  measured has a median of ``None``;
- each figure of ``HEADLINE`` again at the top level, as its median, so a reader (or ``jq``)
  finds ``ratio_vs_plain`` at once;
- ``git`` (commit, dirty), ``machine``, ``settings``, ``started_at`` and ``wall_s`` as given.

A ratio's median is the median of the per-repetition ratios, not the ratio of two medians.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import TypeGuard, overload

#: Bumped when a field changes meaning or goes away.
SCHEMA = 1

#: The figures repeated at the top level of the document, as medians.
HEADLINE: tuple[str, ...] = (
    "ratio_vs_plain",
    "chtxn_rows_per_s",
    "plain_rows_per_s",
    "insert_ceiling_rows_per_s",
    "commit_p50_ms",
    "commit_p95_ms",
    "read_share",
    "freshness_p50_ms",
    "freshness_p99_ms",
    "paced_commit_p50_ms",
    "paced_commit_p95_ms",
    "aborts",
    "cpu_s_per_100k_rows_chtxn",
    "cpu_s_per_100k_rows_plain",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 <= q <= 1) of ``values`` (any order); None if empty."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile lies in [0, 1], got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measured(value: object) -> TypeGuard[float]:
    """True for a number that was measured: not None, not a bool, not NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def spread(values: Sequence[object]) -> dict[str, float | int | None]:
    """``{"median", "min", "max", "n"}`` of the measured ``values``; the others are skipped."""
    numbers = [v for v in values if measured(v)]
    if not numbers:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(numbers), "min": min(numbers), "max": max(numbers), "n": len(numbers)}


def summarize(repetitions: Sequence[Mapping[str, object]]) -> dict[str, dict[str, float | int | None]]:
    """The spread of every figure that is a number or None in every repetition, in first-seen order."""
    names: dict[str, None] = {}
    for rep in repetitions:
        names.update(dict.fromkeys(rep))
    return {
        name: spread([rep.get(name) for rep in repetitions])
        for name in names
        if all(_scalar(rep.get(name)) for rep in repetitions)
    }


def _scalar(value: object) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def assemble(
    repetitions: Sequence[Mapping[str, object]],
    *,
    settings: Mapping[str, object],
    git: Mapping[str, object],
    machine: Mapping[str, object],
    started_at: str,
    wall_s: float,
) -> dict[str, object]:
    """The JSON document of one run; every NaN in the repetitions becomes None (JSON has no NaN)."""
    if not repetitions:
        raise ValueError("a benchmark document needs at least one repetition")
    raw = [_no_nan(dict(rep)) for rep in repetitions]
    summary = summarize(raw)
    document: dict[str, object] = {
        "schema": SCHEMA,
        "started_at": started_at,
        "wall_s": wall_s,
        "git": dict(git),
        "machine": dict(machine),
        "settings": dict(settings),
        "repetitions_run": len(raw),
    }
    for name in HEADLINE:
        document[name] = summary.get(name, {}).get("median")
    document["summary"] = summary
    document["repetitions"] = raw
    return document


@overload
def _no_nan(value: dict[str, object]) -> dict[str, object]: ...
@overload
def _no_nan(value: object) -> object: ...
def _no_nan(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value
