"""Take-over: what a new leader does before its first START, in this order:

1. Check the target table.
2. Seal: read the head and claim slot head+1 with an empty commit of this epoch, unless the
   ledger records another commit point (``coordinator.ledger.commit_points``: stop) or a
   newer epoch was claimed (then step down: an older epoch never seals on top of a newer
   leader's slots). Until the seal is ours, no stage table is touched: an older leader's commit
   that lands first is rolled forward below, and one that comes later loses its slot and steps
   down. A seal lost to a newer epoch means a newer leader exists: step down.
3. Roll forward, in commit order, every committed txn not yet published, into the tables the ledger
   committed it for: a table no route names any more (the routes changed between restarts) is
   checked and published like the others.
4. Drop this pipeline's other stage tables (orphans): nothing older can commit them any more.
   Each gets an ABORTED row, but for a spare made one txn ahead that never held a row and never
   reached the ledger: nothing happened there to abort, and ``txn list`` is not flooded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from clients import failpoints
from clients.target_table import check_target
from coordinator.ledger import commit_points, rows as ledger_rows
from coordinator.ledger.rows import shard_addresses, shard_indexes
from coordinator.ledger.store import LedgerStore
from coordinator.stage.sets import adopting
from coordinator.stage.shards import Stages, adopting_on_shards, clients_of
from protocol import shards
from protocol.config.parse import PipelineConfig
from protocol.coordinator.events import AbortKind
from protocol.errors import ChtxnError, SetupError
from protocol.ledger.rows import LedgerEvent, LedgerRow
from protocol.messages import TopicPartition

log = logging.getLogger(__name__)

#: Commit step 7 for one committed txn, ``TxnPublisher.publish``: (txn, stage table, its PUBLISHED row) -> lost.
#: ``TxnPublisher.publish``: (txn, its stage tables, its PUBLISHED row, shards=its shards) -> lost.
PublishStep = Callable[..., bool]


class SteppedDown(ChtxnError):
    """A newer leader exists (found by take-over, or by the dead-letter publisher): this replica must not lead."""


def take_over(
    cfg: PipelineConfig,
    *,
    epoch: int,
    coordinator: str,
    ledger: LedgerStore,
    stages: Stages,
    retry: Callable[[str], Any],
    publish: PublishStep,
    progress: Callable[[], None],
    aborted: Callable[[str], None] = lambda kind: None,
) -> tuple[int, dict[TopicPartition, int]]:
    """Take-over steps 1-4 (module docstring) for the leader ``coordinator`` of ``epoch``; returns
    the head after the seal. ``retry(what)`` wraps a ClickHouse call in the coordinator's retries;
    ``progress()`` is called after each txn rolled forward and each stage table handled (a long
    take-over is progress: the lease holds); ``aborted(kind)`` after each orphan recorded ABORTED."""
    failpoints.hit("leader.before-take-over", coordinator)
    for target in cfg.tables:  # Take-over step 1: check the target tables (on every shard)
        for shard, client in clients_of(stages):
            retry(f"check the target table {target}")(check_target, client, cfg, target, shard=shard)
    while True:  # Take-over step 2: seal
        head_seq, head = ledger.head()
        commit_points.ensure(ledger, coordinator)  # read after the head: a switch in it shows here
        newest = ledger.max_epoch()  # read after the head: a newer seal in it shows here too
        if newest > epoch:
            raise SteppedDown(f"epoch {newest} > {epoch} was claimed: a newer leader exists")
        failpoints.hit("leader.before-seal", coordinator)
        if ledger.seal(epoch, coordinator, head_seq):
            ledger.after_won_slot(head_seq + 1, epoch=epoch, coordinator=coordinator, seal=True)
            break
        winner = ledger.commit_at(head_seq + 1)
        if winner is not None and winner.epoch > epoch:
            raise SteppedDown(f"slot {head_seq + 1} is held by epoch {winner.epoch} > {epoch}")
        log.warning(
            "a late commit took the slot to seal; rolling it forward",
            extra={"slot": head_seq + 1, "txn": winner.txn if winner else "?"},
        )
    seal = ledger.commit_at(head_seq + 1)
    assert seal is not None
    ledger.append(ledger_rows.published_from(seal, epoch=epoch, coordinator=coordinator))
    unpublished = ledger.committed_unpublished()
    for row in unpublished:  # a shard a committed txn staged on, no longer in clickhouse.shards: its rows wait there
        if gone := sorted(set(row.shards) - (set(shard_addresses(cfg)) or {shards.address(cfg.clickhouse.url)})):
            raise SetupError(
                f"txn {row.txn} is committed and not yet published, and has rows staged on {', '.join(gone)}, which "
                f"clickhouse.shards no longer lists: add {'it' if len(gone) == 1 else 'them'} back until "
                "chtxn status shows nothing unpublished, then remove"
            )
    # The routes changed between restarts: a committed txn still goes where the ledger sent it.
    owed = sorted({t for row in unpublished for t in ledger_rows.targets_of(row)} - set(cfg.tables))
    for target in owed:
        log.warning("publishing committed txns into a table no route names any more", extra={"table": target})
        for shard, client in clients_of(stages):
            retry(f"check the target table {target}")(check_target, client, cfg, target, shard=shard)
    with adopting_on_shards(stages, lambda one: adopting(one, owed, cfg.publish_mode_of)):
        for row in unpublished:  # Take-over step 3: roll forward, in commit order
            log.warning("rolling forward the publish of a committed txn", extra={"txn": row.txn})
            publish(
                row.txn,
                row.stage_table,
                partial(ledger_rows.published_from, row, epoch=epoch, coordinator=coordinator),
                shards=shard_indexes(cfg, row.shards),
            )
            progress()
        for txn_id, table in retry("list stage tables")(stages.existing).items():  # Take-over step 4: drop orphans
            summary = ledger.txn(txn_id)
            if (
                summary is not None and summary.state == LedgerEvent.PUBLISHED
            ):  # its rows are in the target: only clean up
                retry(f"drop {table}")(stages.drop_all, table)
            elif summary is not None and summary.state == LedgerEvent.COMMITTED and (won := _won(ledger, summary)):
                publish(
                    txn_id,
                    summary.stage_table or table,  # the stage tables it committed (``table``: every table's)
                    partial(
                        ledger_rows.published_from_summary,
                        summary,
                        pipeline=cfg.name,
                        epoch=epoch,
                        coordinator=coordinator,
                    ),
                    shards=shard_indexes(cfg, won.shards),
                )
                retry(f"drop {table}")(stages.drop_all, table)
            elif summary is None and retry(f"count {table}")(_rows_in, stages, table) == 0:
                # a spare made one txn ahead that never held a row (or only side tables are left): nothing to abort
                log.info("dropping an unused spare stage table", extra={"txn": txn_id, "table": table})
                retry(f"drop {table}")(stages.drop_all, table)
            else:
                log.warning("dropping an orphan stage table", extra={"txn": txn_id, "table": table})
                retry(f"drop {table}")(stages.drop_all, table)
                ledger.append(
                    ledger_rows.orphan_aborted(
                        txn_id,
                        table,
                        pipeline=cfg.name,
                        target=",".join(cfg.tables),
                        epoch=epoch,
                        coordinator=coordinator,
                    )
                )
                aborted(AbortKind.TAKE_OVER)
            progress()
    return head_seq + 1, head


def _rows_in(stages: Stages, table: str) -> int:
    """Rows in stage table ``table``; 0 when it is gone (only its side tables were left)."""
    return stages.count(table) if stages.exists(table) else 0


def _won(ledger: LedgerStore, summary: Any) -> LedgerRow | None:
    """The COMMITTED row of ``summary``'s txn if it won its commit slot, else None (a late claim
    past the deduplication window leaves a COMMITTED row that lost: its stage table is an orphan)."""
    winner = ledger.commit_at(summary.commit_seq) if summary.commit_seq else None
    return winner if winner is not None and winner.txn == summary.txn else None
