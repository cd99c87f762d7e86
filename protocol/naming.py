"""Naming rules shared by every process: txn ids, stage tables, tokens, group ids."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

STAGE_MARKER = "__chtxn_"
RESTAGE_SUFFIX = "__restage"
PROBE_SUFFIX = "__probe_"
_SIDE_RE = re.compile(r"__restage|__probe_[0-9a-f]{8}")
_TXN_RE = re.compile(r"^e(\d+)_t(\d+)$")
RESET_PREFIX = "reset_s"
PAUSE_PREFIX = "pause_s"
RESUME_PREFIX = "resume_s"
SWITCH_PREFIX = "switch_"  # a commit-point switch (``protocol.ledger.commit_points``)


def txn_id(epoch: int, seq: int) -> str:
    """Txn ids are unique across leaders because epochs are claimed by compare-and-set."""
    return f"e{epoch}_t{seq}"


def seal_txn(epoch: int) -> str:
    """The txn id of a new leader's seal (an empty commit); normal txns count from 1."""
    return txn_id(epoch, 0)


def reset_txn(commit_seq: int) -> str:
    """The txn id of an offset reset (``chtxn reset``), which takes commit slot ``commit_seq``."""
    return f"{RESET_PREFIX}{commit_seq}"


def is_reset_txn(txn: str) -> bool:
    return txn.startswith(RESET_PREFIX)


def pause_txn(commit_seq: int, *, paused: bool) -> str:
    """The txn id of ``chtxn pause`` (``paused``) or ``chtxn resume`` in commit slot ``commit_seq``."""
    return f"{PAUSE_PREFIX if paused else RESUME_PREFIX}{commit_seq}"


def is_pause_txn(txn: str) -> bool:
    """A pause's or a resume's txn id (``pause_txn``)."""
    return txn.startswith((PAUSE_PREFIX, RESUME_PREFIX))


def is_control_txn(txn: str) -> bool:
    """An operator's commit (a reset, a pause, a resume or a commit-point switch), never a txn of
    records nor a seal."""
    return is_reset_txn(txn) or is_pause_txn(txn) or txn.startswith(SWITCH_PREFIX)


def parse_txn_id(txn: str) -> tuple[int, int]:
    match = _TXN_RE.match(txn)
    if not match:
        raise ValueError(f"not a chtxn transaction id: {txn!r} (expected e<epoch>_t<n>)")
    return int(match.group(1)), int(match.group(2))


def stage_table(target: str, pipeline: str, txn: str) -> str:
    """``<target>__chtxn_<pipeline>__<txn>``: scoped by pipeline, so pipelines sharing a target
    never touch each other's stage tables."""
    return f"{target}{STAGE_MARKER}{pipeline}__{txn}"


def txn_stages(tables: Iterable[str], pipeline: str, txn: str) -> str:
    """The stage tables of ``txn`` in ``tables``, comma-separated: how a txn across several tables
    (``[[route]]``) names its stage tables in its messages, its ledger rows and the leader's actions.
    One table's is its ``stage_table``; "" when no table receives rows in the txn."""
    return ",".join(stage_table(table, pipeline, txn) for table in tables)


def split_stages(stages: str) -> list[str]:
    """The stage table names in ``txn_stages``' text."""
    return [name for name in stages.split(",") if name]


def table_of_stage(stage: str, pipeline: str, txn: str) -> str | None:
    """The target table stage table ``stage`` of ``txn`` belongs to, None if it is not one of its."""
    suffix = f"{STAGE_MARKER}{pipeline}__{txn}"
    return stage[: -len(suffix)] or None if stage.endswith(suffix) else None


def restage_table(stage: str) -> str:
    """The restage table earlier versions published a txn through after a target ALTER; now only
    recognised, so that take-over drops one left behind."""
    return f"{stage}{RESTAGE_SUFFIX}"


def probe_table(stage: str, token: str) -> str:
    """The Null-engine clone of ``stage`` a participant probes records into while isolating the
    bad records of the chunk with deduplication token ``token``."""
    return f"{stage}{PROBE_SUFFIX}{zlib.crc32(token.encode()):08x}"


def is_side_table(stage: str, table: str) -> bool:
    """Whether ``table`` is one of the tables named after stage table ``stage`` (a probe or a
    restage table), which go when the stage table goes."""
    return table.startswith(stage) and _SIDE_RE.fullmatch(table[len(stage) :]) is not None


