"""What ``/ready`` answers for each thing a coordinator replica can be doing (coordinator.readiness)."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.readiness import Readiness, one_line


@dataclass
class LeaderState:
    ready: bool = False
    stepped_down: bool = False
    stopping: bool = False


def test_a_replica_is_not_ready_until_it_reaches_clickhouse_and_the_broker() -> None:
    answer = Readiness().answer()
    assert (answer.status, answer.line) == (503, "not ready: starting (connecting to ClickHouse and the broker)")


def test_a_standby_is_ready_while_its_clickhouse_ping_answers() -> None:
    readiness = Readiness()
    readiness.standby()
    assert (readiness.answer().status, readiness.answer().line) == (200, "ready: standby")
    readiness.clickhouse("no answer from http://ch:8123 within 2 s")
    assert readiness.answer().status == 503
    assert (
        readiness.answer().line
        == "not ready: standby cannot reach ClickHouse: no answer from http://ch:8123 within 2 s"
    )
    readiness.clickhouse("")
    assert readiness.answer().ready


def test_a_leader_is_ready_once_its_take_over_is_done_and_until_it_stops_leading() -> None:
    readiness, state = Readiness(), LeaderState()
    readiness.standby()
    readiness.leading(7, state)
    assert (readiness.answer().status, readiness.answer().line) == (
        503,
        "not ready: taking over as the leader of epoch 7",
    )
    state.ready = True
    assert (readiness.answer().status, readiness.answer().line) == (200, "ready: leader of epoch 7")
    state.stepped_down = True
    assert readiness.answer().line == "not ready: stepping down from epoch 7"
    readiness.standby()
    assert readiness.answer().line == "ready: standby"


def test_a_stopping_leader_is_not_ready() -> None:
    readiness, state = Readiness(), LeaderState(ready=True)
    readiness.leading(3, state)
    state.stopping = True
    assert (readiness.answer().status, readiness.answer().line) == (503, "not ready: stopping (the leader of epoch 3)")
    readiness.stopping()
    assert readiness.answer().line == "not ready: stopping"


def test_a_failure_is_named_on_one_line_until_the_replica_is_back() -> None:
    readiness = Readiness()
    readiness.leading(2, LeaderState(ready=True))
    readiness.failed("cannot connect to ClickHouse at http://ch:8123:\n  Connection refused\n")
    answer = readiness.answer()
    assert answer.status == 503
    assert (
        answer.line
        == "not ready: restarting after an error: cannot connect to ClickHouse at http://ch:8123: Connection refused"
    )
    readiness.standby()
    assert readiness.answer().ready


def test_one_line_flattens_and_bounds_the_text() -> None:
    assert one_line("a\n  b\tc ") == "a b c"
    assert one_line("x" * 500, limit=20) == "x" * 17 + "..."
