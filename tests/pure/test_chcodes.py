"""ClickHouse error classification and the retry policy built on it (no server needed)."""

from __future__ import annotations

import logging

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError, ProgrammingError

from clients.clickhouse import error_code, is_retryable, retries_told, retry_budget_s, retrying
from protocol import chcodes
from protocol.chcodes import ErrorClass, classify
from protocol.errors import ClickHouseError, ConfigError


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (3, ErrorClass.RETRY),  # UNEXPECTED_END_OF_FILE
        (159, ErrorClass.RETRY),  # TIMEOUT_EXCEEDED
        (202, ErrorClass.RETRY),  # TOO_MANY_SIMULTANEOUS_QUERIES
        (209, ErrorClass.RETRY),  # SOCKET_TIMEOUT
        (210, ErrorClass.RETRY),  # NETWORK_ERROR
        (241, ErrorClass.RETRY),  # MEMORY_LIMIT_EXCEEDED
        (242, ErrorClass.RETRY),  # TABLE_IS_READ_ONLY
        (252, ErrorClass.RETRY),  # TOO_MANY_PARTS
        (285, ErrorClass.RETRY),  # TOO_FEW_LIVE_REPLICAS
        (319, ErrorClass.RETRY),  # UNKNOWN_STATUS_OF_INSERT
        (425, ErrorClass.RETRY),  # SYSTEM_ERROR
        (473, ErrorClass.RETRY),  # DEADLOCK_AVOIDED
        (999, ErrorClass.RETRY),  # KEEPER_EXCEPTION
        (6, ErrorClass.DATA),  # CANNOT_PARSE_TEXT
        (26, ErrorClass.DATA),  # CANNOT_PARSE_QUOTED_STRING
        (27, ErrorClass.DATA),  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        (33, ErrorClass.DATA),  # CANNOT_READ_ALL_DATA: a JSON record cut short
        (38, ErrorClass.DATA),  # CANNOT_PARSE_DATE
        (41, ErrorClass.DATA),  # CANNOT_PARSE_DATETIME
        (53, ErrorClass.DATA),  # TYPE_MISMATCH
        (70, ErrorClass.DATA),  # CANNOT_CONVERT_TYPE
        (72, ErrorClass.DATA),  # CANNOT_PARSE_NUMBER
        (117, ErrorClass.DATA),  # INCORRECT_DATA
        (349, ErrorClass.DATA),  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        (131, ErrorClass.DATA),  # TOO_LARGE_STRING_SIZE: longer than its FixedString
        (306, ErrorClass.DATA),  # TOO_DEEP_RECURSION: JSON nested past input_format_json_max_depth
        (321, ErrorClass.DATA),  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        (395, ErrorClass.DATA),  # FUNCTION_THROW_IF_VALUE_IS_NON_ZERO: a throwIf in a DEFAULT
        (173, ErrorClass.RETRY),  # CANNOT_ALLOCATE_MEMORY
        (60, ErrorClass.PERMANENT),  # UNKNOWN_TABLE
        (62, ErrorClass.PERMANENT),  # SYNTAX_ERROR
        (81, ErrorClass.PERMANENT),  # UNKNOWN_DATABASE
        (164, ErrorClass.PERMANENT),  # READONLY: the user may not write, retrying will not change that
        (497, ErrorClass.PERMANENT),  # ACCESS_DENIED
        (516, ErrorClass.PERMANENT),  # AUTHENTICATION_FAILED
        (0, ErrorClass.PERMANENT),
        (None, ErrorClass.PERMANENT),
        (123456, ErrorClass.PERMANENT),
    ],
)
def test_classify(code: int | None, expected: ErrorClass) -> None:
    assert classify(code) is expected


def test_a_code_is_in_one_class_only() -> None:
    assert not set(chcodes.RETRYABLE) & set(chcodes.DATA)


def test_name_of() -> None:
    assert chcodes.name_of(202) == "TOO_MANY_SIMULTANEOUS_QUERIES"
    assert chcodes.name_of(6) == "CANNOT_PARSE_TEXT"
    assert chcodes.name_of(306) == "TOO_DEEP_RECURSION"
    assert chcodes.name_of(60) == "code 60"


def test_memory_codes_are_retried_and_may_be_one_records() -> None:
    """Out of memory is retried like any load; only the stager may later blame one record for it."""
    assert set(chcodes.MEMORY) == {173, 241}
    for code, name in chcodes.MEMORY.items():
        assert chcodes.is_memory(code) and classify(code) is ErrorClass.RETRY and chcodes.RETRYABLE[code] == name
        assert is_retryable(DatabaseError("Memory limit (total) exceeded", code=code))
    for code in (0, None, 6, 306, 202, 777, 778, 1020):  # MEMORY_RESERVATION_*: the scheduler's, never a record's
        assert not chcodes.is_memory(code)


@pytest.mark.parametrize(
    ("exc", "retryable", "code"),
    [
        (DatabaseError("busy", code=202), True, 202),
        (DatabaseError("no table", code=60), False, 60),
        (DatabaseError("bad row", code=27), False, 27),
        (OperationalError("Error executing HTTP request"), True, 0),  # transport, no code
        (OperationalError("503 after retries", code=60), False, 60),  # a code decides
        (ProgrammingError("wrong call"), False, 0),
        (ConnectionRefusedError(111, "refused"), True, 0),
        (TimeoutError("read timed out"), True, 0),
        (ClickHouseError("wrapped", code=241, retryable=True), True, 241),
        (ValueError("a bug"), False, 0),
    ],
)
def test_is_retryable_and_error_code(exc: BaseException, retryable: bool, code: int) -> None:
    assert is_retryable(exc) is retryable
    assert error_code(exc) == code


