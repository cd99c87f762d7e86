"""Which target table a topic's records go to (``[[route]]``, or the one-table form as one route).

A route names topics, or matches them with ``re:<regex>`` (``protocol.topic_patterns``). A topic
must go to exactly one table: matched by no route it is not a source topic; matched by routes of
two tables it is an error naming it (found at config time for named topics, when the partitions
are listed for topics only patterns match).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from protocol import topic_patterns
from protocol.errors import SetupError


class Route(Protocol):
    @property
    def topics(self) -> tuple[str, ...]: ...

    @property
    def table(self) -> str: ...


def tables_of(topic: str, routes: Sequence[Route]) -> list[str]:
    """The tables whose routes name or match ``topic``, each once, in route order."""
    found = [r.table for r in routes if topic_patterns.matching(r.topics, [topic]).count(topic)]
    return list(dict.fromkeys(found))


def table_map(topics: Iterable[str], routes: Sequence[Route]) -> dict[str, str]:
    """Each of ``topics`` (matched by some route) with its table; ``SetupError`` naming a topic
    that routes of two tables match."""
    mapped: dict[str, str] = {}
    for topic in topics:
        tables = tables_of(topic, routes)
        if len(tables) > 1:
            raise SetupError(
                f"topic {topic} matches the routes of {len(tables)} tables ({', '.join(tables)}): "
                "narrow the route patterns so that each topic goes to one table"
            )
        if tables:
            mapped[topic] = tables[0]
    return mapped
