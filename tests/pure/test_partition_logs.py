"""When a partition's log is no longer the one the ledger's offsets count in (``protocol.offsets.partition_logs``)."""

from __future__ import annotations

from protocol.coordinator.events import AbortKind, Counted, Txn
from protocol.coordinator.verdict import verdict
from protocol.ledger.rows import LedgerEvent
from protocol.messages import TopicPartition
from protocol.offsets import partition_logs
from protocol.offsets.partition_logs import Accepted, Seen, Stop

TP = TopicPartition(topic="orders", partition=0)
OTHER = TopicPartition(topic="orders", partition=1)


def test_the_same_log_matches_and_an_offset_below_the_log_start_is_a_gap_not_a_mismatch() -> None:
    accepted = Accepted(topic_id="id1", low=0, high=300, slot=1)
    assert partition_logs.mismatches(300, Seen(topic_id="id1", low=0, high=300), accepted) == []
    assert partition_logs.mismatches(100, Seen(topic_id="id1", low=200, high=900), accepted) == []


def test_a_re_created_topic_with_more_records_is_caught_by_its_topic_id() -> None:
    why = partition_logs.mismatches(
        300, Seen(topic_id="id2", low=0, high=500), Accepted(topic_id="id1", low=0, high=300, slot=1)
    )
    assert why == ["its topic was deleted and created again (topic ID id1 when its offsets were recorded, id2 now)"]


def test_an_offset_past_the_log_end_is_a_mismatch_even_without_a_record() -> None:
    why = partition_logs.mismatches(300, Seen(topic_id="", low=0, high=200), None)
    assert len(why) == 1 and "offset 300 is past the log end 200" in why[0]


def test_without_topic_ids_a_log_start_that_moved_back_is_a_mismatch() -> None:
    accepted = Accepted(topic_id="", low=50, high=300, slot=1)
    why = partition_logs.mismatches(300, Seen(topic_id="", low=0, high=400), accepted)
    assert why == ["its log start moved back from 50 to 0 (the log was replaced)"]
    # with topic IDs on both sides the ID decides, not the start
    assert partition_logs.mismatches(300, Seen(topic_id="id1", low=0, high=400), Accepted("id1", 50, 300, 1)) == []


def test_a_broker_without_topic_ids_answers_the_zero_uuid() -> None:
    assert partition_logs.topic_id(partition_logs.NO_TOPIC_ID) == ""
    assert partition_logs.topic_id("AaIfd5RxedKdFDTFi+cZNA") == "AaIfd5RxedKdFDTFi+cZNA"


def _identity(slot: int, topic_id: str, *partitions: int):
    seen = {p: Seen(topic_id=topic_id, low=0, high=10) for p in partitions}
    return partition_logs.identity_row(
        pipeline="p", topic="orders", seen=seen, slot=slot, epoch=1, coordinator="c1", reason="first seen"
    )


def _stop(slot: int, tp: TopicPartition = TP):
    stop = Stop(tp=tp, offset=300, slot=slot, reason="its topic was deleted and created again")
    return partition_logs.stop_row(
        pipeline="p", stop=stop, seen=Seen(topic_id="id2", low=0, high=200), epoch=1, coordinator="c1"
    )


def test_the_latest_identity_row_naming_a_partition_is_the_accepted_one() -> None:
    rows = [_identity(1, "id1", 0, 1), _identity(7, "id2", 0)]
    accepted = partition_logs.accepted_of(rows)
    assert accepted[TP] == Accepted(topic_id="id2", low=0, high=10, slot=7)
    assert accepted[OTHER].topic_id == "id1"
    assert rows[0].event is LedgerEvent.TOPIC and rows[0].claim_id == "id1" and rows[0].txn == ""


def test_a_stop_holds_until_an_identity_row_of_a_later_slot_names_the_partition() -> None:
    assert set(partition_logs.stops_of([_identity(1, "id1", 0, 1), _stop(5)])) == {TP}
    assert partition_logs.stops_of([_identity(1, "id1", 0, 1), _stop(5), _identity(5, "id1", 0)]) != {}
    assert partition_logs.stops_of([_identity(1, "id1", 0, 1), _stop(5), _identity(6, "id2", 0)]) == {}
    # a reset of partition 1 does not lift partition 0's stop
    assert set(partition_logs.stops_of([_identity(1, "id1", 0, 1), _stop(5), _identity(6, "id2", 1)])) == {TP}


def test_a_partition_stopped_again_after_a_reset_lifted_its_first_stop_is_stopped() -> None:
    """Found by the change soak: a topic re-created twice, reset in between. The leader kept the
    partition stopped, but status, doctor and the gauge read the first stop, lifted, and said OK."""
    rows = [_identity(1, "id1", 0, 1), _stop(5), _identity(8, "id2", 0, 1), _stop(12), _stop(13)]
    stops = partition_logs.stops_of(rows)
    assert set(stops) == {TP} and stops[TP].slot == 12
    assert partition_logs.stops_of([*rows, _identity(14, "id3", 0, 1)]) == {}


def test_the_stop_is_kept_as_first_recorded() -> None:
    stops = partition_logs.stops_of([_stop(5), _stop(6)])
    assert stops[TP].slot == 5 and stops[TP].offset == 300


def test_two_leaders_recording_the_same_thing_at_one_slot_use_one_token() -> None:
    assert partition_logs.token("p", _identity(3, "id1", 0, 1)) == partition_logs.token("p", _identity(3, "id1", 0, 1))
    assert partition_logs.token("p", _identity(3, "id1", 0, 1)) != partition_logs.token("p", _identity(3, "id1", 0))
    assert partition_logs.token("p", _stop(3)) != partition_logs.token("p", _identity(3, "id2", 0))


def test_the_check_fails_naming_each_stopped_partition_and_the_fix() -> None:
    assert partition_logs.stops_check({}).status == "ok"
    one = partition_logs.stops_check(partition_logs.stops_of([_stop(5)]))
    assert one.status == "fail"
    assert "orders/0: its topic was deleted and created again" in one.found
    assert "chtxn pause" in one.fix and "chtxn reset --partition orders/0 --to-earliest" in one.fix
    two = partition_logs.stops_check(partition_logs.stops_of([_stop(5), _stop(5, OTHER)]))
    assert "2 partitions stopped" in two.found and "--partition TOPIC/N" in two.fix


def test_a_txn_that_read_a_re_created_topic_aborts_before_the_commit_point() -> None:
    txn = Txn(id="e1_t1", stage_table="s", start={TP: 0}, created_at=0.0)
    found = verdict(txn, Counted("e1_t1", None, log_changed="topic orders was deleted and created again"), lambda tp: 0)
    assert found == ("topic orders was deleted and created again", AbortKind.LOG_CHANGED)


def test_the_stopped_gauge_names_each_stopped_partition_and_forgets_the_others() -> None:
    from coordinator.metrics import CoordinatorMetrics

    metrics = CoordinatorMetrics("p")

    def stopped() -> dict[tuple[str, str], float]:
        return {
            (s.labels["topic"], s.labels["partition"]): s.value
            for f in metrics.registry.collect()
            if f.name == "chtxn_partition_stopped"
            for s in f.samples
        }

    metrics.set_stopped([TP, OTHER])
    assert stopped() == {("orders", "0"): 1.0, ("orders", "1"): 1.0}
    metrics.set_stopped([OTHER])
    assert stopped() == {("orders", "1"): 1.0}
    metrics.not_leading()
    assert stopped() == {}
