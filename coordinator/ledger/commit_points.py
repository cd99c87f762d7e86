"""The commit point a pipeline's ledger records (``protocol.ledger.commit_points``): the check every
coordinator makes at start and at take-over (``ensure``), and the switch (``switch``, run by
``chtxn commit-point switch``).

Guarantees:
- A coordinator claims slots only by the commit point the ledger records: ``ensure`` refuses any
  other with ``CommitPointMismatch``, naming the switch procedure. Take-over calls it after each
  read of the head, so a leader that read a head at or past a switch never claims by the old one.
- ``switch`` takes effect at one place in the commit chain, by a slot claimed through the old
  commit point (Switch step 1), only while the pipeline is paused and no leader holds the lease.
  Of all claimers of any slot, one commit point decides: slots up to the switch's by the old,
  slots after it by the new.
- Both are idempotent: a switch killed between its steps is completed by running it again, or by
  the first coordinator of the new commit point that starts.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from clients.failpoints import hit
from coordinator.ledger.store import LedgerStore
from protocol.errors import SetupError
from protocol.ledger import commit_points, rows as ledger
from protocol.ledger.commit_points import Fact
from protocol.ledger.rows import LedgerEvent

if TYPE_CHECKING:
    from protocol.config.parse import PipelineConfig

log = logging.getLogger(__name__)


class CommitPointMismatch(SetupError):
    """This coordinator's ``ledger.commit_point`` is not the one the ledger records."""


class SwitchRefused(SetupError):
    """``chtxn commit-point switch`` cannot run now: the message says why and what to do."""


class Switched(msgspec.Struct, frozen=True, kw_only=True):
    """What ``switch`` did: the commit point ``frm`` -> ``to`` from slot ``commit_seq`` on
    (``already``: the ledger recorded ``to`` before, nothing was claimed)."""

    pipeline: str
    frm: str
    to: str
    commit_seq: int
    already: bool = False


def current(store: LedgerStore) -> Fact | None:
    """The commit point the ledger of ``store``'s pipeline records; None if it records none yet."""
    rows = store._query("read the ledger's commit point", commit_points.latest_record_sql(store._database))
    record = ledger.from_result_row(rows[0]) if rows else None
    candidates = store._query(
        "read the commit-point switches after the record",
        commit_points.markers_sql(store._database),
        after=record.commit_seq if record else 0,
    )
    markers = []
    for r in candidates:  # a marker counts only as its slot's winner
        row = ledger.from_result_row(r)
        owner = store.commit_at(row.commit_seq)
        if owner is not None and owner.claim_id == row.claim_id:
            markers.append(row)
    return commit_points.current(record, markers)


def ensure(store: LedgerStore, who: str) -> Fact:
    """Check that the ledger records ``store``'s commit point, recording it if the ledger records
    none (the first claim wins) and completing the record of a switch killed between its steps;
    the commit point in force. Raises ``CommitPointMismatch`` when it is another."""
    mode = store.commit_point.name
    fact = current(store)
    if fact is None:
        log.warning("the ledger records no commit point yet: recording this one", extra={"commit_point": mode})
        _record(store, 0, mode, who)
        fact = current(store)
        assert fact is not None
    if not fact.recorded:
        _record(store, fact.since, fact.mode, fact.who or who)
    if fact.mode != mode:
        raise CommitPointMismatch(commit_points.mismatch(store.pipeline, fact, mode))
    return fact


def switch(
    cfg: PipelineConfig,
    client: Any,
    *,
    to: str,
    who: str,
    reason: str,
    leaders: Mapping[str, int],
    clock: Callable[[], float] = time.time,
) -> Switched:
    """Switch the ledger of pipeline ``cfg`` to commit point ``to`` (module docstring).
    ``leaders``: the coordinators heard holding the lease (id -> epoch), read by the caller."""
    if to not in commit_points.MODES:
        raise SwitchRefused(f"--to {to}: a commit point is one of {', '.join(commit_points.MODES)}")
    base = store_of(cfg, client, to)
    fact = current(base)
    if fact is not None and fact.mode == to:
        if not fact.recorded:  # a switch killed between its steps: finish it
            _record(base, fact.since, to, who)
        return Switched(pipeline=cfg.name, frm=to, to=to, commit_seq=fact.since, already=True)
    frm = fact.mode if fact is not None else next(m for m in commit_points.MODES if m != to)
    pause = base.pause()
    if pause is None or pause.event is not LedgerEvent.PAUSED:
        raise SwitchRefused(
            f"pipeline {cfg.name} is not paused: the commit point is switched only while no txn commits; "
            f"run chtxn pause first. The procedure: {commit_points.PROCEDURE.format(to=to)}"
        )
    if leaders:
        held = ", ".join(f"{c} (epoch {e})" for c, e in sorted(leaders.items()))
        raise SwitchRefused(
            f'{held} holds the lease of pipeline {cfg.name} with ledger.commit_point = "{frm}": stop every '
            f"coordinator of the pipeline first (a paused pipeline reads nothing), then run this again. "
            f"The procedure: {commit_points.PROCEDURE.format(to=to)}"
        )
    new = store_of(cfg, client, to)
    new.commit_point.ensure_table()  # e.g. Keeper's claims table: refused here, before anything changed
    old = store_of(cfg, client, frm)
    while True:
        head_seq, _ = old.head()
        hit("switch.before-claim", who)
        marker = commit_points.marker_row(
            pipeline=cfg.name, commit_seq=head_seq + 1, to=to, frm=frm, who=who, reason=reason, now=clock()
        )
        # Switch step 1: the marker claims the next slot through the old commit point
        if old.claim_commit(marker):
            break
        log.warning("a commit took the slot first: switching at the next one", extra={"slot": head_seq + 1})
    hit("switch.before-record", who)
    _record(old, head_seq + 1, to, who)  # Switch step 2: the record that outlives the marker
    return Switched(pipeline=cfg.name, frm=frm, to=to, commit_seq=head_seq + 1)


def store_of(cfg: PipelineConfig, client: Any, mode: str) -> LedgerStore:
    """The ledger of ``cfg`` on ``client``, claiming by commit point ``mode`` whatever ``cfg`` says."""
    section = msgspec.structs.replace(cfg.ledger, commit_point=mode)
    return LedgerStore.of(msgspec.structs.replace(cfg, ledger=section), client)


def _record(store: LedgerStore, since: int, mode: str, who: str) -> None:
    row = commit_points.record_row(pipeline=store.pipeline, since=since, mode=mode, who=who, claim_id=uuid.uuid4().hex)
    store._insert(row, commit_points.token(store.pipeline, since), f"record commit point {mode} from slot {since}")
