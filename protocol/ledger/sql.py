"""The reads of the ledger (``protocol.ledger.rows``) as SQL text. Pure.

**Resolution rule for readers.** Deduplication makes a commit slot hold one row. Past the
deduplication window (``protocol.ledger.rows.DEDUP_WINDOW``) a slot could hold two: the **first claim
wins for ever** (the earliest ``event_time``, then the smallest ``claim_id``), whatever the
epochs, so a late claim can never rewrite a slot whose owner went on to publish. Every read of a slot
here applies it, so the chain of commits is always one line. A slot a checkpoint covers was decided
before that checkpoint was written: a claim stored after the first checkpoint covering its slot
never owns the slot, even once the slot's rows have expired (``slot_winner_sql``'s ``fence_ms``).

Parameters are ClickHouse query parameters (``{pipeline:String}``, ...); ``coordinator.ledger.store``
and ``coordinator.ledger.history`` run the queries.
"""

from __future__ import annotations

from protocol import naming
from protocol.ledger.rows import SELECT_COLUMNS, LedgerEvent, qualified, state_sql

#: ``after`` and ``through`` of every slot.
ALL_SLOTS: dict[str, int] = {"after": 0, "through": 2**64 - 1}


def resolved_commits_sql(database: str) -> str:
    """The COMMITTED rows of ``{pipeline:String}`` in slots ``{after:UInt64}``+1..``{through:UInt64}``
    (``ALL_SLOTS``: 0 and the largest slot), one per slot by the resolution rule, in slot order.
    The primary key bounds the read to those slots."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'COMMITTED' "
        "AND commit_seq > {after:UInt64} AND commit_seq <= {through:UInt64} "
        "ORDER BY commit_seq ASC, event_time ASC, claim_id ASC LIMIT 1 BY commit_seq"
    )


def slot_winner_sql(database: str, event: LedgerEvent) -> str:
    """The surviving row of one COMMITTED slot (``{slot:UInt64}`` = commit_seq) or EPOCH (= epoch).

    For a COMMITTED slot one more column, ``fence_ms``: when the first checkpoint covering the
    slot was written (unix ms; NULL if none covers it). A row stored after it is a late claim.
    """
    key = "commit_seq" if event is LedgerEvent.COMMITTED else "epoch"
    fence = ""
    if event is LedgerEvent.COMMITTED:
        fence = (
            f", (SELECT toUnixTimestamp64Milli(minOrNull(event_time)) FROM {qualified(database)} "
            "WHERE pipeline = {pipeline:String} AND event = 'CHECKPOINT' AND commit_seq >= {slot:UInt64}) AS fence_ms"
        )
    return (
        f"SELECT {SELECT_COLUMNS}{fence} FROM {qualified(database)} "
        f"WHERE pipeline = {{pipeline:String}} AND event = '{event.value}' AND {key} = {{slot:UInt64}} "
        "ORDER BY event_time ASC, claim_id ASC LIMIT 1"
    )


def max_epoch_sql(database: str) -> str:
    """The highest epoch of ``{pipeline:String}``: of its EPOCH claims, checkpoints and the commits
    from the latest checkpoint on (epochs only rise along the chain). Reads no old commit."""
    t = qualified(database)
    return (
        f"SELECT max(epoch) FROM {t} WHERE pipeline = {{pipeline:String}} AND (event = 'EPOCH' "
        "OR (event IN ('COMMITTED', 'CHECKPOINT') AND commit_seq >= "
        f"(SELECT max(commit_seq) FROM {t} WHERE pipeline = {{pipeline:String}} AND event = 'CHECKPOINT')))"
    )


def head_sql(database: str) -> str:
    """Per partition, the end offset of its latest commit in slots ``{after:UInt64}``+1..``{through:UInt64}``;
    every such commit shows in some group.

    One statement reads the table once, so the last slot and the offsets come from one snapshot.
    Commits without partitions land in the group ``('', 0)``; callers take ``max(seq)`` over all
    groups and ignore that one. With ``ALL_SLOTS`` this is the whole chain (how heads were read
    before checkpoints).
    """
    return (
        "SELECT topic, partition, argMax(end_offset, commit_seq) AS end_offset, max(commit_seq) AS seq "
        f"FROM ({resolved_commits_sql(database)}) "
        "LEFT ARRAY JOIN topics AS topic, partitions AS partition, end_offsets AS end_offset "
        "GROUP BY topic, partition"
    )


def committed_unpublished_sql(database: str) -> str:
    """Committed txns in slots ``{after:UInt64}``+1..``{through:UInt64}`` with a stage table (seals have
    none) and neither PUBLISHED nor LOST, in slot order. PUBLISHED and LOST rows carry their txn's
    slot, so both sides are read by the primary key (a row without a slot, 0, is read too)."""
    return (
        f"SELECT * FROM ({resolved_commits_sql(database)}) WHERE stage_table != '' AND txn NOT IN "
        f"(SELECT txn FROM {qualified(database)} WHERE pipeline = {{pipeline:String}} "
        "AND event IN ('PUBLISHED', 'LOST') AND (commit_seq > {after:UInt64} OR commit_seq = 0)) "
        "ORDER BY commit_seq"
    )


def latest_event_sql(database: str, event: LedgerEvent) -> str:
    """The newest ``event`` row of ``{pipeline:String}`` (reads only that event's rows)."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        f"WHERE pipeline = {{pipeline:String}} AND event = '{event.value}' ORDER BY event_time DESC LIMIT 1"
    )


