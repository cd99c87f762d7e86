"""``chtxn verify --deep`` as SQL: each offset of a target table counted against the committed ranges
that sent it there. Pure: the SQL is text, run by ``coordinator.verify``.

**What is compared, per table T.** The *committed ranges* are those of the retained commit chain
(resolved by the first-claim rule, offset resets left out: they hold no rows), each in the table
it went to (``protocol.ledger.range_tables``), not the table today's routes name. An offset of partition
P is *expected* in T once per committed range to T that covers it (a rewinding reset makes a range
committed twice: twice), less the ranges whose txn dead-lettered it (``chtxn_dead_letters``; a
letter given without its txn makes the offset expected in none). T must hold exactly that many
rows of it, and no row of the pipeline's topics at any other offset: a row where the ledger sent
nothing is reported, whichever table it is in. The counting happens in ClickHouse (``GROUP BY
topic, partition, offset`` over the expanded ranges, the letters and T's rows): nothing but
per-partition totals and the first few offenders comes back.

**What cannot be judged** is reported apart, as expired evidence, never as a pass or a failure:

- rows below the retained chain's start (the oldest checkpoint left once ledger retention expired
  the first commits): ``expired`` rows;
- a missing row at an offset a txn may have dead-lettered, when that txn's letters are no longer
  all in ``chtxn_dead_letters`` (its TTL): ``unsure`` offsets, as long as they are no more than
  the letters gone (``coordinator.verify`` checks the bound, else it is a failure);
- committed ranges of rows of earlier versions whose table cannot be told (``range_tables``).

**Offsets that hold no record.** A ``read_committed`` consumer never sees a transaction marker or a
record of an aborted Kafka transaction, yet each takes an offset, and a committed range may span
them. Each range knows how many: its offsets, less the rows it staged, less its letters. So an
offset with no row is *skipped* (neither missing nor a pass by itself) when every range covering it
has no more offsets without a row than that; a range with more has lost rows, and the excess is
counted missing (each of its offsets without a row is named: the lost ones are among them).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from protocol import naming, shards
from protocol.dead_letters import letters as dead_letters
from protocol.ledger import range_tables, rows as ledger, sql as ledger_sql

#: Offenders listed per table (the first ones, by topic, partition and offset).
OFFENDERS_SHOWN = 10

#: An offset's verdict: as committed; short of rows where a dead letter's record expired; no row, and
#: no record as its ranges' counts allow (a transaction marker, an aborted record); more rows than
#: committed where some are committed; rows where none is; fewer rows than committed.
OK, UNSURE, SKIPPED, DUPLICATE, OUTSIDE, MISSING = "ok", "unsure", "skipped", "duplicate", "outside", "missing"
#: Verdicts that are no failure.
_FINE = f"('{OK}', '{UNSURE}', '{SKIPPED}')"
#: The coordinates a shard's rows are read as by ``sharded_target_sql``.
_SHARD_STRUCTURE = "_topic String, _partition Int64, _offset Int64"

#: Outcomes of a table and of the whole check.
PASSED, FAILED, EXPIRED = "OK", "FAILED", "EXPIRED"


def ledger_ranges_sql(database: str) -> str:
    """The committed ranges of ``{pipeline:String}`` in slots ``{after:UInt64}``+1..``{through:UInt64}``
    with rows (``lo < hi``), offset resets left out: (txn, topic, partition, lo, hi, n, to_table, d),
    ``to_table`` by ``range_tables.table_sql`` with its route parameters, ``d`` the txn's dead letters
    as its COMMITTED row counts them."""
    to_table = range_tables.table_sql("range_table", "target", "topic")
    return (
        f"SELECT txn, topic, partition, lo, hi, n, {to_table} AS to_table, dead_letters AS d "
        f"FROM ({ledger_sql.resolved_commits_sql(database)}) "
        "ARRAY JOIN topics AS topic, partitions AS partition, start_offsets AS lo, end_offsets AS hi, rows AS n, "
        "arrayResize(tables, length(topics)) AS range_table "
        f"WHERE NOT startsWith(txn, '{naming.RESET_PREFIX}') AND hi > lo"
    )


def given_ranges_sql(ranges: Sequence[tuple[str, str, int, int, int, int, str]]) -> str:
    """``ledger_ranges_sql``'s columns from ``ranges`` given in Python, (txn, topic, partition, lo, hi,
    rows, table) each, written into the SQL text (``d`` is 0: no letter is counted)."""
    return _literal_rows(
        "txn, topic, partition, lo, hi, n, to_table, d",
        "String, String, Int32, Int64, Int64, UInt64, String, UInt64",
        [(*r, 0) for r in ranges],
    )


def ledger_letters_sql(database: str, ranges: str) -> str:
    """Dead letters of ``{pipeline:String}`` in ``chtxn_dead_letters`` inside the committed ranges of their
    txn (``ranges``: a ranges query), each once: (txn, topic, partition, o, any_txn = 0)."""
    return (
        "SELECT DISTINCT l.txn AS txn, l.topic AS topic, l.partition AS partition, l.offset AS o, "
        f"toUInt8(0) AS any_txn FROM {dead_letters.qualified(database)} AS l "
        f"INNER JOIN ({ranges}) AS r ON l.txn = r.txn AND l.topic = r.topic AND l.partition = r.partition "
        "WHERE l.pipeline = {pipeline:String} AND l.offset >= r.lo AND l.offset < r.hi"
    )


def given_letters_sql(letters: Sequence[tuple[str, int, int]]) -> str:
    """Dead-lettered offsets given without their txn, (topic, partition, offset) each: such an offset is
    expected in no table (``any_txn = 1``)."""
    return _literal_rows(
        "txn, topic, partition, o, any_txn", "String, String, Int32, Int64, UInt8", [("", *x, 1) for x in letters]
    )


def ledger_floors_sql(database: str) -> str:
    """Per partition, the first offset the retained chain checks: the end offsets of the checkpoint at
    slot ``{after:UInt64}`` (none when it is 0), (topic, partition, floor)."""
    return (
        "SELECT topic, partition, floor FROM (SELECT topics, partitions, end_offsets "
        f"FROM {ledger.qualified(database)} WHERE pipeline = {{pipeline:String}} AND event = 'CHECKPOINT' "
        "AND commit_seq = {after:UInt64} ORDER BY event_time, claim_id LIMIT 1) "
        "ARRAY JOIN topics AS topic, partitions AS partition, end_offsets AS floor"
    )


def given_floors_sql(floors: Sequence[tuple[str, int, int]]) -> str:
    """``ledger_floors_sql``'s columns from (topic, partition, floor) given in Python."""
    return _literal_rows("topic, partition, floor", "String, Int32, Int64", floors)


