"""The ledger as people read it: the txn list, the retained chain and its audit.

``LedgerHistory`` is a ``LedgerStore`` (claims, writes and the reads a leader needs) with the
reads of ``chtxn txn``, ``chtxn status``, ``chtxn verify`` and the demo on top; a leader never
needs them. Like every ledger read, they resolve a duplicated slot by its first claim.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.ledger.store import LedgerStore
from protocol import naming
from protocol.ledger import checkpoint as ledger_checkpoint, rows as ledger, sql as ledger_sql
from protocol.ledger.rows import LedgerEvent, LedgerRow
from protocol.ledger.sql import ALL_SLOTS
from protocol.ledger.view import TxnSummary, audit, summarize

#: Extra txns a txn-list window query returns, for txns with rows older than the window.
_SLACK = 8
#: Txn-list windows start at the 1st, 4th, 16th, ... latest checkpoint, or an hour, a day, a week
#: ago, narrowest first, and then take everything.
_WINDOW_STEPS = (0, 3, 15, 63, 255, 1023)
_WINDOW_AGES_S = (3600.0, 86400.0, 7 * 86400.0)


def has_content(s: TxnSummary) -> bool:
    """The txn holds rows or dead letters."""
    return s.total_rows > 0 or s.dead_letters > 0


def is_empty_commit(s: TxnSummary) -> bool:
    """The txn committed neither rows nor dead letters: an idle interval or a seal (not an offset reset,
    a pause or a resume)."""
    return s.state in ("PUBLISHED", "COMMITTED") and not has_content(s) and not naming.is_control_txn(s.txn)


#: The Python twins of ``history_txns_sql``'s content filters.
_CONTENT_TESTS: dict[str, Callable[[TxnSummary], bool]] = {
    ledger_sql.ANY_CONTENT: lambda s: True,
    ledger_sql.WITH_CONTENT: has_content,
    ledger_sql.EMPTY_COMMITS: is_empty_commit,
    ledger_sql.NO_EMPTY_COMMITS: lambda s: not is_empty_commit(s),
}


class LedgerHistory(LedgerStore):
    """The ledger of one pipeline in ``database``, with its history reads. The constructor does no I/O."""

    def history(self, limit: int = 20, state: str | None = None) -> list[TxnSummary]:
        """The latest ``limit`` txns, newest first (by their first row), optionally only those in
        ``state``: ``latest_txns`` without its other filters."""
        return self.latest_txns(limit, state)

    def latest_txns(
        self,
        limit: int = 20,
        state: str | None = None,
        *,
        since: float = 0.0,
        content: str = ledger_sql.ANY_CONTENT,
    ) -> list[TxnSummary]:
        """The latest ``limit`` txns, newest first (by their first row), optionally only those in
        ``state``, first stored at or after ``since`` (unix seconds; 0: any time) and of ``content``
        (``ledger_sql.ANY_CONTENT``, ``WITH_CONTENT``: rows or dead letters, ``EMPTY_COMMITS``:
        committed with neither, or ``NO_EMPTY_COMMITS``).

        Reads a window of recent rows, from the latest checkpoint on, and widens it (the 4th,
        16th, ... latest checkpoint, an hour, a day, a week, then everything from ``since``) only
        while it holds fewer than ``limit`` txns whose rows all lie inside it: those are ranked and
        judged exactly.
        """
        if state and state.upper() not in ledger.STATE_PRECEDENCE:
            raise ValueError(f"unknown txn state {state!r}: use one of {', '.join(ledger.STATE_PRECEDENCE)}")
        if content not in _CONTENT_TESTS:
            raise ValueError(f"unknown txn content filter {content!r}")
        if limit <= 0:
            return []
        floor_ms = max(0, round(since * 1000))
        for since_ms in [*(w for w in self._windows() if w > floor_ms), floor_ms]:
            picked = self._query(
                "list txns",
                ledger_sql.history_txns_sql(self._database),
                limit=limit + _SLACK,
                state=(state or "").upper(),
                since_ms=since_ms,
                content=content,
            )
            grouped = self._rows_of([r[0] for r in picked])
            inside = [
                t
                for t, _, _ in picked
                if t in grouped and min(round(r.event_time * 1000) for r in grouped[t]) >= since_ms
            ]
            if len(inside) >= limit or since_ms == floor_ms:
                summaries = (summarize(grouped[t]) for t in inside)
                return [s for s in summaries if _CONTENT_TESTS[content](s)][:limit]
        raise AssertionError("the last window takes every row")

    def count_txns(
        self, state: str | None = None, *, since: float = 0.0, content: str = ledger_sql.ANY_CONTENT
    ) -> tuple[int, int]:
        """(txns, seals among them) with a row stored at or after ``since`` (unix seconds), in
        ``state`` and of ``content`` as ``history`` takes them, each judged by those rows only."""
        sql = ledger_sql.history_counts_sql(self._database)
        since_ms = max(0, round(since * 1000))
        [(txns, seals)] = self._query(
            "count txns", sql, limit=2**32 - 1, state=(state or "").upper(), since_ms=since_ms, content=content
        )
        return int(txns), int(seals)

    def last_abort(self) -> LedgerRow | None:
        """The newest ABORTED row (reads only ABORTED rows)."""
        rows = self._query("read the last abort", ledger_sql.latest_event_sql(self._database, LedgerEvent.ABORTED))
        return ledger.from_result_row(rows[0]) if rows else None

    def audit(self) -> list[str]:
        """Anomalies of the commit chain per partition (overlap, backward, gap), checkpoints that
        disagree with it, and committed txns lost before publish; empty if sound.

        When the first slots have expired, the chain is checked from the oldest checkpoint left."""
        start, commits, checkpoints = self.retained_chain()
        return audit(commits, self.gaps(), self.lost(), start=start, checkpoints=checkpoints)

    def retained_chain(self) -> tuple[LedgerRow | None, list[LedgerRow], list[LedgerRow]]:
        """(start, commits, checkpoints): the checkpoint the retained chain continues from (None
        while slot 1 is retained), the resolved commits after it, and every retained checkpoint."""
        commits = self.commits()
        checkpoints = self.checkpoints()
        if checkpoints and (not commits or commits[0].commit_seq > 1):
            start = checkpoints[0]
            return start, [c for c in commits if c.commit_seq > start.commit_seq], checkpoints
        return None, commits, checkpoints

    def commits(self) -> list[LedgerRow]:
        """The retained chain: one resolved COMMITTED row per slot, in slot order."""
        sql = ledger_sql.resolved_commits_sql(self._database)
        return [ledger.from_result_row(r) for r in self._query("read the commits", sql, **ALL_SLOTS)]

    def checkpoints(self) -> list[LedgerRow]:
        """Every retained checkpoint, oldest first."""
        sql = ledger_checkpoint.checkpoints_sql(self._database, newest_first=False)
        return [ledger.from_result_row(r) for r in self._query("read the checkpoints", sql, limit=2**32 - 1)]

    def gaps(self) -> list[LedgerRow]:
        """Every GAP row of the pipeline, oldest first."""
        return [ledger.from_result_row(r) for r in self._query("read gaps", ledger_sql.gap_rows_sql(self._database))]

    def lost(self) -> list[LedgerRow]:
        """Committed txns whose rows could not be published (stage table gone): alarms."""
        sql = ledger_sql.event_rows_sql(self._database, LedgerEvent.LOST)
        return [ledger.from_result_row(r) for r in self._query("read lost txns", sql)]

    # -- plumbing -----------------------------------------------------------------------------

    def _windows(self) -> list[int]:
        """Lower bounds (unix ms) of the txn-list windows, narrowest first; the last is 0 (all rows)."""
        sql = ledger_checkpoint.checkpoint_times_sql(self._database)
        times = [int(r[0]) for r in self._query("read checkpoint times", sql, limit=_WINDOW_STEPS[-1] + 1)]
        now_ms = self._wall_clock() * 1000
        bounds = {times[i] for i in _WINDOW_STEPS if i < len(times)} | {
            int(now_ms - age * 1000) for age in _WINDOW_AGES_S
        }
        return [*sorted(bounds, reverse=True), 0]
