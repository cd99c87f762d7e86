"""The Keeper-backed commit point (``ledger.commit_point = "keeper"``): a KeeperMap table of claims. Pure.

Table ``<database>.chtxn_claims``, ``ENGINE = KeeperMap('<ledger.keeper_path>')``, shared by every
pipeline of the database. One key per claimed slot: ``<pipeline>/commit/<commit_seq>`` or
``<pipeline>/epoch/<epoch>``, holding the claimer's ``claim_id`` and its whole ledger row
(``row``, JSON). A claim is an insert with ``keeper_map_strict_mode = 1``, which Keeper refuses
when the key exists, so of any number of claimers of one slot exactly one gets the key, however
long any of them stalled: Keeper has no deduplication window.

**What the ledger holds in this mode.** Only winners' COMMITTED and EPOCH rows: the winner writes
its row after its key (same deduplication token as in ``token`` mode), and a claimer that finds
another's key copies that winner's row from Keeper into the ledger (the winner may have died
between its key and its row). So every reader of ``protocol.ledger.sql`` reads the ledger alone,
as in ``token`` mode, and the first-claim rule holds trivially: a slot's rows are all one claim's.
A key whose row is not yet in the ledger is a hole in the chain: the head stops before it, a new
leader's seal of it loses and copies the row, and no checkpoint covers it.

**Forgetting.** Keys of commit slots a checkpoint covers are deleted after that checkpoint is
written (epoch keys stay: one per leadership). A late claim of such a slot could then get a key
again, so a won key counts only if no checkpoint covers its slot; the check is read after the
key is won, and a key is deleted only once a covering checkpoint exists, so it cannot miss one.

Answers: an insert answered without error created the key, so its claimer holds it without
reading it. In strict mode the insert is one Keeper multi-request of creates, which fails on an
existing key; ClickHouse repeats it only after a lost Keeper connection (never, with
``CLAIM_SETTINGS``), and a repeat that finds the key raises too. A failed insert tells nothing:
"the key exists" and "Keeper is unreachable" are both ``KEEPER_EXCEPTION`` (999), and a lost
answer may hide a key taken; its claimer reads the key back, never the message.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from protocol.ledger.rows import LedgerEvent, LedgerRow

TABLE = "chtxn_claims"

Kind = Literal["commit", "epoch"]

#: Settings of a claim: fail when the key exists, and fail at once when Keeper is unreachable
#: (the caller retries with back-off; the server's default keeps trying for minutes).
CLAIM_SETTINGS: dict[str, int] = {"keeper_map_strict_mode": 1, "insert_keeper_max_retries": 0, "keeper_max_retries": 0}
#: Settings of the reads and deletes of claims.
READ_SETTINGS: dict[str, int] = {"keeper_max_retries": 0}

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(LedgerRow)


def qualified(database: str) -> str:
    return f"`{database}`.`{TABLE}`"


def kind_of(event: LedgerEvent) -> Kind:
    if event is LedgerEvent.COMMITTED:
        return "commit"
    if event is LedgerEvent.EPOCH:
        return "epoch"
    raise ValueError(f"only COMMITTED and EPOCH rows are claimed, not {event.value}")


def slot_of(row: LedgerRow) -> int:
    """The slot ``row`` claims: its commit sequence number, or its epoch."""
    return row.commit_seq if row.event is LedgerEvent.COMMITTED else row.epoch


def key(pipeline: str, kind: Kind, slot: int) -> str:
    return f"{pipeline}/{kind}/{slot}"


def create_table_sql(database: str, keeper_path: str, *, cluster: str = "") -> str:
    """The claims table (idempotent). On a cluster every replica gets a table on the same Keeper path,
    so all of them read and write one set of keys."""
    on_cluster = f" ON CLUSTER `{cluster}`" if cluster else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(database)}{on_cluster}\n"
        "(\n    key       String,\n    pipeline  String,\n    kind      String,\n    slot      UInt64,\n"
        "    claim_id  String,\n    row       String\n)\n"
        f"ENGINE = KeeperMap('{keeper_path}')\nPRIMARY KEY key"
    )


def claim_sql(database: str) -> str:
    """Insert the key ``{key:String}`` (with ``CLAIM_SETTINGS``: fails when it exists). One statement
    without a body, never a streamed insert: chDB (the embedded endpoint) answers a streamed insert
    whose write failed as a success, and a claimer takes a success for the key."""
    return (
        f"INSERT INTO {qualified(database)} (key, pipeline, kind, slot, claim_id, row) "
        "SELECT {key:String}, {pipeline:String}, {kind:String}, {slot:UInt64}, {claim_id:String}, {row:String}"
    )


def claim_parameters(pipeline: str, row: LedgerRow) -> dict[str, object]:
    kind = kind_of(row.event)
    slot = slot_of(row)
    return {
        "key": key(pipeline, kind, slot),
        "pipeline": pipeline,
        "kind": kind,
        "slot": slot,
        "claim_id": row.claim_id,
        "row": _ENCODER.encode(row).decode(),
    }


def owner_sql(database: str) -> str:
    """The row held by the key ``{key:String}`` (no result: nobody claimed it)."""
    return f"SELECT row FROM {qualified(database)} WHERE key = {{key:String}}"


def decode_row(text: str) -> LedgerRow:
    return _DECODER.decode(text)


def forget_sql(database: str) -> str:
    """Delete the commit keys of ``{pipeline:String}`` up to slot ``{through:UInt64}``."""
    return (
        f"DELETE FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND kind = 'commit' AND slot <= {through:UInt64}"
    )