def letters_per_txn_sql(letters: str) -> str:
    """(txn, letters found) of a letters query: compared with each COMMITTED row's ``dead_letters``."""
    return f"SELECT txn, count() AS found FROM ({letters}) GROUP BY txn"


def unsure_txns_sql(ranges: str, letters: str) -> str:
    """The txns whose COMMITTED row counts more dead letters than the letters query finds of them:
    their letters' records have expired (``chtxn_dead_letters``' TTL)."""
    return (
        f"SELECT c.txn FROM (SELECT txn, any(d) AS counted FROM ({ranges}) GROUP BY txn HAVING counted > 0) AS c "
        f"LEFT JOIN ({letters_per_txn_sql(letters)}) AS f ON c.txn = f.txn WHERE f.found < c.counted"
    )


def range_tables_sql(ranges: str) -> str:
    """(to_table, ranges, rows) of a ranges query: the tables the ledger sent rows to ("" unknown)."""
    return f"SELECT to_table, count(), sum(n) FROM ({ranges}) GROUP BY to_table ORDER BY to_table"


def sql_string(text: str) -> str:
    """``text`` as a ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _literal_rows(names: str, types: str, rows: Sequence[tuple]) -> str:
    """A query of ``rows`` written into the SQL text (no parameters: a long list would not fit in a URL)."""
    values = ", ".join(
        "(" + ", ".join(sql_string(v) if isinstance(v, str) else str(int(v)) for v in r) + ")" for r in rows
    )
    columns = ", ".join(f"x.{i + 1} AS {name.strip()}" for i, name in enumerate(names.split(",")))
    return f"SELECT {columns} FROM (SELECT arrayJoin(CAST([{values}], 'Array(Tuple({types}))')) AS x)"


def _per_offset(ranges: str, letters: str, floors: str, target: str) -> str:
    """Per offset of table ``{table:String}``: covers, expected, rows (``n``), unsure, expired, dead-lettered,
    skippable, the rows its ranges lack beyond what they skip (``excess``, on a range's first offset), and
    the verdict. ``target`` is the table, quoted; ``{topics:Array(String)}`` the topics whose rows in it
    are checked (``{all_topics:UInt8}`` = 1: every row); rows below their partition's floor
    (``floors``) are expired."""
    mine = f"SELECT txn, topic, partition FROM ({ranges}) WHERE to_table = {{table:String}}"
    unsure = f"toInt64(txn IN ({unsure_txns_sql(ranges, letters)}))"
    counted = (
        f"SELECT topic, partition, arrayJoin(range(lo, hi)) AS o, toInt64(1) AS x_covers, toInt64(0) AS x_lettered, "
        f"toInt64(0) AS x_any, {unsure} AS x_unsure, toInt64(0) AS x_n, toInt64(0) AS x_expired, '' AS x_txn "
        f"FROM ({ranges}) WHERE to_table = {{table:String}} "
        "UNION ALL "
        f"SELECT topic, partition, o, toInt64(0), toInt64(any_txn = 0), toInt64(any_txn), -{unsure}, "
        f"toInt64(0), toInt64(0), txn FROM ({letters}) WHERE any_txn = 1 OR (txn, topic, partition) IN ({mine}) "
        "UNION ALL "
        "SELECT toString(t._topic), toInt64(t._partition), toInt64(t._offset), toInt64(0), toInt64(0), toInt64(0), "
        "toInt64(0), "
        "toInt64(t._offset >= f.floor), toInt64(t._offset < f.floor), '' "
        f"FROM {target} AS t LEFT JOIN ({floors}) AS f ON t._topic = f.topic AND t._partition = f.partition "
        "WHERE {all_topics:UInt8} = 1 OR has({topics:Array(String)}, t._topic)"
    )
    grouped = (
        "SELECT topic, partition, o, sum(x_covers) AS covers, "
        "if(max(x_any) > 0, 0, sum(x_covers) - sum(x_lettered)) AS expected, sum(x_n) AS n, "
        "sum(x_unsure) AS unsure, sum(x_expired) AS expired, toUInt8(sum(x_lettered) + max(x_any) > 0) AS lettered, "
        "max(x_any) AS any_letter, groupUniqArrayIf(x_txn, x_lettered > 0) AS letter_txns "
        f"FROM ({counted}) GROUP BY topic, partition, o"
    )
    judged = (
        "SELECT g.*, s.skippable AS skippable, s.excess AS excess "
        f"FROM ({grouped}) AS g LEFT JOIN ({_skips(ranges, grouped, unsure)}) AS s "
        "ON g.topic = s.topic AND g.partition = s.partition AND g.o = s.o"
    )
    verdict = (
        f"multiIf(n = expected, '{OK}', n < expected AND n >= expected - unsure, '{UNSURE}', "
        f"n = 0 AND skippable = 1, '{SKIPPED}', n > expected AND expected > 0, '{DUPLICATE}', n > expected, "
        f"'{OUTSIDE}', '{MISSING}')"
    )
    return f"SELECT *, {verdict} AS verdict FROM ({judged})"


def _skips(ranges: str, grouped: str, unsure: str) -> str:
    """Per offset covered by a range to ``{table:String}``: ``skippable`` (1 when every range covering
    it has no more offsets without a row than it holds offsets that are no records: its offsets, less
    its rows, less its letters) and ``excess`` (on each range's first offset: the offsets without a
    row beyond that, in ranges of txns whose letters are all there)."""
    here = "(g.any_letter > 0 OR has(g.letter_txns, r.txn))"  # dead-lettered by the range's txn
    covered = (
        "SELECT r.topic AS topic, r.partition AS partition, r.o AS o, r.lo AS lo, r.unsure AS range_unsure, "
        f"toInt64(r.hi - r.lo) - toInt64(r.staged) - sum(toInt64({here})) OVER w AS skips, "
        f"sum(toInt64(g.n = 0 AND g.expected > 0 AND NOT {here})) OVER w AS empties "
        f"FROM (SELECT txn, topic, partition, lo, hi, n AS staged, {unsure} AS unsure, "
        f"arrayJoin(range(lo, hi)) AS o FROM ({ranges}) WHERE to_table = {{table:String}}) AS r "
        f"INNER JOIN ({grouped}) AS g ON g.topic = r.topic AND g.partition = r.partition AND g.o = r.o "
        "WINDOW w AS (PARTITION BY r.txn, r.topic, r.partition, r.lo)"
    )
    return (
        "SELECT topic, partition, o, toUInt8(min(empties <= skips)) AS skippable, "
        "sum(if(o = lo AND range_unsure = 0, greatest(empties - skips, 0), 0)) AS excess "
        f"FROM ({covered}) GROUP BY topic, partition, o"
    )


def partitions_sql(ranges: str, letters: str, floors: str, target: str) -> str:
    """Per partition of the table: committed from / to, expected (distinct offsets holding records), rows,
    distinct offsets, duplicates, outside, missing, unsure, replayed, dead letters, expired rows,
    offenders, skipped (offsets that hold no record)."""
    return (
        "SELECT topic, partition, if(countIf(covers > 0) = 0, 0, minIf(o, covers > 0)), "
        f"if(countIf(covers > 0) = 0, 0, maxIf(o, covers > 0) + 1), countIf(expected > 0 AND verdict != '{SKIPPED}'), "
        f"sum(n), countIf(n > 0), sumIf(n - expected, verdict = '{DUPLICATE}'), sumIf(n, verdict = '{OUTSIDE}'), "
        f"sumIf(expected - n, verdict = '{MISSING}' AND n > 0) + sum(excess), "
        f"sumIf(expected - n, verdict = '{UNSURE}'), sumIf(greatest(expected - 1, 0), verdict != '{SKIPPED}'), "
        f"countIf(covers > 0 AND lettered > 0), sum(expired), countIf(verdict NOT IN {_FINE}), "
        f"countIf(verdict = '{SKIPPED}') "
        f"FROM ({_per_offset(ranges, letters, floors, target)}) GROUP BY topic, partition ORDER BY topic, partition"
    )


def offenders_sql(ranges: str, letters: str, floors: str, target: str) -> str:
    """The first ``{limit:UInt32}`` offsets of the table whose rows differ from what was committed:
    (topic, partition, offset, expected, rows, verdict)."""
    return (
        f"SELECT topic, partition, o, expected, n, verdict FROM ({_per_offset(ranges, letters, floors, target)}) "
        f"WHERE verdict NOT IN {_FINE} ORDER BY topic, partition, o LIMIT {{limit:UInt32}}"
    )


def outcome(failed: bool, expired: bool) -> str:
    """A table's or the whole check's outcome: FAILED over EXPIRED (evidence gone, nothing wrong
    found in the rest) over OK."""
    return FAILED if failed else EXPIRED if expired else PASSED


def sharded_target_sql(database: str, table: str, shard_urls: Sequence[str], *, here: str, login: str = "") -> str:
    """The rows' coordinates of ``table`` on every shard (``clickhouse.shards``), as one table for the
    checks above, run on the server at ``here`` (the ledger's): its own table read directly, every
    other shard's through ClickHouse's ``url()`` table function over that shard's HTTP interface, so
    the offsets of all shards are counted together in ClickHouse. ``login``: ``headers(...)`` for
    ``url()`` ("" for none)."""
    select = (
        "SELECT toString(_topic) AS _topic, toInt64(_partition) AS _partition, toInt64(_offset) AS _offset "
        f"FROM `{database}`.`{table}`"
    )
    parts = []
    for url in shard_urls:
        if shards.address(url) == shards.address(here):
            parts.append(select)
            continue
        query = quote(f"{select} FORMAT Native", safe="")
        address = sql_string(url.rstrip("/") + f"/?query={query}")
        args = f"{address}, 'Native', '{_SHARD_STRUCTURE}'"
        parts.append(f"SELECT _topic, _partition, _offset FROM url({args}{', ' + login if login else ''})")
    return "(" + " UNION ALL ".join(parts) + ")"
