"""The participant job's driver writes its stderr to spark-submit's stderr.

spark-submit starts a Python driver with its stderr merged into its stdout (Spark's ``PythonRunner``
runs it with ``redirectErrorStream``) and copies both to the JVM's stdout, while Spark's own lines go
to the JVM's stderr. So under spark-submit (``PYSPARK_GATEWAY_PORT`` set) ``use_jvm_stderr`` makes
the driver's ``sys.stderr`` a ``JvmStderr``: every whole line written to it is printed on the JVM's
``System.err`` through the Py4J gateway, in order with Spark's lines, and is there when ``write``
returns. chtxn's JSON log lines and its final ``chtxn: <message>`` line then reach stderr however the
job was started (``chtxn participant``, or spark-submit by hand).

A line goes to the process's own stderr instead (spark-submit's stdout) when the gateway refuses it
(the JVM is gone; every later line too), and when written while a line is being sent on the same
thread (Py4J's own log records). Only ``sys.stderr`` moves: what C code writes to file descriptor 2
still reaches spark-submit's stdout.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from typing import Any, TextIO


class JvmStderr(io.TextIOBase):
    """A text stream printing whole lines on ``print_stream`` (the JVM's ``System.err``); a line not
    ended by ``\\n`` waits, per thread, for its end or for ``flush``."""

    def __init__(self, print_stream: Any, fallback: TextIO) -> None:
        super().__init__()
        self._out = print_stream
        self.fallback = fallback
        self._thread = threading.local()  # .pending: a line begun; .sending: a send under way
        self._gone = False

    @property
    def encoding(self) -> str:  # type: ignore[override]  # TextIOBase declares it an attribute
        return self.fallback.encoding

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fallback.fileno()

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if self._gone or getattr(self._thread, "sending", False):
            return self.fallback.write(text)
        lines, newline, rest = (getattr(self._thread, "pending", "") + text).rpartition("\n")
        self._thread.pending = rest
        if newline:
            self._send(lines + newline)
        return len(text)

    def flush(self) -> None:
        rest = getattr(self._thread, "pending", "")
        self._thread.pending = ""
        if rest:
            self._send(rest, flush=True)
        self.fallback.flush()

    def _send(self, text: str, *, flush: bool = False) -> None:
        """``text`` on the JVM's stream (a ``PrintStream`` with auto-flush flushes on ``\\n``)."""
        if self._gone:
            self.fallback.write(text)
            return
        self._thread.sending = True
        try:
            self._out.print(text)
            if flush:
                self._out.flush()
        except Exception:  # the gateway or its JVM is gone: this line and every later one here
            self._gone = True
            self.fallback.write(text)
        finally:
            self._thread.sending = False


def use_jvm_stderr() -> bool:
    """Under spark-submit, make ``sys.stderr`` a ``JvmStderr`` (before logging binds a handler to
    it); True when it did. Elsewhere, or when the gateway does not answer, ``sys.stderr`` stays."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT") or isinstance(sys.stderr, JvmStderr):
        return False
    try:
        from pyspark import SparkContext

        SparkContext._ensure_initialized()  # spark-submit's JVM: the gateway the SparkContext uses too
        jvm: Any = SparkContext._jvm
        print_stream = jvm.java.lang.System.err
    except Exception:
        return False
    sys.stderr = JvmStderr(print_stream, sys.stderr)
    return True
