"""The driver's stderr under spark-submit (``participant.driver_stderr.JvmStderr``), without a JVM: a
stand-in for ``System.err`` records what it is given."""

from __future__ import annotations

import io
import json
import logging
import sys

from clients.logs import JsonFormatter
from participant.driver_stderr import JvmStderr, use_jvm_stderr


class PrintStream:
    """What ``JvmStderr`` uses of a ``java.io.PrintStream``; raises once ``gone`` (the JVM exited)."""

    def __init__(self) -> None:
        self.printed: list[str] = []
        self.flushes = 0
        self.gone = False
        self.on_print = lambda: None

    def print(self, text: str) -> None:
        if self.gone:
            raise ConnectionRefusedError("the gateway is gone")
        self.on_print()
        self.printed.append(text)

    def flush(self) -> None:
        self.flushes += 1


def test_print_reaches_the_jvm_as_one_whole_line():
    jvm, own = PrintStream(), io.StringIO()
    stream = JvmStderr(jvm, own)
    print("chtxn: the Spark master did not start the application", file=stream, flush=True)
    assert jvm.printed == ["chtxn: the Spark master did not start the application\n"]
    assert own.getvalue() == ""


def test_a_line_waits_for_its_end_or_a_flush():
    jvm = PrintStream()
    stream = JvmStderr(jvm, io.StringIO())
    stream.write("one\ntw")
    assert jvm.printed == ["one\n"]
    stream.write("o\nthr")
    assert jvm.printed == ["one\n", "two\n"]
    stream.flush()
    assert jvm.printed == ["one\n", "two\n", "thr"] and jvm.flushes == 1


def test_a_log_handler_on_it_writes_json_lines_to_the_jvm():
    jvm = PrintStream()
    handler = logging.StreamHandler(JvmStderr(jvm, io.StringIO()))
    handler.setFormatter(JsonFormatter())
    handler.emit(logging.makeLogRecord({"name": "chtxn.participant.leaving", "msg": "the participant tasks are done"}))
    assert [json.loads(line)["msg"] for line in jvm.printed] == ["the participant tasks are done"]


def test_once_the_jvm_is_gone_lines_go_to_the_process_stderr():
    jvm, own = PrintStream(), io.StringIO()
    stream = JvmStderr(jvm, own)
    jvm.gone = True
    stream.write("chtxn: first\n")
    jvm.gone = False  # not asked again: every later line goes the same way
    stream.write("chtxn: second\n")
    assert own.getvalue() == "chtxn: first\nchtxn: second\n" and jvm.printed == []


def test_a_write_made_while_a_line_is_sent_goes_to_the_process_stderr():
    jvm, own = PrintStream(), io.StringIO()
    stream = JvmStderr(jvm, own)
    jvm.on_print = lambda: stream.write("py4j: a log record of the gateway's\n")
    stream.write("chtxn: the line\n")
    assert jvm.printed == ["chtxn: the line\n"]
    assert own.getvalue() == "py4j: a log record of the gateway's\n"


def test_without_spark_submit_stderr_stays(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    before = sys.stderr
    assert use_jvm_stderr() is False and sys.stderr is before
