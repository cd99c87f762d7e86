"""Which target table each committed range went to: written with the commit, read back for ``chtxn
verify --deep``. Pure.

**Writing.** Every range of a txn's ledger rows names its table (``PartitionRange.table``): the
table its topic's records were staged into in that txn, as START told the participants
(``StartCommit.stage_table_of``): the table the leader's routes give the topic, else the table of
the txn's only stage table (what a participant falls back to), else "" (nothing can have been
staged). So the ledger keeps the history of routes: a topic moved from table a to table b has its
earlier ranges in a and its later ones in b, whatever the routes say today.

**Reading rows of earlier versions** (ranges without a table, ``table_of_range``): such a row was
written by a pipeline whose ``target`` column names the tables of the txn. One table named: the
range went there (the pipeline's single ``target_table`` at that time). Several named, or none
(rows written by hand or by very early versions): the table today's routes give the topic, if the
row names it or names none; otherwise the range's table is unknown (""), and ``verify --deep``
reports it as unattributed, never as checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from protocol import routing
from protocol.ledger.rows import LedgerRow, PartitionRange


def tables_at_commit(
    routes: Sequence[routing.Route], topics: Iterable[str], txn_tables: Sequence[str]
) -> dict[str, str]:
    """Each of ``topics`` with the table its records are staged into in a txn whose stage tables are
    in ``txn_tables`` (``naming.txn_stages`` order), as the leader writes it into the ledger."""
    only = txn_tables[0] if len(txn_tables) == 1 else ""
    found = {}
    for topic in topics:
        routed = routing.tables_of(topic, routes)
        found[topic] = routed[0] if len(routed) == 1 else only
    return found


def routed_today(routes: Sequence[routing.Route], topics: Iterable[str]) -> dict[str, str]:
    """Each of ``topics`` that exactly one table's routes match, with that table (ambiguous or
    unrouted topics are left out: no table can be read from today's routes for them)."""
    found = {}
    for topic in topics:
        routed = routing.tables_of(topic, routes)
        if len(routed) == 1:
            found[topic] = routed[0]
    return found


def table_of_range(row: LedgerRow, r: PartitionRange, today: Mapping[str, str]) -> str:
    """The table range ``r`` of COMMITTED ``row`` went to; ``today`` is ``routed_today``'s map. ""
    when it cannot be told (a row of an earlier version; see the module's docstring). The Python
    twin of ``table_sql``."""
    if r.table:
        return r.table
    named = [t for t in row.target.split(",") if t]
    if len(named) == 1:
        return named[0]
    routed = today.get(r.topic, "")
    return routed if routed and (not named or routed in named) else ""


def table_sql(range_table: str, target: str, topic: str) -> str:
    """SQL of ``table_of_range`` over the columns (or aliases) ``range_table``, ``target`` and
    ``topic``, with today's map as ``{route_topics:Array(String)}`` and ``{route_tables:Array(String)}``."""
    routed = f"arrayElement({{route_tables:Array(String)}}, indexOf({{route_topics:Array(String)}}, {topic}))"
    return (
        f"multiIf({range_table} != '', {range_table}, "
        f"{target} != '' AND position({target}, ',') = 0, {target}, "
        f"{routed} != '' AND ({target} = '' OR has(splitByChar(',', {target}), {routed})), {routed}, '')"
    )


def route_parameters(today: Mapping[str, str]) -> dict[str, list[str]]:
    """``table_sql``'s parameters for ``routed_today``'s map."""
    topics = sorted(today)
    return {"route_topics": topics, "route_tables": [today[t] for t in topics]}
