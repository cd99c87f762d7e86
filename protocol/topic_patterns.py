"""Source topics named or matched: ``pipeline.topics`` entries are topic names, or regular expressions
after ``re:`` (``"re:orders-eu-.*"``), which must match a topic's whole name, as Kafka Connect's
``topics.regex`` does.

A named topic must exist; a pattern matches whatever topics exist when the partitions are listed,
so a topic created later that matches is picked up while running, as a new partition is. Internal
topics (names starting with ``__``) and the pipeline's control and dead-letter topics never match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

PATTERN_PREFIX = "re:"


def is_pattern(spec: str) -> bool:
    return spec.startswith(PATTERN_PREFIX)


def compile_pattern(spec: str) -> re.Pattern[str]:
    """The regular expression of ``re:<regex>``; ``re.error`` when it does not compile."""
    return re.compile(spec.removeprefix(PATTERN_PREFIX))


def names(specs: Sequence[str]) -> list[str]:
    """The topics ``specs`` name (patterns left out)."""
    return [s for s in specs if not is_pattern(s)]


def matching(specs: Sequence[str], topics: Iterable[str], *, exclude: Iterable[str] = ()) -> list[str]:
    """The topics among ``topics`` that a pattern of ``specs`` matches, sorted, never an internal
    topic or one of ``exclude``; a named topic counts whether it exists or not (the caller checks)."""
    patterns = [compile_pattern(s) for s in specs if is_pattern(s)]
    left_out = set(exclude)
    matched = {
        t for t in topics if not t.startswith("__") and t not in left_out and any(p.fullmatch(t) for p in patterns)
    }
    return sorted(matched | set(names(specs)))