def latest_pause_sql(database: str) -> str:
    """The newest PAUSED or RESUMED rows and pause / resume markers (``protocol.ledger.pauses``) of
    ``{pipeline:String}``, the highest slot first: whether the pipeline is paused."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND (event IN ('PAUSED', 'RESUMED') OR (event = 'COMMITTED' "
        "AND (startsWith(txn, 'pause_s') OR startsWith(txn, 'resume_s')))) "
        "ORDER BY commit_seq DESC, event_time DESC, started_at DESC LIMIT 4"
    )


def event_rows_sql(database: str, event: LedgerEvent) -> str:
    """Every ``event`` row of ``{pipeline:String}``, oldest first."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        f"WHERE pipeline = {{pipeline:String}} AND event = '{event.value}' ORDER BY event_time, claim_id"
    )


#: ``{content:String}`` of ``history_txns_sql``: every txn, only those with rows or dead letters, only the
#: empty commits (COMMITTED or PUBLISHED with neither: idle intervals and seals), or all but those.
ANY_CONTENT = ""
WITH_CONTENT = "with-content"
EMPTY_COMMITS = "empty-commits"
NO_EMPTY_COMMITS = "no-empty-commits"

_HAS_CONTENT = "(max(total_rows) > 0 OR max(dead_letters) > 0)"
#: An idle interval's commit or a seal; an offset reset (``protocol.ledger.resets``) holds no rows either
#: but is an operator's act, never folded away.
_EMPTY_COMMIT = (
    f"(state IN ('PUBLISHED', 'COMMITTED') AND NOT {_HAS_CONTENT} AND NOT startsWith(txn, '{naming.RESET_PREFIX}') "
    f"AND NOT startsWith(txn, '{naming.PAUSE_PREFIX}') AND NOT startsWith(txn, '{naming.RESUME_PREFIX}') "
    f"AND NOT startsWith(txn, '{naming.SWITCH_PREFIX}'))"
)


def history_txns_sql(database: str) -> str:
    """The latest ``{limit:UInt32}`` txns with a row stored at or after ``{since_ms:Int64}`` (unix
    ms; 0: any), newest first by their first such row, in state ``{state:String}`` ('' for any)
    and of content ``{content:String}`` (``ANY_CONTENT``, ``WITH_CONTENT``, ``EMPTY_COMMITS`` or
    ``NO_EMPTY_COMMITS``), judged by those rows; with the time of that first row (unix ms).

    A txn whose rows all lie in the window is ranked and judged exactly; one with older rows too
    ("straddling") may not be, and ``LedgerHistory.history`` checks it against all its rows.
    """
    return (
        f"SELECT txn, {state_sql()} AS state, toUnixTimestamp64Milli(min(event_time)) AS first_ms "
        f"FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND txn != '' AND event_time >= fromUnixTimestamp64Milli({since_ms:Int64}) "
        "GROUP BY txn HAVING ({state:String} = '' OR state = {state:String}) "
        f"AND ({{content:String}} = '{ANY_CONTENT}' "
        f"OR ({{content:String}} = '{WITH_CONTENT}' AND {_HAS_CONTENT}) "
        f"OR ({{content:String}} = '{EMPTY_COMMITS}' AND {_EMPTY_COMMIT}) "
        f"OR ({{content:String}} = '{NO_EMPTY_COMMITS}' AND NOT {_EMPTY_COMMIT})) "
        "ORDER BY min(event_time) DESC, txn DESC LIMIT {limit:UInt32}"
    )


def history_counts_sql(database: str) -> str:
    """How many txns ``history_txns_sql`` picks (its parameters; ``{limit:UInt32}`` the largest), and
    how many of them are seals (``protocol.naming.seal_txn``: ``e<epoch>_t0``)."""
    return f"SELECT count(), countIf(endsWith(txn, '_t0')) FROM ({history_txns_sql(database)})"


def txn_rows_sql(database: str) -> str:
    """Every row of the txns in ``{txns:Array(String)}``, oldest first."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND txn IN {txns:Array(String)} ORDER BY event_time, event"
    )


def gap_rows_sql(database: str) -> str:
    return event_rows_sql(database, LedgerEvent.GAP)
