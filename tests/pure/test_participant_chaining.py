"""Continuous txns in the participant state machine: an END that carries the next START.

END with ``next`` cuts the open chunk, keeps the ended txn until its chunks are staged (then its
WRITE-STATUS goes out, oldest txn first per partition) and reads on into the next txn from the
cut, without Pause, Seek or Resume. ``CONTINUE`` is followed only by the copy that read the
partition to that END. Events in, exact action lists out.
"""

from __future__ import annotations

from protocol.messages import (
    CONTINUE,
    EndCommit,
    Heartbeat,
    PartitionHolder,
    PartitionOffset,
    PartitionPosition,
    StartCommit,
    TopicPartition,
)
from protocol.participant.events import (
    DropTxn,
    PartitionFailed,
    Pause,
    Received,
    Seek,
    Send,
    Tick,
)
from protocol.participant.state import ParticipantState
from tests.pure.test_participant_state import (
    TP0,
    TP1,
    P,
    abort,
    end,
    machine,
    polled,
    staged,
    stages,
    start,
    status,
)


def end_next(
    txn: str,
    nxt: str,
    offsets: dict[TopicPartition, int],
    *,
    epoch: int = 1,
    holders: dict[TopicPartition, str] | None = None,
) -> Received:
    """END of ``txn`` carrying the START of ``nxt`` (offsets ``CONTINUE`` or explicit)."""
    start_next = StartCommit(
        pipeline=P,
        epoch=epoch,
        txn=nxt,
        sender="coord",
        stage_table=f"t__chtxn_{nxt}",
        offsets=tuple(PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in offsets.items()),
        holders=tuple(
            PartitionHolder(topic=tp.topic, partition=tp.partition, sender=s) for tp, s in (holders or {}).items()
        ),
    )
    return Received(EndCommit(pipeline=P, epoch=epoch, txn=txn, sender="coord", next=start_next))


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def beat(txn: str, *positions: PartitionPosition, epoch: int = 1) -> Send:
    return Send(Heartbeat(pipeline=P, epoch=epoch, txn=txn, sender="task-0", partitions=positions, continues=True))


def pos(tp: TopicPartition, position: int, buffered: int = 0, log_end: int = -1) -> PartitionPosition:
    return PartitionPosition(
        topic=tp.topic, partition=tp.partition, position=position, log_end=log_end, buffered_rows=buffered
    )


# ---- END with next --------------------------------------------------------------------


def test_end_with_next_reads_on_without_pause_or_seek_and_reports_the_ended_txn_once_staged():
    m = machine()
    assert m.handle(start("e1_t1", {TP0: 10}), 0) == [Seek("src", 0, 10)]
    assert stages(m.handle(polled(TP0, 10, 11, 12), 0)) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-12", [10, 11])]
    acts = m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE}), 0)
    assert kinds(acts) == ["StageChunk"]  # the cut of the open chunk; no Pause, Seek or Resume
    assert stages(acts) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/1/12-13", [12])]
    assert m.consuming and (m.current, m.current_open) == ("e1_t2", True)
    # txn 2 is staged from the cut while txn 1's chunks are still in flight
    assert stages(m.handle(polled(TP0, 13, 14), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/13-15", [13, 14])]
    assert m.handle(staged("e1_t1", TP0, 0, 2), 0) == []
    assert m.handle(staged("e1_t2", TP0, 0, 2), 0) == []  # txn 2 is not ended
    assert m.handle(staged("e1_t1", TP0, 1, 1), 0) == [status("e1_t1", TP0, 10, 13, 3, 2)]
    assert m.handle(Tick({TP0: 20}), 0) == [beat("e1_t2", pos(TP0, 15, buffered=2, log_end=20), pos(TP1, -1))]
    acts = m.handle(end("e1_t2"), 0)  # an END that goes alone
    assert acts == [status("e1_t2", TP0, 13, 15, 2, 1)] and not m.consuming


def test_partitions_with_nothing_in_flight_at_a_chained_end_continue_too():
    """An idle partition, or one whose chunks are all staged, reports its WRITE-STATUS at END
    itself and must still go on into the next txn from the cut."""
    m = machine()
    m.handle(start("e1_t1", {TP0: 10, TP1: 20}), 0)
    m.handle(polled(TP0, 10, 11), 0)  # chunk 0 cut ...
    assert m.handle(staged("e1_t1", TP0, 0, 2), 0) == []  # ... and staged before END
    acts = m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: CONTINUE}), 0)
    assert acts == [status("e1_t1", TP0, 10, 12, 2, 1), status("e1_t1", TP1, 20, 20, 0, 0)]  # no Pause
    assert m.consuming
    assert stages(m.handle(polled(TP0, 12, 13), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/12-14", [12, 13])]
    assert stages(m.handle(polled(TP1, 20, 21), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/1/0/20-22", [20, 21])]


def test_write_status_of_one_partition_go_out_in_txn_order():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)
    assert stages(m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE}), 0)) == [
        ("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-11", [10])
    ]
    m.handle(polled(TP0, 11), 0)
    assert stages(m.handle(end_next("e1_t2", "e1_t3", {TP0: CONTINUE}), 0)) == [
        ("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/11-12", [11])
    ]
    assert m.handle(staged("e1_t2", TP0, 0, 1), 0) == []  # txn 1 has not reported yet
    assert m.handle(staged("e1_t1", TP0, 0, 1), 0) == [
        status("e1_t1", TP0, 10, 11, 1, 1),
        status("e1_t2", TP0, 11, 12, 1, 1),
    ]
    assert stages(m.handle(polled(TP0, 12, 13), 0)) == [("t__chtxn_e1_t3", "pl/e1_t3/src/0/0/12-14", [12, 13])]


