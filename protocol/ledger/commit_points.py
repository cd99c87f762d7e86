"""Which commit point a pipeline's ledger claims slots by, as facts in the ledger. Pure.

Two commit points on one ledger (``ledger.commit_point``: ``token`` and ``keeper``) could each
tell a claimer it won the same slot: a token claim is decided by the ledger's row, a keeper claim
by a Keeper key. So the ledger records the one it uses, per pipeline, and changes it only at a
place in the commit chain:

- **The first record.** A COMMIT_POINT row with ``commit_seq`` 0, claimed by the first coordinator
  that starts on a ledger without one (token ``<pipeline>/commit-point/0``; the first claim wins,
  as for INITIAL rows).
- **A switch** (``chtxn commit-point switch --to MODE``, ``coordinator.ledger.commit_points``), while the
  pipeline is paused and no leader holds the lease:

  1. Switch step 1: claim commit slot S = head + 1 with a marker (a COMMITTED row of no rows and
     no stage table, txn ``switch_<mode>_s<S>``) **through the old commit point**. An old-mode
     claimer of S then loses (one commit point decides S), and no old-mode claimer can claim a
     slot after S: it would have to win S, or read a head at or past S and with it the switch.
  2. Switch step 2: a COMMIT_POINT row with ``commit_seq`` S naming the new mode (token
     ``<pipeline>/commit-point/<S>``): it outlives the marker, which retention may delete.

Slots after S are claimed by the new mode only. A switch killed between its steps has switched
(the marker is the fact): readers take the marker as a record, and the next coordinator of the new
mode, or the switch run again, writes the missing row.

A COMMIT_POINT row holds the commit point's name in ``reason``; its ``txn`` is empty (it is no txn).
Retention never deletes COMMIT_POINT rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from protocol import naming
from protocol.ledger.rows import SELECT_COLUMNS, LedgerEvent, LedgerRow, qualified

MODES = ("token", "keeper")
SWITCH_PREFIX = naming.SWITCH_PREFIX

#: The operator's procedure, named by every refusal.
PROCEDURE = (
    "chtxn pause; stop every coordinator of the old commit point; chtxn commit-point switch --to {to}; "
    'start the coordinators with ledger.commit_point = "{to}"; chtxn resume '
    '(docs/operations.md, "Switching the commit point")'
)


class Fact(msgspec.Struct, frozen=True, kw_only=True):
    """The commit point of slots after ``since`` (0: from the first record), and whether a
    COMMIT_POINT row records it (False: only a switch's marker does, its row not yet written)."""

    mode: str
    since: int
    recorded: bool = True
    who: str = ""


def switch_txn(mode: str, commit_seq: int) -> str:
    """The txn id of the marker of a switch to ``mode`` in commit slot ``commit_seq``."""
    return f"{SWITCH_PREFIX}{mode}_s{commit_seq}"


def switch_mode(txn: str) -> str | None:
    """The mode a switch marker's txn switches to; None for any other txn."""
    if not txn.startswith(SWITCH_PREFIX):
        return None
    mode, _, slot = txn[len(SWITCH_PREFIX) :].rpartition("_s")
    return mode if mode in MODES and slot.isdigit() else None


def token(pipeline: str, commit_seq: int) -> str:
    """Deduplication token of the COMMIT_POINT row of slot ``commit_seq``: one row per slot stays."""
    return f"{pipeline}/commit-point/{commit_seq}"


def marker_row(*, pipeline: str, commit_seq: int, to: str, frm: str, who: str, reason: str, now: float) -> LedgerRow:
    """Switch step 1's COMMITTED row: slot ``commit_seq``, no rows, no stage table."""
    return LedgerRow(
        pipeline=pipeline,
        txn=switch_txn(to, commit_seq),
        event=LedgerEvent.COMMITTED,
        epoch=0,
        commit_seq=commit_seq,
        coordinator=who,
        started_at=now,
        committed_at=now,
        reason=f"commit point switch {frm} -> {to}" + (f": {reason}" if reason else ""),
    )


def record_row(*, pipeline: str, since: int, mode: str, who: str, claim_id: str) -> LedgerRow:
    """The COMMIT_POINT row: slots after ``since`` are claimed by ``mode``."""
    if mode not in MODES:
        raise ValueError(f"a commit point is one of {', '.join(MODES)}, not {mode!r}")
    return LedgerRow(
        pipeline=pipeline,
        txn="",
        event=LedgerEvent.COMMIT_POINT,
        epoch=0,
        commit_seq=since,
        coordinator=who,
        claim_id=claim_id,
        reason=mode,
    )


def latest_record_sql(database: str) -> str:
    """The COMMIT_POINT row of ``{pipeline:String}`` of the highest slot (the first claim of it)."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'COMMIT_POINT' "
        "ORDER BY commit_seq DESC, event_time ASC, claim_id ASC LIMIT 1"
    )


def markers_sql(database: str) -> str:
    """The switch markers' rows of ``{pipeline:String}`` in slots after ``{after:UInt64}``, in slot
    order: candidates only (a marker that lost its slot has a row too); ``commit_at`` decides."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'COMMITTED' AND commit_seq > {after:UInt64} "
        f"AND startsWith(txn, '{SWITCH_PREFIX}') ORDER BY commit_seq"
    )


def current(record: LedgerRow | None, commits: Iterable[LedgerRow]) -> Fact | None:
    """The commit point in force: the switch marker of the highest slot among ``commits`` (markers
    that own their slots, ``markers_sql``) after ``record``'s slot if any, else ``record``; None when
    there is neither."""
    fact = Fact(mode=record.reason, since=record.commit_seq, who=record.coordinator) if record else None
    for row in commits:
        mode = switch_mode(row.txn)
        if mode is not None and row.event is LedgerEvent.COMMITTED and (fact is None or row.commit_seq > fact.since):
            fact = Fact(mode=mode, since=row.commit_seq, recorded=False, who=row.coordinator)
    return fact


def mismatch(pipeline: str, fact: Fact, configured: str) -> str:
    """What a coordinator configured with ``configured`` says when the ledger records ``fact``."""
    since = f"since commit slot {fact.since}" if fact.since else "since its first coordinator"
    return (
        f'the ledger of pipeline {pipeline} claims commit slots by ledger.commit_point = "{fact.mode}" ({since}), '
        f'and this coordinator is configured with "{configured}": two commit points on one ledger could each '
        f"win the same slot, so it does not start. To switch: {PROCEDURE.format(to=configured)}. "
        f'To stay, set ledger.commit_point = "{fact.mode}"'
    )
