"""The invariants of ``CoordinatorState``, checked after every event of the pure tests (``check``). Pure.

What the coordinator's module docstring promises, as facts about its state between two events:

- Nothing exists before ``Ready``; once stopping, nothing is open and no spare is kept.
- Txns are kept in chain order: this epoch's ids, sequence numbers increasing, the spare's the
  highest. Stage tables are named after their txn.
- Committed txns (PUBLISHING) come first, in commit order, at or below the ledger head.
- At most two txns are uncommitted; when two are, the newer one is COLLECTING and pipelined
  after the older one (so it aborts if that one does).
- A txn's phase matches what it holds: an END once past COLLECTING; every WRITE-STATUS once
  COMPLETE, none missing while ENDING; explicit start offsets once ended; its commit slot from
  COMMITTING on. A ``CONTINUE`` start waits on the WRITE-STATUS of the txn it is chained to.
- Each WRITE-STATUS kept is the holder's, for this txn and epoch, starts where START said and
  ends at or after its start, and carries no error.

Checking is O(txns x partitions): meant for tests (after every event), not the hot path.
"""

from __future__ import annotations

from itertools import pairwise

from protocol import naming
from protocol.coordinator.events import Phase, Txn
from protocol.coordinator.state import CoordinatorState
from protocol.coordinator.txns import OPEN
from protocol.errors import InvalidTransition
from protocol.messages import CONTINUE


def check(state: CoordinatorState) -> None:
    """Raise ``InvalidTransition`` naming the first invariant ``state`` breaks."""
    _check_lifecycle(state)
    _check_order(state)
    for txn in state.txns:
        _check_txn(state, txn)


def _broken(txn: str, expected: str, found: str) -> InvalidTransition:
    return InvalidTransition(f"coordinator, txn {txn or '-'}: expected {expected}, found {found}")


def _seq(state: CoordinatorState, txn: str) -> int:
    epoch, seq = naming.parse_txn_id(txn)
    if epoch != state.epoch:
        raise _broken(txn, f"a txn of this leader's epoch {state.epoch}", f"epoch {epoch}")
    return seq


def _check_lifecycle(state: CoordinatorState) -> None:
    if not state.ready and (state.txns or state.spare is not None):
        raise _broken(
            "",
            "no txn and no spare stage table before Ready",
            f"txns {[t.id for t in state.txns]}, spare {state.spare}",
        )
    if state.stopping:
        if state.spare is not None:
            raise _broken(state.spare.txn, "no spare stage table once stopping", "one kept")
        for txn in state.txns:
            if txn.phase in OPEN or txn.phase is Phase.COMPLETE:
                raise _broken(txn.id, "only txns past their commit check once stopping", txn.phase.value)


def _check_order(state: CoordinatorState) -> None:
    seqs = [_seq(state, t.id) for t in state.txns]
    for (earlier, a), (later, b) in pairwise(zip(state.txns, seqs)):
        if b <= a:
            raise _broken(later.id, f"txns in chain order, after {earlier.id}", f"{[t.id for t in state.txns]}")
    if state.spare is not None:
        if not _names_its_stages(state, state.spare.txn, state.spare.stage_table):
            raise _broken(state.spare.txn, "the spare's stage table named after it", state.spare.stage_table)
        if seqs and _seq(state, state.spare.txn) <= seqs[-1]:
            raise _broken(state.spare.txn, f"a spare newer than every txn (newest {state.txns[-1].id})", "an older one")
    committed = [t for t in state.txns if t.phase is Phase.PUBLISHING]
    if state.txns[: len(committed)] != committed:
        raise _broken(
            committed[-1].id,
            "committed txns before every uncommitted one",
            f"phases {[t.phase.value for t in state.txns]}",
        )
    slots = [t.commit_seq for t in committed]
    if slots != sorted(set(slots)) or (slots and (slots[0] <= 0 or slots[-1] > state.head_seq)):
        raise _broken(committed[0].id, f"commit slots increasing, in 1..{state.head_seq} (the ledger head)", f"{slots}")
    uncommitted = state.txns[len(committed) :]
    if len(uncommitted) > 2:
        raise _broken(uncommitted[-1].id, "at most two uncommitted txns", f"{[t.id for t in uncommitted]}")
    if len(uncommitted) == 2:
        older, newer = uncommitted
        if newer.phase is not Phase.COLLECTING or older.phase is Phase.COLLECTING:
            raise _broken(
                newer.id,
                f"only the newer of two uncommitted txns collecting (older {older.id})",
                f"{older.phase.value} then {newer.phase.value}",
            )
        if newer.after != older.id:
            raise _broken(newer.id, f"it pipelined after {older.id}", f"after {newer.after}")