def test_a_new_partition_in_a_chained_start_joins_at_its_explicit_offset():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)
    acts = m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: 30}), 0)
    assert kinds(acts) == ["StageChunk", "Seek"] and acts[1] == Seek("src", 1, 30)
    assert stages(m.handle(polled(TP1, 30), 0)) == []  # 1 row open in txn 2
    assert stages(m.handle(polled(TP0, 11, 12), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/11-13", [11, 12])]


# ---- CONTINUE that cannot be followed -------------------------------------------------


def test_continue_for_a_partition_this_copy_did_not_read_to_end_is_not_joined_and_paused():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10, TP1: 20}), 0)
    assert m.handle(end("e1_t1"), 0) == [status("e1_t1", TP0, 10, 10, 0, 0), status("e1_t1", TP1, 20, 20, 0, 0)]
    # The START of e1_t2 never reached this copy; the END of e1_t2 chains e1_t3.
    acts = m.handle(end_next("e1_t2", "e1_t3", {TP0: CONTINUE, TP1: 25}), 0)
    assert acts == [Seek("src", 1, 25), Pause((TP0,))]
    assert m.handle(polled(TP0, 10, 11), 0) == []  # not staged
    assert stages(m.handle(polled(TP1, 25, 26), 0)) == [("t__chtxn_e1_t3", "pl/e1_t3/src/1/0/25-27", [25, 26])]
    assert m.handle(end("e1_t3"), 0) == []  # no WRITE-STATUS for TP0; TP1's chunk is in flight


def test_a_restarted_copy_joins_only_the_explicit_partitions_of_a_chained_start():
    m = machine()  # started after the START of e1_t1 went out
    assert m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: 25}), 0) == [Seek("src", 1, 25)]
    assert m.handle(polled(TP0, 5), 0) == []


def test_continue_for_a_partition_that_failed_in_the_ended_txn_is_not_joined():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10, TP1: 20}), 0)
    assert m.handle(PartitionFailed("src", 1, "offset 20 out of range"), 0) == [Pause((TP1,))]
    m.handle(polled(TP0, 10), 0)
    acts = m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: CONTINUE}), 0)
    assert stages(acts[:1]) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-11", [10])]
    assert acts[1:] == [status("e1_t1", TP1, 20, 20, 0, 0, errors=["offset 20 out of range"])]
    assert m.handle(polled(TP1, 20), 0) == []  # TP1 stays out of txn 2


def test_a_copy_fenced_by_holders_in_a_chained_start_stands_down():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10, TP1: 20}), 0)
    m.handle(polled(TP0, 10), 0)
    m.handle(polled(TP1, 20), 0)
    acts = m.handle(
        end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: CONTINUE}, holders={TP0: "task-0", TP1: "task-0-other-copy"}), 0
    )
    assert stages(acts[:2]) == [
        ("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-11", [10]),
        ("t__chtxn_e1_t1", "pl/e1_t1/src/1/0/20-21", [20]),
    ]
    assert acts[2:] == [Pause((TP1,))]
    assert m.handle(staged("e1_t1", TP1, 0, 1), 0) == [status("e1_t1", TP1, 20, 21, 1, 1)]  # txn 1 was read here
    assert m.handle(polled(TP1, 21), 0) == []  # delivered anyway: not staged
    assert stages(m.handle(polled(TP0, 11, 12), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/11-13", [11, 12])]


# ---- aborts ---------------------------------------------------------------------------


def test_an_abort_of_the_ended_txn_drops_the_chained_one_too_and_the_next_start_seeks():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)
    m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE}), 0)
    assert stages(m.handle(polled(TP0, 11, 12), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/11-13", [11, 12])]
    assert m.handle(abort("e1_t1"), 0) == [DropTxn("e1_t1"), DropTxn("e1_t2"), Pause((TP0,))]
    assert not m.consuming
    assert m.handle(staged("e1_t1", TP0, 0, 1), 0) == []  # outcomes of dropped chunks
    assert m.handle(staged("e1_t2", TP0, 0, 2), 0) == []
    assert m.handle(abort("e1_t2"), 0) == []  # the coordinator's cascade ABORT: already dropped
    assert m.handle(start("e1_t3", {TP0: 10}), 0) == [Seek("src", 0, 10)]  # explicit, from the ledger head
    assert stages(m.handle(polled(TP0, 10, 11), 0)) == [("t__chtxn_e1_t3", "pl/e1_t3/src/0/0/10-12", [10, 11])]


def test_an_abort_of_the_chained_txn_alone_keeps_the_ended_one_reporting():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)
    m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE}), 0)
    m.handle(polled(TP0, 11), 0)
    assert m.handle(abort("e1_t2"), 0) == [DropTxn("e1_t2"), Pause((TP0,))]
    assert m.handle(staged("e1_t1", TP0, 0, 1), 0) == [status("e1_t1", TP0, 10, 11, 1, 1)]


