"""The participants' figures: counted by each copy (``participant.tally``), carried by its heartbeats,
kept by the leader per copy (``Liveness.figures``) and exported by the leader alone
(``coordinator.participant_metrics``, registered by ``CoordinatorMetrics``)."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest

from coordinator.metrics import CoordinatorMetrics
from participant.tally import Tally
from protocol.coordinator.events import Received
from protocol.messages import Heartbeat, ParticipantFigures, PartitionPosition
from protocol.participant.events import Tick
from protocol.participant.state import ParticipantState
from tests.pure.coordinator_driver import EPOCH, P0, P1, PIPE, T0, TIMING, Driver

FAMILIES = (
    "chtxn_participant_rows_read",
    "chtxn_participant_chunks_staged",
    "chtxn_participant_insert_seconds",
    "chtxn_participant_retries",
)


def beat(sender: str, figures: ParticipantFigures | None, *tps) -> Received:
    positions = tuple(PartitionPosition(topic=tp.topic, partition=tp.partition, position=0, log_end=-1) for tp in tps)
    return Received(Heartbeat(pipeline=PIPE, epoch=EPOCH, txn="", sender=sender, partitions=positions, figures=figures))


def figures(rows: int, chunks: int = 0, inserts: int = 0, seconds: float = 0.0, retries: int = 0) -> ParticipantFigures:
    return ParticipantFigures(
        rows_read=rows, chunks_staged=chunks, inserts=inserts, insert_seconds=seconds, retries=retries
    )


def value(metrics: CoordinatorMetrics, name: str, participant: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"pipeline": "orders", "participant": participant})


# ---- the copy counts, its heartbeat carries ----------------------------------------------------


def test_a_tally_counts_from_many_threads_and_a_heartbeat_carries_it() -> None:
    tally = Tally()

    def insert_many() -> None:
        for _ in range(1000):
            tally.inserted(0.001)
            tally.retried()

    workers = [threading.Thread(target=insert_many) for _ in range(4)]
    for w in workers:
        w.start()
    tally.read(30)
    tally.read(12)
    tally.staged()
    for w in workers:
        w.join()
    assert tally.figures() == figures(42, 1, 4000, 4.0, 4000)

    machine = ParticipantState(
        pipeline=PIPE,
        sender="task-0",
        partitions=[P0],
        chunk_rows=100,
        chunk_bytes=1 << 20,
        heartbeat_interval_s=1.0,
        figures=tally.figures,
    )
    [send] = machine.handle(Tick(), 0.0)
    assert isinstance(send.message, Heartbeat) and send.message.figures == tally.figures()
    tally.read(8)
    [send] = machine.handle(Tick(), 1.0)
    assert send.message.figures.rows_read == 50, "each heartbeat has the figures as they are then"


def test_a_participant_state_without_a_tally_sends_no_figures() -> None:
    machine = ParticipantState(
        pipeline=PIPE, sender="task-0", partitions=[P0], chunk_rows=100, chunk_bytes=1 << 20, heartbeat_interval_s=1.0
    )
    [send] = machine.handle(Tick(), 0.0)
    assert send.message.figures is None


# ---- the leader keeps the latest per copy ------------------------------------------------------


def test_the_leader_keeps_the_latest_figures_of_each_copy_once_per_copy() -> None:
    d = Driver()
    d.at(T0, beat("task-0", figures(10), P0, P1), beat("task-1", figures(5, 1), P1))
    d.at(T0 + 1, beat("task-0", figures(25, 2, 2, 0.5), P0, P1))
    assert d.state.liveness.figures(T0 + 1) == {"task-0": figures(25, 2, 2, 0.5), "task-1": figures(5, 1)}


def test_copies_sending_no_figures_are_not_kept() -> None:
    d = Driver()
    d.at(T0, beat("old-task", None, P0), beat("task-1", figures(3), P1))
    assert d.state.liveness.figures(T0) == {"task-1": figures(3)}
    assert d.state.liveness.copy(P0, "old-task") is not None, "its heartbeat still counts for liveness"


def test_a_copy_silent_for_ten_heartbeat_timeouts_goes() -> None:
    d = Driver()
    d.at(T0, beat("gone", figures(7), P0), beat("stays", figures(1), P1))
    ten = 10 * TIMING.heartbeat_timeout_s
    d.at(T0 + ten - 1, beat("stays", figures(2), P1))
    assert set(d.state.liveness.figures(T0 + ten)) == {"gone", "stays"}
    assert set(d.state.liveness.figures(T0 + ten + 0.5)) == {"stays"}, "gone even with no heartbeat to prune it"
    d.at(T0 + ten + 1, beat("stays", figures(3), P1))
    assert set(d.state.liveness.figures(T0 + ten + 1)) == {"stays"}


# ---- the leader exports them -------------------------------------------------------------------


def test_the_collector_exports_one_series_per_copy_from_the_heartbeats_fed() -> None:
    d = Driver()
    d.at(T0, beat("task-0", figures(120, 3, 4, 0.8, 2), P0), beat("task-1", figures(40, 1, 1, 0.1), P1))
    metrics = CoordinatorMetrics("orders")
    metrics.leading(EPOCH)
    metrics.hear_participants(lambda: d.state.liveness.figures(T0))
    assert value(metrics, "chtxn_participant_rows_read_total", "task-0") == 120
    assert value(metrics, "chtxn_participant_chunks_staged_total", "task-0") == 3
    assert value(metrics, "chtxn_participant_insert_seconds_count", "task-0") == 4
    assert value(metrics, "chtxn_participant_insert_seconds_sum", "task-0") == 0.8
    assert value(metrics, "chtxn_participant_retries_total", "task-0") == 2
    assert value(metrics, "chtxn_participant_rows_read_total", "task-1") == 40
    d.at(T0 + 1, beat("task-0", figures(150, 4, 5, 0.9, 2), P0))
    assert value(metrics, "chtxn_participant_rows_read_total", "task-0") == 150, "read at each scrape"

    series = [
        line.split("{")[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line.startswith("chtxn_participant_")
    ]
    assert sorted(series) == sorted(
        [f"chtxn_participant_{name}_total" for name in ("rows_read", "chunks_staged", "retries")] * 2
        + ["chtxn_participant_insert_seconds_count", "chtxn_participant_insert_seconds_sum"] * 2
    ), "one series per copy and figure: nothing per partition or record"


def test_a_standby_and_a_former_leader_export_the_families_without_series() -> None:
    metrics = CoordinatorMetrics("orders")
    families = {f.name: f for f in metrics.registry.collect() if f.name.startswith("chtxn_participant_")}
    assert set(families) == set(FAMILIES) and all(not f.samples for f in families.values())

    metrics.leading(EPOCH)
    metrics.hear_participants(lambda: {"task-0": figures(9)})
    assert value(metrics, "chtxn_participant_rows_read_total", "task-0") == 9
    metrics.not_leading()
    assert value(metrics, "chtxn_participant_rows_read_total", "task-0") is None
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE chtxn_participant_rows_read_total counter" in text
    assert not [line for line in text.splitlines() if line.startswith("chtxn_participant_")]
