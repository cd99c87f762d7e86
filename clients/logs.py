"""Structured logs of every chtxn process: one JSON object per line on stderr, quiet (WARNING) by
default, secrets masked (``protocol.secrets.redact``).

Here rather than in ``coordinator/`` because ``clients`` is shipped to the Spark executors: the
participant tasks and the job's driver log the same lines as the coordinator.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable

from protocol import secrets

#: Libraries that log every retry or connection attempt; chtxn's own line says what failed.
#: (``urllib3.connectionpool`` by name: clickhouse-connect sets ``urllib3`` to WARNING when imported.)
CHATTY_LIBRARIES = ("urllib3", "urllib3.connectionpool", "clickhouse_connect")


class JsonFormatter(logging.Formatter):
    """Renders ``extra={...}`` fields beside the message, so logs stay greppable and parseable."""

    _RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return secrets.redact(json.dumps(entry, default=str))


def setup_logging(level: str = "WARNING") -> None:
    """Every record of this process as one JSON line on stderr, from ``level`` up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def quiet_libraries(level: str = "WARNING") -> None:
    """For a process that rides out outages (the participant job): the HTTP client's per-attempt
    warnings off below DEBUG, and each librdkafka line at most once per ``RepeatFilter.WINDOW_S``."""
    if level.upper() != "DEBUG":
        for name in CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(logging.ERROR)
    kafka = logging.getLogger("chtxn.kafka")
    if not any(isinstance(f, RepeatFilter) for f in kafka.filters):
        kafka.addFilter(RepeatFilter())


class RepeatFilter(logging.Filter):
    """Passes a message the first time, then again only once ``WINDOW_S`` have passed; numbers in
    it (timings, counts, ports) do not make it a new message."""

    WINDOW_S = 300.0
    _NUMBERS = re.compile(r"\d+")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = self._NUMBERS.sub("N", record.getMessage())
        now = self.clock()
        if now - self.last.get(key, float("-inf")) < self.WINDOW_S:
            return False
        if len(self.last) > 1000:  # a bounded memory of messages
            self.last.clear()
        self.last[key] = now
        return True