# ---- the size trigger -----------------------------------------------------------------


def test_a_heartbeat_goes_out_at_once_each_time_a_partition_crosses_its_share_of_the_size_trigger():
    m = ParticipantState(
        pipeline=P,
        sender="task-0",
        partitions=[TP0, TP1],
        chunk_rows=100,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
        size_trigger_rows=8,
    )
    assert m.handle(Tick(), 0.0) == [beat("", pos(TP0, -1), pos(TP1, -1), epoch=0)]
    m.handle(start("e1_t1", {TP0: 0, TP1: 0}), 0.05)  # two partitions: a share is 4 rows
    assert m.handle(polled(TP0, 0, 1, 2), 0.1) == []
    assert m.handle(polled(TP0, 3), 0.2) == [beat("e1_t1", pos(TP0, 4, buffered=4), pos(TP1, 0))]
    assert not m.heartbeat_due(1.0) and m.heartbeat_due(1.2)  # the interval counts from this beat
    assert m.handle(polled(TP0, 4, 5, 6), 0.3) == []
    assert m.handle(polled(TP0, 7, 8), 0.4) == [beat("e1_t1", pos(TP0, 9, buffered=9), pos(TP1, 0))]
    assert m.handle(polled(TP1, 0, 1, 2, 3), 0.5) == [beat("e1_t1", pos(TP0, 9, buffered=9), pos(TP1, 4, buffered=4))]
    assert m.handle(Tick(), 1.0) == []
    # The chained txn counts its own rows from the cut.
    acts = m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: CONTINUE}), 0.6)
    assert kinds(acts) == ["StageChunk", "StageChunk"]
    assert m.handle(polled(TP0, 9, 10, 11), 0.7) == []
    assert m.handle(polled(TP0, 12), 0.8) == [beat("e1_t2", pos(TP0, 13, buffered=4), pos(TP1, 4))]


def test_a_partition_past_its_share_of_the_size_trigger_by_the_slack_stops_reading_until_end():
    """Share 10 rows (trigger 20, two partitions), slack 20%: reading waits at 12 rows per
    partition, so a txn ended by the trigger holds at most 24 rows (to a poll batch)."""
    m = ParticipantState(
        pipeline=P,
        sender="task-0",
        partitions=[TP0, TP1],
        chunk_rows=100,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
        size_trigger_rows=20,
    )
    m.handle(start("e1_t1", {TP0: 0, TP1: 0}), 0.0)
    m.handle(polled(TP0, *range(12)), 0.1)
    assert m.consuming  # TP1 still has room
    m.handle(polled(TP1, *range(11)), 0.2)
    assert m.consuming
    m.handle(polled(TP1, 11), 0.3)
    assert not m.consuming  # both full: the runner polls no more
    m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE, TP1: CONTINUE}), 0.4)
    assert m.consuming  # the next txn reads on from the cut


def test_a_full_partition_says_so_at_once_and_reads_on_into_the_next_txn():
    """Issue 29, defect 7: one hot partition of four, trigger 40 (a share of 10 rows, full at
    12). It reports its share and then its being full at once, so the leader ends the txn without
    waiting for the interval; the END's next START lets it read on from the cut."""
    tps = [TopicPartition(topic="src", partition=i) for i in range(4)]
    m = ParticipantState(
        pipeline=P,
        sender="task-0",
        partitions=tps[:1],
        chunk_rows=100,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
        size_trigger_rows=40,
    )  # a task per partition, as Spark runs them
    m.handle(start("e1_t1", dict.fromkeys(tps, 0)), 0.0)
    reports = []
    for offset in range(12):
        acts = m.handle(polled(tps[0], offset), 0.1 + offset / 1000)
        reports += [a.message.partitions[0].buffered_rows for a in acts if isinstance(a, Send)]
    assert reports == [10, 12]
    assert not m.consuming  # full: it waits for END
    m.handle(end_next("e1_t1", "e1_t2", dict.fromkeys(tps, CONTINUE)), 0.2)
    assert m.consuming