class Flaky:
    """Fails with ``errors`` in turn, then returns ``result``."""

    def __init__(self, errors: list[BaseException], result: str = "done") -> None:
        self.errors = list(errors)
        self.calls = 0
        self.result = result

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def test_retrying_retries_retryable_errors_then_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    waits: list[float] = []
    flaky = Flaky([DatabaseError("busy", code=202), OperationalError("connection reset")])
    with caplog.at_level(logging.WARNING, logger="clients.clickhouse"):
        assert retrying(5, "read the head", sleep=waits.append)(flaky) == "done"
    assert flaky.calls == 3
    assert len(waits) == 2 and all(w >= 0 for w in waits)
    logged = [r for r in caplog.records if r.name == "clients.clickhouse"]
    assert [r.code for r in logged] == [202, 0]  # type: ignore[attr-defined]  # set by the log call's extra=
    assert all(r.operation == "read the head" for r in logged)  # type: ignore[attr-defined]  # set by the log call's extra=


def test_retrying_gives_up_with_a_clickhouse_error_naming_the_operation() -> None:
    waits: list[float] = []
    flaky = Flaky([DatabaseError("busy", code=202)] * 3)
    with pytest.raises(ClickHouseError) as info:
        retrying(3, "claim commit slot 7", sleep=waits.append)(flaky)
    assert flaky.calls == 3 and len(waits) == 2
    assert info.value.code == 202 and info.value.retryable
    assert "claim commit slot 7 failed after 3 attempts" in str(info.value)
    assert "TOO_MANY_SIMULTANEOUS_QUERIES" in str(info.value)


def test_the_retry_budget_bounds_every_wait_retrying_makes() -> None:
    waits: list[float] = []
    with pytest.raises(ClickHouseError):
        retrying(8, "claim epoch 6", sleep=waits.append)(Flaky([DatabaseError("Keeper down", code=999)] * 8))
    assert len(waits) == 7 and sum(waits) <= retry_budget_s(8)
    assert retry_budget_s(1) == 0.0 and retry_budget_s(8) == pytest.approx(12.0)  # 0.1 .. 5 s doubling, + jitter


def test_a_retry_is_told_on_the_thread_that_asked_before_each_wait_and_a_failing_listener_stops_nothing() -> None:
    told: list[ClickHouseError] = []
    with retries_told(told.append):
        assert (
            retrying(3, "claim epoch 2", sleep=lambda s: None)(Flaky([DatabaseError("Keeper down", code=999)] * 2))
            == "done"
        )
    assert [(e.code, "claim epoch 2 failed" in str(e)) for e in told] == [(999, True), (999, True)]
    retrying(3, "claim epoch 3", sleep=lambda s: None)(Flaky([DatabaseError("Keeper down", code=999)]))
    assert len(told) == 2, "outside the block nothing is told"

    def broken(error: ClickHouseError) -> None:
        raise RuntimeError("the broker is away")

    with retries_told(broken):
        assert retrying(2, "claim epoch 4", sleep=lambda s: None)(Flaky([DatabaseError("busy", code=202)])) == "done"


def test_retrying_raises_a_permanent_error_at_once() -> None:
    waits: list[float] = []
    flaky = Flaky([DatabaseError("Unknown table", code=60)])
    with pytest.raises(ClickHouseError) as info:
        retrying(5, "read the ledger", sleep=waits.append)(flaky)
    assert flaky.calls == 1 and waits == []
    assert info.value.code == 60 and not info.value.retryable
    assert str(info.value).startswith("read the ledger failed: ClickHouse error 60")


def test_retrying_lets_other_errors_through_unchanged() -> None:
    flaky = Flaky([ConfigError("bad"), ValueError("bug")])
    with pytest.raises(ConfigError):
        retrying(5, "x", sleep=lambda _: None)(flaky)
    with pytest.raises(ValueError):
        retrying(5, "x", sleep=lambda _: None)(flaky)


def test_retrying_as_an_iterator() -> None:
    waits: list[float] = []
    flaky = Flaky([DatabaseError("parts", code=252)])
    for attempt in retrying(4, "insert chunk", sleep=waits.append):
        with attempt:
            flaky()
    assert flaky.calls == 2 and len(waits) == 1

    failing = Flaky([DatabaseError("bad data", code=27)])
    with pytest.raises(ClickHouseError) as info:
        for attempt in retrying(4, "insert chunk", sleep=waits.append):
            with attempt:
                failing()
    assert info.value.code == 27 and classify(info.value.code) is ErrorClass.DATA


def test_retrying_waits_grow_and_stay_bounded() -> None:
    waits: list[float] = []
    with pytest.raises(ClickHouseError):
        retrying(8, "x", initial_s=0.1, max_s=1.0, sleep=waits.append)(Flaky([OperationalError("down")] * 8))
    assert len(waits) == 7
    assert max(waits) <= 1.0 + 0.1  # cap plus jitter
    assert waits[-1] > waits[0]
