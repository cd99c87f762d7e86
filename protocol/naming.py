"""Naming rules shared by every process: txn ids, stage tables, tokens, group ids."""

from __future__ import annotations

import re

STAGE_MARKER = "__chtxn_"
_TXN_RE = re.compile(r"^e(\d+)_t(\d+)$")


def txn_id(epoch: int, seq: int) -> str:
    """Txn ids are unique across leaders because epochs are claimed by compare-and-set."""
    return f"e{epoch}_t{seq}"


def parse_txn_id(txn: str) -> tuple[int, int]:
    match = _TXN_RE.match(txn)
    if not match:
        raise ValueError(f"not a chtxn transaction id: {txn!r} (expected e<epoch>_t<n>)")
    return int(match.group(1)), int(match.group(2))


def stage_table(target: str, txn: str) -> str:
    return f"{target}{STAGE_MARKER}{txn}"


def stage_table_prefix(target: str) -> str:
    """Every stage table of ``target`` starts with this (for orphan clean-up)."""
    return f"{target}{STAGE_MARKER}"


def txn_of_stage_table(target: str, table: str) -> str | None:
    prefix = stage_table_prefix(target)
    if not table.startswith(prefix):
        return None
    txn = table[len(prefix):]
    return txn if _TXN_RE.match(txn) else None


def chunk_token(pipeline: str, txn: str, topic: str, partition: int, chunk_no: int) -> str:
    """``insert_deduplication_token`` of a staged chunk: the same chunk always gets the same token."""
    return f"{pipeline}/{txn}/{topic}/{partition}/{chunk_no}"


def commit_token(pipeline: str, commit_seq: int) -> str:
    """Token of the COMMITTED ledger row: of two leaders racing for a slot, one row survives."""
    return f"{pipeline}/commit/{commit_seq}"


def epoch_token(pipeline: str, epoch: int) -> str:
    return f"{pipeline}/epoch/{epoch}"


def publish_token(pipeline: str, txn: str) -> str:
    """Token of the ``insert-select`` publish of a txn, so a repeated publish stores rows once."""
    return f"{pipeline}/publish/{txn}"


def consumer_group(pipeline: str) -> str:
    """Participants commit end offsets here after ACK-COMMIT (for lag tools; never read back)."""
    return pipeline
