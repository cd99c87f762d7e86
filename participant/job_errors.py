"""The participant job's errors, its exit codes, and how a task's error crosses Spark to the driver.

Exit codes of ``chtxn participant`` and of ``participant/job.py`` (``ExitCode``):

- 0: stopped (SIGTERM, Ctrl-C);
- 1: an internal error (a bug), or Spark failed the job for a reason chtxn does not know;
- 2: config error (the pipeline file, a ``CHTXN_*`` variable, ``[kafka.properties]``);
- 3: setup error: a topic or table missing or wrong (control topic partitions, target table);
- 4: outage: ClickHouse or the Kafka broker unreachable for longer than ``participant.outage_timeout_s``;
- 5: Spark: the master cannot be reached, or the job cannot get its task slots.

Each ends with one line ``chtxn: <what is wrong and what to do>`` on stderr.

A task's fatal error reaches the driver as text inside Spark's: a ``Py4JJavaError`` around the JVM's
``PythonException`` around the Python exception. So a task raises ``TaskFatal``, whose text is one
line ``[chtxn exit N] <message>``, and the driver finds it there (``fatal_in``) instead of parsing
a stack trace.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum

from protocol.errors import ChtxnError, ClickHouseError, ConfigError, SetupError


class ExitCode(IntEnum):
    STOPPED = 0
    INTERNAL = 1
    CONFIG = 2
    SETUP = 3
    OUTAGE = 4
    SPARK = 5


class OutageError(ChtxnError):
    """A service stayed unreachable longer than ``participant.outage_timeout_s``."""

    def __init__(self, message: str, *, service: str, seconds: float) -> None:
        super().__init__(message)
        self.service, self.seconds = service, seconds


class SparkUnavailable(ChtxnError):
    """Spark cannot run the job: its master cannot be reached, or it gives too few task slots."""


class TaskEnded(ChtxnError):
    """A task's ``TaskFatal`` as the driver read it in Spark's failure; ``code`` is the exit code it named."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class TaskFatal(Exception):
    """Raised by a task for an error no retry of it can mend; its text is ``[chtxn exit N] <one line>``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(f"[chtxn exit {int(code)}] {one_line(message)}")
        self.code, self.message = code, one_line(message)


def exit_code(error: BaseException) -> ExitCode:
    """The exit code for an error that ends the job."""
    from clients.kafka import BrokerUnreachable

    if isinstance(error, TaskEnded):
        return error.code
    if isinstance(error, ConfigError):
        return ExitCode.CONFIG
    if isinstance(error, (OutageError, BrokerUnreachable)):
        return ExitCode.OUTAGE
    if isinstance(error, SparkUnavailable):
        return ExitCode.SPARK
    if isinstance(error, SetupError):
        return ExitCode.SETUP
    if isinstance(error, ClickHouseError):  # what is left after retries: a refusal (a user, a database)
        return ExitCode.OUTAGE if error.retryable else ExitCode.SETUP
    if _kafka_refusal(error):
        return ExitCode.CONFIG
    return ExitCode.INTERNAL


def describe(error: BaseException) -> str:
    """The one line to print for an error that ends the job."""
    if refusal := _kafka_refusal(error):
        return f"the Kafka client refused its configuration: {refusal}; check [kafka.properties]"
    if not isinstance(error, ChtxnError):  # a Py4J error holds the JVM's stack: its cause's line only
        return failure_line(error)
    return one_line(str(error)) or type(error).__name__


def fatal(error: BaseException) -> TaskFatal | None:
    """What a task raises instead of ``error`` when no retry of the task can mend it, else None."""
    code = exit_code(error)
    if code in (ExitCode.INTERNAL, ExitCode.STOPPED):
        return None
    return TaskFatal(code, describe(error))


def _kafka_refusal(error: BaseException) -> str:
    """librdkafka's reason when it refused a client's configuration, else ""."""
    from confluent_kafka import KafkaError, KafkaException

    kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else None
    if isinstance(kafka_error, KafkaError) and kafka_error.code() == KafkaError._INVALID_ARG:
        return str(kafka_error.str())
    return ""


_FATAL = re.compile(r"\[chtxn exit (\d)\] ([^\r\n]*)")
_PYTHON = re.compile(r"An exception was thrown from the Python worker: ([^\r\n]*)")
_CAUSE = re.compile(r"^(?:[\w.$]+(?:Exception|Error): )+")


def fatal_in(text: str) -> tuple[ExitCode, str] | None:
    """The exit code and message of the first ``TaskFatal`` named in a Spark job failure's text."""
    found = _FATAL.search(text)
    if found is None:
        return None
    try:
        code = ExitCode(int(found.group(1)))
    except ValueError:
        code = ExitCode.INTERNAL
    return code, found.group(2).strip()


def failure_line(error: BaseException | None) -> str:
    """One line for a Spark job failure: the Python exception of the failed task when there is one
    (``RuntimeError: ...``), else the first line of the JVM's cause, without class-name prefixes."""
    text = str(error or "").strip()
    if found := _PYTHON.search(text):
        return found.group(1).strip()[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # Py4J's first line says only which call failed ("An error occurred while calling z:..."): the cause is next.
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        lines = lines[1:]
    if not lines:
        return type(error).__name__
    return _CAUSE.sub("", lines[0].lstrip(": "))[:300]


def one_line(message: str) -> str:
    return " ".join(message.split())


@contextmanager
def task_errors(log: logging.Logger, who: str) -> Iterator[None]:
    """Around a task's participant: an error no retry of the task can mend leaves as ``TaskFatal``
    (its one line reaches the driver); any other is logged with its traceback (Spark is told to
    leave tracebacks out of its own lines) and raised as it is, so Spark retries the task."""
    try:
        yield
    except Exception as exc:
        if (instead := fatal(exc)) is not None:
            raise instead from None
        log.exception("participant task %s failed: %s", who, one_line(str(exc)) or type(exc).__name__)
        raise
