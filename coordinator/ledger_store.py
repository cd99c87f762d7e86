"""Reads and writes of the ledger table (``protocol.ledger``) through a clickhouse-connect client.

Guarantees:
- Every insert is synchronous (``async_insert = 0``) and carries a deduplication token, so a
  retried insert stores its row once.
- ``claim_commit`` / ``claim_epoch`` are compare-and-set: of any number of racing claimers
  of one slot, at most one gets True (ClickHouse keeps one row per token; each claimer reads
  the slot back and wins only if the surviving row carries its own random ``claim_id``).
- Reads resolve a duplicated slot by the first claim (``protocol.ledger``), so every reader
  sees the same single chain of commits, and a late claim never rewrites it.
- ``seal`` lets a new leader fence every older one out of the next commit slot.
- On replicated ClickHouse (``replicated=True``) inserts wait for a quorum and reads see every
  quorum insert (``insert_quorum``, ``select_sequential_consistency``).
Calls retry retryable ClickHouse errors and then raise ``protocol.errors.ClickHouseError``.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from clients.clickhouse import retrying
from protocol import dead_letters, ledger, naming
from protocol.ledger import LedgerEvent, LedgerRow
from protocol.ledger_view import TxnSummary, audit, summarize
from protocol.messages import TopicPartition


class LedgerStore:
    """The ledger of one pipeline in ``database``. The constructor does no I/O."""

    def __init__(
        self,
        client: Any,
        database: str,
        pipeline: str,
        *,
        replicated: bool = False,
        retries: int = 8,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._database = database
        self._pipeline = pipeline
        self._replicated = replicated
        self._retries = retries
        self._sleep = sleep
        self._read_settings: dict[str, Any] = {"select_sequential_consistency": 1} if replicated else {}

    @property
    def table(self) -> str:
        return ledger.qualified(self._database)

    @property
    def pipeline(self) -> str:
        return self._pipeline

    # -- set-up -------------------------------------------------------------------------------

    def ensure_tables(self) -> bool:
        """Create the ledger table and the dead-letter table if missing; True if this call created the ledger."""
        self._retry("create the dead-letter table")(
            self._client.command, dead_letters.create_table_sql(self._database, replicated=self._replicated))
        exists = self._retry("check the ledger table")(self._client.command, f"EXISTS TABLE {self.table}")
        if int(exists) == 1:
            return False
        ddl = ledger.create_table_sql(self._database, replicated=self._replicated)
        self._retry("create the ledger table")(self._client.command, ddl)
        return True

    # -- writes -------------------------------------------------------------------------------

    def append(self, row: LedgerRow) -> None:
        """Append a STARTED, PUBLISHED, ABORTED, LOST or GAP row (a retried append is stored once;
        a GAP is stored once per skipped range, whoever records it)."""
        if row.event in (LedgerEvent.COMMITTED, LedgerEvent.EPOCH, LedgerEvent.INITIAL):
            raise ValueError(f"{row.event.value} rows are claimed, not appended")
        if row.event is LedgerEvent.GAP and len(row.ranges) == 1:
            g = row.ranges[0]
            token = naming.gap_token(self._pipeline, g.topic, g.partition, g.start, g.end)
        else:
            digest = hashlib.sha256(msgspec.msgpack.encode(row)).hexdigest()[:16]
            token = f"{self._pipeline}/{row.event.value.lower()}/{row.txn}/{digest}"
        self._insert(row, token, f"append {row.event.value} of txn {row.txn} to the ledger")

    def seal(self, epoch: int, coordinator: str, head_seq: int) -> bool:
        """Claim slot ``head_seq + 1`` with an empty commit of ``epoch``; True if the seal is ours.

        A new leader seals before it drops or publishes any stage table: an older leader's late
        claim of that slot then loses, so nothing it acknowledges can have been cleaned up. False
        means some commit landed in the slot first: read the head again, roll it forward, seal again.
        """
        row = LedgerRow(
            pipeline=self._pipeline, txn=naming.seal_txn(epoch), event=LedgerEvent.COMMITTED, epoch=epoch,
            commit_seq=head_seq + 1, coordinator=coordinator, reason="seal: a new leader fences older ones",
        )
        return self.claim_commit(row)

    def claim_initial(self, tp: TopicPartition, offset: int, *, epoch: int, coordinator: str) -> int:
        """Fix where never-committed ``tp`` starts; returns the offset that won (the first claim)."""
        row = LedgerRow(
            pipeline=self._pipeline, txn="", event=LedgerEvent.INITIAL, epoch=epoch, coordinator=coordinator,
            ranges=(ledger.PartitionRange(topic=tp.topic, partition=tp.partition, start=offset, end=offset),),
        )
        token = naming.initial_token(self._pipeline, tp.topic, tp.partition)
        self._insert(row, token, f"record the initial offset of {tp.topic}-{tp.partition}")
        return self.initial_offsets().get(tp, offset)

    def claim_commit(self, row: LedgerRow) -> bool:
        """The commit point: claim slot ``row.commit_seq`` for ``row``; True if it is ours.

        False means another leader owns the slot: step down. A ``ClickHouseError`` leaves the
        outcome unknown: claiming the same row again (same ``claim_id``) is safe and answers it,
        as does ``commit_at(seq)``. A row without ``claim_id`` gets a fresh one, so it cannot
        be told apart from another claimer's if claimed twice.
        """
        if row.event is not LedgerEvent.COMMITTED or row.commit_seq < 1:
            raise ValueError(f"claim_commit needs a COMMITTED row with commit_seq >= 1, got {row.event.value}/{row.commit_seq}")
        mine = msgspec.structs.replace(row, pipeline=self._pipeline, claim_id=row.claim_id or uuid.uuid4().hex)
        self._insert(mine, naming.commit_token(self._pipeline, row.commit_seq), f"claim commit slot {row.commit_seq}")
        winner = self.commit_at(row.commit_seq)
        return (
            winner is not None
            and winner.claim_id == mine.claim_id
            and (winner.txn, winner.epoch, winner.coordinator) == (row.txn, row.epoch, row.coordinator)
        )

    def claim_epoch(self, epoch: int, coordinator: str, claim_id: str = "") -> bool:
        """Claim leadership generation ``epoch`` for ``coordinator``; True if it is ours.

        Pass the same ``claim_id`` to repeat a claim whose outcome a ``ClickHouseError`` left unknown.
        """
        if epoch < 1:
            raise ValueError(f"epochs start at 1, got {epoch}")
        mine = LedgerRow(
            pipeline=self._pipeline, txn="", event=LedgerEvent.EPOCH, epoch=epoch,
            coordinator=coordinator, claim_id=claim_id or uuid.uuid4().hex,
        )
        self._insert(mine, naming.epoch_token(self._pipeline, epoch), f"claim epoch {epoch}")
        winner = self._slot_winner(LedgerEvent.EPOCH, epoch)
        return winner is not None and winner.claim_id == mine.claim_id

    # -- reads --------------------------------------------------------------------------------

    def initial_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the start offset first recorded for it (INITIAL rows; first claim wins)."""
        chosen: dict[TopicPartition, int] = {}
        for r in self._query("read initial offsets", ledger.event_rows_sql(self._database, LedgerEvent.INITIAL)):
            for g in ledger.from_result_row(r).ranges:
                chosen.setdefault(g.tp, g.start)
        return chosen

    def gaps(self) -> list[LedgerRow]:
        """Every GAP row of the pipeline, oldest first."""
        return [ledger.from_result_row(r) for r in self._query("read gaps", ledger.gap_rows_sql(self._database))]

    def lost(self) -> list[LedgerRow]:
        """Committed txns whose rows could not be published (stage table gone): alarms."""
        sql = ledger.event_rows_sql(self._database, LedgerEvent.LOST)
        return [ledger.from_result_row(r) for r in self._query("read lost txns", sql)]

    def commit_at(self, commit_seq: int) -> LedgerRow | None:
        """The COMMITTED row owning slot ``commit_seq``, or None if the slot is free."""
        return self._slot_winner(LedgerEvent.COMMITTED, commit_seq)

    def epoch_owner(self, epoch: int) -> str | None:
        """The coordinator that claimed ``epoch``, or None if nobody did."""
        winner = self._slot_winner(LedgerEvent.EPOCH, epoch)
        return winner.coordinator if winner else None

    def max_epoch(self) -> int:
        """The highest epoch in any row of this pipeline, 0 when there is none."""
        rows = self._query("read the highest epoch", ledger.max_epoch_sql(self._database))
        return int(rows[0][0]) if rows else 0

    def head(self) -> tuple[int, dict[TopicPartition, int]]:
        """The last commit slot (0 if none) and, per partition ever committed, its committed end offset."""
        rows = self._query("read the ledger head", ledger.head_sql(self._database))
        seq = max((int(r[3]) for r in rows), default=0)
        offsets = {TopicPartition(topic=t, partition=int(p)): int(e) for t, p, e, _ in rows if t}
        return seq, offsets

    def commits(self) -> list[LedgerRow]:
        """The chain: one resolved COMMITTED row per slot, in slot order."""
        sql = ledger.resolved_commits_sql(self._database)
        return [ledger.from_result_row(r) for r in self._query("read the commits", sql)]

    def committed_unpublished(self) -> list[LedgerRow]:
        """COMMITTED txns without a PUBLISHED row, in slot order: any leader must publish them."""
        sql = ledger.committed_unpublished_sql(self._database)
        return [ledger.from_result_row(r) for r in self._query("read unpublished commits", sql)]

    def history(self, limit: int = 20, state: str | None = None) -> list[TxnSummary]:
        """The latest ``limit`` txns, newest first, optionally only those in ``state``."""
        if state and state.upper() not in ledger.STATE_PRECEDENCE:
            raise ValueError(f"unknown txn state {state!r}: use one of {', '.join(ledger.STATE_PRECEDENCE)}")
        picked = self._query(
            "list txns", ledger.history_txns_sql(self._database),
            limit=max(0, limit), state=(state or "").upper(),
        )
        order = [r[0] for r in picked]
        grouped = self._rows_of(order)
        return [summarize(grouped[t]) for t in order if t in grouped]

    def txn(self, txn_id: str) -> TxnSummary | None:
        """Everything the ledger says of ``txn_id``, or None if it has no row."""
        rows = self._rows_of([txn_id]).get(txn_id)
        return summarize(rows) if rows else None

    def audit(self) -> list[str]:
        """Anomalies of the commit chain per partition (overlap, backward, gap) and committed txns
        lost before publish; empty if sound."""
        return audit(self.commits(), self.gaps(), self.lost())

    # -- plumbing -----------------------------------------------------------------------------

    def _rows_of(self, txns: list[str]) -> dict[str, list[LedgerRow]]:
        if not txns:
            return {}
        grouped: dict[str, list[LedgerRow]] = {}
        for r in self._query("read txn rows", ledger.txn_rows_sql(self._database), txns=txns):
            row = ledger.from_result_row(r)
            grouped.setdefault(row.txn, []).append(row)
        return grouped

    def _slot_winner(self, event: LedgerEvent, slot: int) -> LedgerRow | None:
        rows = self._query(f"read {event.value} slot {slot}", ledger.slot_winner_sql(self._database, event), slot=slot)
        return ledger.from_result_row(rows[0]) if rows else None

    def _retry(self, what: str):  # noqa: ANN202 - a ClickHouseRetrying
        return retrying(self._retries, what, sleep=self._sleep)

    def _query(self, what: str, sql: str, **params: Any) -> list[tuple]:
        parameters = {"pipeline": self._pipeline, **params}
        result = self._retry(what)(self._client.query, sql, parameters=parameters, settings=self._read_settings)
        return list(result.result_rows)

    def _insert(self, row: LedgerRow, token: str, what: str) -> None:
        settings: dict[str, Any] = {
            "insert_deduplication_token": token,
            "insert_deduplicate": 1,
            "async_insert": 0,
        }
        if self._replicated:
            settings |= {"insert_quorum": "auto", "insert_quorum_parallel": 0}
        self._retry(what)(
            self._client.insert,
            ledger.TABLE,
            [ledger.to_insert_values(row)],
            column_names=list(ledger.INSERT_COLUMNS),
            column_type_names=list(ledger.INSERT_TYPES),  # no DESCRIBE round trip per insert
            database=self._database,
            settings=settings,
        )
