"""The participant job's failure handling without Spark: exit codes, a task's error crossing Spark's
text, riding out an outage (one line per attempt, then the cause), quiet logs, the Spark UI names."""

from __future__ import annotations

import json
import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from clients.kafka import BrokerUnreachable
from clients.logs import JsonFormatter, RepeatFilter
from participant.job_errors import (
    ExitCode,
    OutageError,
    SparkUnavailable,
    TaskEnded,
    TaskFatal,
    describe,
    exit_code,
    failure_line,
    fatal,
    fatal_in,
    task_errors,
)
from participant.outage import Outage, is_outage, ride_out
from participant.spark_context import LOG4J2, job_names
from protocol.errors import ClickHouseError, ConfigError, SetupError

#: What Spark's Py4JJavaError says when a task raised ``TaskFatal`` four times (tracebacks hidden).
SPARK_FAILURE = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from the Python "
    "worker: participant.job_errors.TaskFatal: [chtxn exit 3] target table db.events does not exist: create it\n"
    " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException("
    "PythonRunner.scala:1097)\n\tat org.apache.spark.scheduler.Task.run(Task.scala:147)\n"
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("bad"), ExitCode.CONFIG),
        (SetupError("control topic has 3 partitions"), ExitCode.SETUP),
        (BrokerUnreachable("cannot reach a Kafka broker"), ExitCode.OUTAGE),
        (OutageError("gone", service="ClickHouse", seconds=180), ExitCode.OUTAGE),
        (SparkUnavailable("no master"), ExitCode.SPARK),
        (ClickHouseError("authentication failed", code=516), ExitCode.SETUP),
        (ClickHouseError("connection refused", retryable=True), ExitCode.OUTAGE),
        (KafkaException(KafkaError(KafkaError._INVALID_ARG, "No such configuration property: x")), ExitCode.CONFIG),
        (TaskEnded(ExitCode.SETUP, "table gone"), ExitCode.SETUP),
        (RuntimeError("a bug"), ExitCode.INTERNAL),
    ],
)
def test_each_error_that_ends_the_job_has_its_exit_code(error: BaseException, code: ExitCode) -> None:
    assert exit_code(error) is code


def test_a_tasks_fatal_error_is_found_in_sparks_text_as_one_line() -> None:
    raised = fatal(SetupError("target table db.events does not exist:\n  create it"))
    assert isinstance(raised, TaskFatal)
    assert str(raised) == "[chtxn exit 3] target table db.events does not exist: create it"
    assert fatal_in(SPARK_FAILURE) == (ExitCode.SETUP, "target table db.events does not exist: create it")
    assert fatal_in("An error occurred while calling o42.collect.\n: java.lang.OutOfMemoryError") is None
    assert fatal(RuntimeError("a bug")) is None, "a bug is retried by Spark, not turned into an exit code"


def test_a_spark_failure_without_a_chtxn_error_is_one_line_naming_its_cause() -> None:
    assert failure_line(RuntimeError(SPARK_FAILURE)).startswith("participant.job_errors.TaskFatal: [chtxn exit 3]")
    crashed = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 0.0 failed 4 times\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)\n"
    )
    assert failure_line(RuntimeError(crashed)) == "Job aborted due to stage failure: Task 1 in stage 0.0 failed 4 times"
    assert describe(RuntimeError(crashed)) == failure_line(RuntimeError(crashed))
    refused = KafkaException(KafkaError(KafkaError._INVALID_ARG, "No such configuration property: x"))
    assert describe(refused) == (
        "the Kafka client refused its configuration: No such configuration property: x; check [kafka.properties]"
    )


def test_task_errors_turns_setup_errors_into_task_fatal_and_logs_a_bug_once(caplog) -> None:
    log = logging.getLogger("test.task")
    with pytest.raises(TaskFatal, match=r"^\[chtxn exit 2\] bad value$"), task_errors(log, "t1"):
        raise ConfigError("bad value")
    assert caplog.records == [], "a fatal error is the driver's to print"
    with pytest.raises(ZeroDivisionError), task_errors(log, "t1"):
        1 / 0  # noqa: B018 -- the bug under test
    (record,) = caplog.records
    assert record.exc_info is not None and "participant task t1 failed" in record.getMessage()