def _names_its_stages(state: CoordinatorState, txn: str, stages: str) -> bool:
    """Whether ``stages`` names stage tables of ``txn`` only: the one target's (the one-table form; or
    none, when partitions are placed on shards and none has records waiting), or those of some of the
    routes' tables, each once, in route order."""
    if not state.outbox.many:
        return stages == naming.stage_table(state.target, state.pipeline, txn) or (
            stages == "" and bool(state.outbox.shard_count)
        )
    tables = [naming.table_of_stage(name, state.pipeline, txn) for name in naming.split_stages(stages)]
    return tables == [t for t in state.outbox.tables if t in tables]


def _check_txn(state: CoordinatorState, txn: Txn) -> None:
    if not _names_its_stages(state, txn.id, txn.stage_table):
        raise _broken(txn.id, "its stage table named after it", txn.stage_table)
    if not set(txn.holders) <= set(txn.start) or not set(txn.statuses) <= set(txn.start):
        raise _broken(
            txn.id,
            "holders and WRITE-STATUS of START's partitions only",
            f"holders {sorted(txn.holders)}, statuses {sorted(txn.statuses)}, start {sorted(txn.start)}",
        )
    if txn.buffered_rows != sum(txn.buffered.values()):
        raise _broken(
            txn.id, f"buffered rows {sum(txn.buffered.values())} (the sum per partition)", f"{txn.buffered_rows}"
        )
    _check_phase(state, txn)
    _check_continue(state, txn)
    for tp, ws in txn.statuses.items():
        where = f"{tp.topic}-{tp.partition}"
        if (ws.txn, ws.epoch, ws.tp) != (txn.id, state.epoch, tp):
            raise _broken(
                txn.id,
                f"the WRITE-STATUS of {where} for it, epoch {state.epoch}",
                f"one of {ws.txn}, epoch {ws.epoch}, {ws.topic}-{ws.partition}",
            )
        if tp in txn.holders and ws.sender != txn.holders[tp]:
            raise _broken(txn.id, f"the WRITE-STATUS of {where} from its holder {txn.holders[tp]}", ws.sender)
        if ws.start_offset != txn.start[tp] or ws.end_offset < ws.start_offset or ws.errors:
            raise _broken(
                txn.id,
                f"the WRITE-STATUS of {where} in [{txn.start[tp]}, ...) without errors",
                f"[{ws.start_offset}, {ws.end_offset}), errors {list(ws.errors)}",
            )


def _check_phase(state: CoordinatorState, txn: Txn) -> None:
    phase = txn.phase
    ended = phase is not Phase.COLLECTING
    if ended != (txn.end_message is not None):
        raise _broken(
            txn.id,
            f"an END sent exactly when past collecting ({phase.value})",
            f"END {'sent' if txn.end_message else 'not sent'}",
        )
    if ended and CONTINUE in txn.start.values():
        raise _broken(txn.id, f"explicit start offsets once ended ({phase.value})", "a CONTINUE start")
    if phase is Phase.ENDING and txn.complete:
        raise _broken(txn.id, "a WRITE-STATUS missing while ending", "every one in")
    if phase not in OPEN and not txn.complete:
        raise _broken(txn.id, f"every WRITE-STATUS in once {phase.value}", f"{txn.missing} missing")
    if phase is Phase.COMMITTING and txn.commit_seq != state.head_seq + 1:
        raise _broken(
            txn.id, f"commit slot {state.head_seq + 1} (the head's next) while committing", f"{txn.commit_seq}"
        )
    if phase not in (Phase.COMMITTING, Phase.PUBLISHING) and txn.commit_seq:
        raise _broken(txn.id, f"no commit slot while {phase.value}", f"{txn.commit_seq}")
    if txn.publish_in_flight and phase is not Phase.PUBLISHING:
        raise _broken(txn.id, "a publish in flight only once committed", phase.value)


def _check_continue(state: CoordinatorState, txn: Txn) -> None:
    """A ``CONTINUE`` start is filled in by the WRITE-STATUS of the txn it is chained to, still due."""
    waiting = sorted(tp for tp, o in txn.start.items() if o == CONTINUE)
    if not waiting:
        return
    parent = state.txn(txn.after) if txn.chained and txn.after else None
    if parent is None:
        raise _broken(
            txn.id, "CONTINUE starts only when chained to a txn in flight", f"chained {txn.chained}, after {txn.after}"
        )
    for tp in waiting:
        if tp not in parent.start or tp in parent.statuses:
            raise _broken(
                txn.id,
                f"a CONTINUE start of {tp.topic}-{tp.partition} awaiting {parent.id}'s WRITE-STATUS",
                "none due" if tp not in parent.start else "it already in",
            )