def stage_table_prefix(target: str, pipeline: str) -> str:
    """Every stage table of ``pipeline`` into ``target`` starts with this (for orphan clean-up)."""
    return f"{target}{STAGE_MARKER}{pipeline}__"


def txn_of_stage_table(target: str, pipeline: str, table: str) -> str | None:
    """The txn whose stage (or restage) table ``table`` is, if it is one of ``pipeline`` into ``target``.

    Unambiguous although pipeline names may contain ``__``: what follows the prefix must be a
    whole txn id (and an optional side-table suffix, ``is_side_table``), which no pipeline name's
    tail can be.
    """
    prefix = stage_table_prefix(target, pipeline)
    if not table.startswith(prefix):
        return None
    rest = table[len(prefix) :]
    txn, _, _ = rest.partition("__")
    if not _TXN_RE.match(txn) or (txn != rest and not is_side_table(stage_table(target, pipeline, txn), table)):
        return None
    return txn


def chunk_token(
    pipeline: str, txn: str, topic: str, partition: int, chunk_no: int, first: int, next_offset: int
) -> str:
    """``insert_deduplication_token`` of a staged chunk: the same chunk always gets the same token,
    and the offset range binds the token to the chunk's content (the chunk cut at END is cut by
    time, so two writers of one chunk number may hold different records)."""
    return f"{pipeline}/{txn}/{topic}/{partition}/{chunk_no}/{first}-{next_offset}"


def commit_token(pipeline: str, commit_seq: int) -> str:
    """Token of the COMMITTED ledger row: of two leaders racing for a slot, one row survives."""
    return f"{pipeline}/commit/{commit_seq}"


def checkpoint_token(pipeline: str, commit_seq: int) -> str:
    """Token of the CHECKPOINT ledger row at a slot: its writers derive the same head, one row stays."""
    return f"{pipeline}/checkpoint/{commit_seq}"


def epoch_token(pipeline: str, epoch: int) -> str:
    return f"{pipeline}/epoch/{epoch}"


def initial_token(pipeline: str, topic: str, partition: int) -> str:
    """Token of a partition's INITIAL ledger row: the first choice of a start offset stays."""
    return f"{pipeline}/initial/{topic}/{partition}"


def gap_token(pipeline: str, topic: str, partition: int, start: int, end: int) -> str:
    """Token of a GAP ledger row: a gap is recorded once however many leaders meet it."""
    return f"{pipeline}/gap/{topic}/{partition}/{start}-{end}"


def publish_token(pipeline: str, txn: str) -> str:
    """Token of the ``insert-select`` publish of a txn, so a repeated publish stores rows once."""
    return f"{pipeline}/publish/{txn}"


def consumer_group(pipeline: str) -> str:
    """Participants commit end offsets here after ACK-COMMIT (for lag tools; never read back)."""
    return pipeline


def control_reader_group(pipeline: str) -> str:
    """The group id a coordinator's control-topic consumer carries (it reads by ``assign``, commits nothing)."""
    return f"{pipeline}.chtxn-control-reader"


def participant_control_group(pipeline: str) -> str:
    """The group id a participant's control-topic consumer carries (it reads by ``assign``, commits nothing)."""
    return f"{pipeline}.chtxn-participant"


def dead_letter_reader_group(pipeline: str) -> str:
    """The group id of a consumer reading the dead-letter topic for people (``chtxn dlq``, ``verify``)."""
    return f"{pipeline}.chtxn-dlq-reader"


def status_group(pipeline: str) -> str:
    """The group id of ``chtxn status``'s consumers (they read by ``assign``, commit nothing)."""
    return f"{pipeline}.chtxn-status"


def dead_letter_marker_group(pipeline: str) -> str:
    """The consumer group whose committed offset on the dead-letter topic's partition 0 is the
    dead-letter publisher's marker (``coordinator.dead_letters.publisher``)."""
    return f"{pipeline}.chtxn-dlq"


def dead_letter_transactional_id(pipeline: str) -> str:
    """``transactional.id`` of the dead-letter publisher: a new leader's publisher fences the old one's."""
    return f"{pipeline}.chtxn-dlq"