def test_ride_out_logs_one_line_per_attempt_and_gives_up_naming_the_cause(caplog) -> None:
    clock = FakeClock()
    calls = []

    def unreachable() -> None:
        calls.append(clock.now)
        clock.now += 0.5  # each attempt takes a while
        raise ClickHouseError("cannot connect to ClickHouse at http://h:1: Connection refused", retryable=True)

    caplog.set_level(logging.WARNING, logger="chtxn.participant.outage")
    with pytest.raises(OutageError) as raised:
        ride_out(unreachable, timeout_s=20, clock=clock, wait=clock.sleep)
    assert calls == [0.0, 1.5, 4.0, 8.5, 17.0, 20.0], "back-off doubles; the last try is at the deadline"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(calls) - 1, lines
    assert lines[0].startswith("ClickHouse unreachable for 0 s (attempt 1): cannot connect to ClickHouse at http://h:1")
    assert "retrying in 1 s, giving up after 20 s" in lines[0]
    assert str(raised.value) == (
        "cannot connect to ClickHouse at http://h:1: Connection refused; gave up after 20 s and 6 attempts "
        "(participant.outage_timeout_s = 20)"
    )
    assert raised.value.service == "ClickHouse" and exit_code(raised.value) is ExitCode.OUTAGE


def test_ride_out_returns_once_the_service_answers_and_raises_other_errors_at_once() -> None:
    clock = FakeClock()
    answers = iter([BrokerUnreachable("no broker"), BrokerUnreachable("no broker"), "partitions"])

    def flaky() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert ride_out(flaky, timeout_s=60, clock=clock, wait=clock.sleep) == "partitions"
    with pytest.raises(SetupError, match="3 partitions"):
        ride_out(lambda: (_ for _ in ()).throw(SetupError("control topic has 3 partitions")), timeout_s=60)


def test_what_counts_as_an_outage() -> None:
    assert is_outage(BrokerUnreachable("x")) and is_outage(ClickHouseError("x", retryable=True))
    assert is_outage(KafkaException(KafkaError(KafkaError._TRANSPORT, "down")))
    assert not is_outage(ClickHouseError("unknown table", code=60))
    assert not is_outage(SetupError("missing topic"))
    assert not is_outage(KafkaException(KafkaError(KafkaError._INVALID_ARG, "bad property")))


def test_an_outage_that_ends_starts_over() -> None:
    outage = Outage(10)
    outage.failed(BrokerUnreachable("x"), 0.0)
    outage.ok()
    assert outage.failed(BrokerUnreachable("x"), 100.0) == 0.0
    with pytest.raises(OutageError, match="gave up after 10 s and 2 attempts"):
        outage.failed(BrokerUnreachable("x"), 110.0)


def test_librdkafka_lines_repeat_once_per_window_whatever_their_numbers() -> None:
    clock = FakeClock()
    repeat = RepeatFilter(clock)

    def passes(message: str) -> bool:
        return repeat.filter(logging.makeLogRecord({"msg": message}))

    assert passes("Connect to ipv4#127.0.0.1:9 failed (after 0ms in state CONNECT)")
    assert not passes("Connect to ipv4#127.0.0.1:9 failed (after 12ms in state CONNECT)")
    assert passes("1/1 brokers are down")
    clock.now += RepeatFilter.WINDOW_S
    assert passes("Connect to ipv4#127.0.0.1:9 failed (after 3ms in state CONNECT)")


def test_the_json_formatter_is_the_coordinators() -> None:
    from coordinator.logs import JsonFormatter as CoordinatorFormatter

    assert CoordinatorFormatter is JsonFormatter
    record = logging.makeLogRecord({"name": "chtxn.participant.job", "levelname": "WARNING", "msg": "x", "txn": "t"})
    entry = json.loads(JsonFormatter().format(record))
    assert entry["logger"] == "chtxn.participant.job" and entry["msg"] == "x" and entry["txn"] == "t"


def test_the_spark_ui_names_the_pipeline_and_each_tasks_partitions() -> None:
    name, description = job_names("orders", 2, [(("orders", 0), ("orders", 2)), (("orders", 1),)])
    assert name == "chtxn orders: 2 participant tasks"
    assert description == (
        "chtxn orders participants (submission 2): 3 partitions; task 0: orders/0, orders/2; task 1: orders/1"
    )
    _, long = job_names("big", 1, [tuple(("t", p) for p in range(i, 600, 4)) for i in range(4)])
    assert len(long) == 1000 and long.endswith("...")


def test_the_driver_jvm_logs_warn_and_a_failed_task_without_its_stack() -> None:
    settings = dict(line.split(" = ", 1) for line in LOG4J2.splitlines() if " = " in line and not line.startswith("#"))
    assert settings["rootLogger.level"] == "warn"
    assert settings["logger.executor.name"] == "org.apache.spark.executor.Executor"
    assert settings["logger.tasks.name"] == "org.apache.spark.scheduler.TaskSetManager"
    assert settings["appender.brief.layout.alwaysWriteExceptions"] == "false"
