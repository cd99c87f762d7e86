"""Claims, writes and the leader's reads of the ledger table (``protocol.ledger.rows``) through a
clickhouse-connect client; the history reads for people are ``coordinator.ledger.history``.

Guarantees:
- Every insert is synchronous (``async_insert = 0``) and carries a deduplication token, so a
  retried insert stores its row once.
- ``claim_commit`` / ``claim_epoch`` are compare-and-set: of any number of racing claimers
  of one slot, at most one gets True, by the store's ``commit_point`` (``coordinator.ledger.commit_point``):
  ``token`` (ClickHouse keeps one row per token; each claimer reads the slot back and wins only
  if the surviving row carries its own random ``claim_id``) or ``keeper`` (a strict-mode
  KeeperMap key per slot, ``protocol.ledger.claims``; only winners' rows reach the ledger).
- Reads resolve a duplicated slot by the first claim (``protocol.ledger.rows``), so every reader
  sees the same single chain of commits, and a late claim never rewrites it.
- ``seal`` lets a new leader fence every older one out of the next commit slot.
- ``claim_commit`` only commits. Its winner then calls ``after_won_slot``: every
  ``checkpoint_every``-th won slot and every won seal are followed by a checkpoint and an expiry
  run (``coordinator.ledger.upkeep``): reads start from the latest checkpoint, and history older
  than ``retention_s`` goes, never the head. Their failures are logged, never raised: the commit
  stands, and the next checkpoint covers what this one missed.
- On replicated ClickHouse (``replicated=True``) inserts wait for a quorum and reads see every
  quorum insert (``insert_quorum``, ``select_sequential_consistency``).
Calls retry retryable ClickHouse errors and then raise ``protocol.errors.ClickHouseError``.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from clients.clickhouse import ClickHouseRetrying, retrying
from coordinator.ledger import upgrade as ledger_upgrade
from coordinator.ledger.commit_point import commit_point as make_commit_point
from coordinator.ledger.upkeep import LedgerUpkeep
from protocol import naming
from protocol.ledger import checkpoint as ledger_checkpoint, pauses as ledger_pauses, rows as ledger, sql as ledger_sql
from protocol.ledger.rows import LedgerEvent, LedgerRow
from protocol.ledger.sql import ALL_SLOTS
from protocol.ledger.view import TxnSummary, summarize
from protocol.messages import TopicPartition

if TYPE_CHECKING:
    from protocol.config.parse import PipelineConfig

#: Default ``retention_s``: 30 days.
DEFAULT_RETENTION_S = 30 * 86400.0


class LedgerStore:
    """The ledger of one pipeline in ``database``. The constructor does no I/O."""

    def __init__(
        self,
        client: Any,
        database: str,
        pipeline: str,
        *,
        replicated: bool = False,
        commit_point: str = "token",
        keeper_path: str = "",
        cluster: str = "",
        retries: int = 8,
        sleep: Callable[[float], None] = time.sleep,
        checkpoint_every: int = ledger_checkpoint.DEFAULT_EVERY,
        retention_s: float = DEFAULT_RETENTION_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._database = database
        self._pipeline = pipeline
        self._replicated = replicated
        self._cluster = cluster
        self._retries = retries
        self._sleep = sleep
        self._read_settings: dict[str, Any] = {"select_sequential_consistency": 1} if replicated else {}
        self._wall_clock = wall_clock
        self._upkeep = LedgerUpkeep(self, every=checkpoint_every, retention_s=retention_s, wall_clock=wall_clock)
        keeper = {"keeper_path": keeper_path or f"/chtxn/{database}", "cluster": cluster}
        self.commit_point = make_commit_point(self, commit_point, **(keeper if commit_point == "keeper" else {}))

    @classmethod
    def of(cls, cfg: PipelineConfig, client: Any, **kwargs: Any) -> LedgerStore:
        """The ledger of pipeline ``cfg`` on ``client``, claiming by its ``ledger.commit_point``."""
        ch = cfg.clickhouse
        return cls(
            client,
            ch.database,
            cfg.name,
            replicated=bool(ch.cluster),
            commit_point=cfg.ledger.commit_point,
            keeper_path=cfg.keeper_path,
            cluster=ch.cluster,
            **kwargs,
        )

    @property
    def table(self) -> str:
        return ledger.qualified(self._database)

    @property
    def pipeline(self) -> str:
        return self._pipeline

    # -- set-up -------------------------------------------------------------------------------

    def ensure_tables(self) -> bool:
        """Create the ledger table and the dead-letter table if missing; True if this call created the ledger.

        A ledger made by an earlier version gets the skip indexes and columns it lacks
        (``coordinator.ledger.upgrade``, idempotent). With
        ``commit_point = "keeper"`` the KeeperMap table of claims is created too."""
        return ledger_upgrade.ensure(
            self._query,
            lambda what, sql: self._retry(what)(self._client.command, sql),
            self._database,
            replicated=self._replicated,
            cluster=self._cluster,
            ensure_commit_point=self.commit_point.ensure_table,
        )

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
            pipeline=self._pipeline,
            txn=naming.seal_txn(epoch),
            event=LedgerEvent.COMMITTED,
            epoch=epoch,
            commit_seq=head_seq + 1,
            coordinator=coordinator,
            reason="seal: a new leader fences older ones",
        )
        return self.claim_commit(row)

    def claim_initial(self, tp: TopicPartition, offset: int, *, epoch: int, coordinator: str) -> int:
        """Fix where never-committed ``tp`` starts; returns the offset that won (the first claim)."""
        return self.claim_initials({tp: offset}, epoch=epoch, coordinator=coordinator)[tp]

    def claim_initials(
        self, offsets: dict[TopicPartition, int], *, epoch: int, coordinator: str
    ) -> dict[TopicPartition, int]:
        """``claim_initial`` of many partitions: one INITIAL row each, then one read of what won."""
        for tp, offset in offsets.items():
            row = LedgerRow(
                pipeline=self._pipeline,
                txn="",
                event=LedgerEvent.INITIAL,
                epoch=epoch,
                coordinator=coordinator,
                ranges=(ledger.PartitionRange(topic=tp.topic, partition=tp.partition, start=offset, end=offset),),
            )
            token = naming.initial_token(self._pipeline, tp.topic, tp.partition)
            self._insert(row, token, f"record the initial offset of {tp.topic}-{tp.partition}")
        won = self.initial_offsets() if offsets else {}
        return {tp: won.get(tp, offset) for tp, offset in offsets.items()}

    def claim_commit(self, row: LedgerRow) -> bool:
        """The commit point: claim slot ``row.commit_seq`` for ``row``; True if it is ours.

        False means another leader owns the slot: step down. A ``ClickHouseError`` leaves the
        outcome unknown: claiming the same row again (same ``claim_id``) is safe and answers it,
        as does ``commit_at(seq)``. A row without ``claim_id`` gets a fresh one, so it cannot
        be told apart from another claimer's if claimed twice.
        """
        if row.event is not LedgerEvent.COMMITTED or row.commit_seq < 1:
            raise ValueError(
                f"claim_commit needs a COMMITTED row with commit_seq >= 1, got {row.event.value}/{row.commit_seq}"
            )
        mine = msgspec.structs.replace(row, pipeline=self._pipeline, claim_id=row.claim_id or uuid.uuid4().hex)
        token = naming.commit_token(self._pipeline, row.commit_seq)
        return self.commit_point.claim(mine, token, f"claim commit slot {row.commit_seq}")

    def claim_epoch(self, epoch: int, coordinator: str, claim_id: str = "") -> bool:
        """Claim leadership generation ``epoch`` for ``coordinator``; True if it is ours.

        Pass the same ``claim_id`` to repeat a claim whose outcome a ``ClickHouseError`` left unknown.
        """
        if epoch < 1:
            raise ValueError(f"epochs start at 1, got {epoch}")
        mine = LedgerRow(
            pipeline=self._pipeline,
            txn="",
            event=LedgerEvent.EPOCH,
            epoch=epoch,
            coordinator=coordinator,
            claim_id=claim_id or uuid.uuid4().hex,
        )
        return self.commit_point.claim(mine, naming.epoch_token(self._pipeline, epoch), f"claim epoch {epoch}")

    # -- upkeep (coordinator.ledger.upkeep) ---------------------------------------------------

    def after_won_slot(self, commit_seq: int, *, epoch: int, coordinator: str, seal: bool = False) -> None:
        """Call right after ``claim_commit`` or ``seal`` returned True for slot ``commit_seq``: a
        checkpoint and an expiry run when due (``LedgerUpkeep.after_won_slot``); their failures are
        logged, never raised."""
        self._upkeep.after_won_slot(commit_seq, epoch=epoch, coordinator=coordinator, seal=seal)

    def checkpoint(self, *, epoch: int, coordinator: str) -> int:
        """``LedgerUpkeep.checkpoint``: write a checkpoint if there is something new; its slot."""
        return self._upkeep.checkpoint(epoch=epoch, coordinator=coordinator)

    def expire(self) -> int:
        """``LedgerUpkeep.expire``: delete expired history; the last slot whose rows are now gone (0: none)."""
        return self._upkeep.expire()

    # -- reads --------------------------------------------------------------------------------

    def initial_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the start offset first recorded for it (INITIAL rows; first claim wins)."""
        chosen: dict[TopicPartition, int] = {}
        for r in self._query("read initial offsets", ledger_sql.event_rows_sql(self._database, LedgerEvent.INITIAL)):
            for g in ledger.from_result_row(r).ranges:
                chosen.setdefault(g.tp, g.start)
        return chosen

    def commit_at(self, commit_seq: int) -> LedgerRow | None:
        """The COMMITTED row owning slot ``commit_seq``; None if the slot is free, or if its owner's
        row has expired (a claim stored after a checkpoint covered the slot owns nothing)."""
        return self.commit_point.owner(LedgerEvent.COMMITTED, commit_seq)

    def latest_checkpoint(self) -> LedgerRow | None:
        """The CHECKPOINT row of the highest slot, or None (a ledger without one reads from slot 1)."""
        rows = self._query(
            "read the latest checkpoint", ledger_checkpoint.checkpoints_sql(self._database, newest_first=True), limit=1
        )
        return ledger.from_result_row(rows[0]) if rows else None

    def pause(self) -> LedgerRow | None:
        """Whether the pipeline is paused, as the PAUSED or RESUMED row of the latest ``chtxn pause`` /
        ``resume`` (``protocol.ledger.pauses.latest``); None if neither was ever asked for. A marker
        that lost its slot (a claim past the deduplication window) counts for nothing."""
        rows = self._query("read whether the pipeline is paused", ledger_sql.latest_pause_sql(self._database))
        candidates = [ledger.from_result_row(r) for r in rows]
        return ledger_pauses.latest(r for r in candidates if not ledger_pauses.is_marker(r) or self._owns_slot(r))

    def _owns_slot(self, row: LedgerRow) -> bool:
        owner = self.commit_at(row.commit_seq)
        return owner is not None and owner.txn == row.txn

    def epoch_owner(self, epoch: int) -> str | None:
        """The coordinator that claimed ``epoch``, or None if nobody did."""
        winner = self.commit_point.owner(LedgerEvent.EPOCH, epoch)
        return winner.coordinator if winner else None

    def max_epoch(self) -> int:
        """The highest epoch in any row of this pipeline, 0 when there is none."""
        rows = self._query("read the highest epoch", ledger_sql.max_epoch_sql(self._database))
        return int(rows[0][0]) if rows else 0

    def head(self) -> tuple[int, dict[TopicPartition, int]]:
        """The last commit slot (0 if none) and, per partition ever committed, its committed end
        offset: the latest checkpoint overlaid with the commits after it."""
        latest = self.latest_checkpoint()
        after = latest.commit_seq if latest else 0
        rows = self._query(
            "read the ledger head", ledger_sql.head_sql(self._database), after=after, through=ALL_SLOTS["through"]
        )
        return ledger_checkpoint.overlay(latest, rows)

    def committed_unpublished(self, *, after: int | None = None) -> list[LedgerRow]:
        """COMMITTED txns without a PUBLISHED row, in slot order: any leader must publish them.
        All lie after the latest checkpoint (the default ``after``)."""
        if after is None:
            latest = self.latest_checkpoint()
            after = latest.commit_seq if latest else 0
        sql = ledger_sql.committed_unpublished_sql(self._database)
        rows = self._query("read unpublished commits", sql, after=after, through=ALL_SLOTS["through"])
        return [ledger.from_result_row(r) for r in rows]

    def txn(self, txn_id: str) -> TxnSummary | None:
        """Everything the ledger says of ``txn_id``, or None if it has no row."""
        rows = self._rows_of([txn_id]).get(txn_id)
        return summarize(rows) if rows else None

    # -- plumbing -----------------------------------------------------------------------------

    def _rows_of(self, txns: list[str]) -> dict[str, list[LedgerRow]]:
        if not txns:
            return {}
        grouped: dict[str, list[LedgerRow]] = {}
        for r in self._query("read txn rows", ledger_sql.txn_rows_sql(self._database), txns=txns):
            row = ledger.from_result_row(r)
            grouped.setdefault(row.txn, []).append(row)
        return grouped

    def _slot_winner(self, event: LedgerEvent, slot: int) -> LedgerRow | None:
        rows = self._query(
            f"read {event.value} slot {slot}", ledger_sql.slot_winner_sql(self._database, event), slot=slot
        )
        if not rows:
            return None
        if event is LedgerEvent.COMMITTED:
            stored_ms, fence_ms = rows[0][len(ledger.INSERT_COLUMNS)], rows[0][-1]
            if fence_ms is not None and int(stored_ms) > int(fence_ms):
                return None  # a late claim of a slot whose owner has expired
        return ledger.from_result_row(rows[0])

    def _retry(self, what: str) -> ClickHouseRetrying:
        return retrying(self._retries, what, sleep=self._sleep)

    def _command(self, what: str, sql: str, **params: Any) -> None:
        parameters = {"pipeline": self._pipeline, **params}
        self._retry(what)(self._client.command, sql, parameters=parameters)

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
