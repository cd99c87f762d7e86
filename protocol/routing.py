"""Which target table a topic's records go to (``[[route]]``, or the one-table form as one route).

A route names topics, or matches them with ``re:<regex>`` (``protocol.topic_patterns``). A topic
must go to exactly one table: matched by no route it is not a source topic; matched by routes of
two tables it is an error naming it: at config time for named topics; a topic only patterns match
is held when the partitions are listed (``route``: none of its records are read, the other topics
flow) and reported by the leader's log, its metric and ``chtxn status``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

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


class Routed(NamedTuple):
    """Topics split by their routes: ``tables`` maps each topic one table's routes name or match to that
    table; ``ambiguous`` maps each topic that routes of several tables match to those tables. A topic
    no route matches is in neither."""

    tables: dict[str, str]
    ambiguous: dict[str, tuple[str, ...]]


def route(topics: Iterable[str], routes: Sequence[Route]) -> Routed:
    """Each of ``topics`` with its table, or with the tables whose routes all match it; never raises."""
    routed = Routed({}, {})
    for topic in topics:
        tables = tables_of(topic, routes)
        if len(tables) > 1:
            routed.ambiguous[topic] = tuple(tables)
        elif tables:
            routed.tables[topic] = tables[0]
    return routed


def ambiguity(topic: str, tables: Sequence[str]) -> str:
    """What is wrong with a topic the routes of several tables match, and what to do."""
    return (
        f"topic {topic} matches the routes of {len(tables)} tables ({', '.join(tables)}): "
        "narrow the route patterns so that each topic goes to one table"
    )


def table_map(topics: Iterable[str], routes: Sequence[Route]) -> dict[str, str]:
    """Each of ``topics`` (matched by some route) with its table; ``SetupError`` naming a topic
    that routes of two tables match."""
    routed = route(topics, routes)
    for topic, tables in routed.ambiguous.items():
        raise SetupError(ambiguity(topic, tables))
    return routed.tables
