"""One connection to the engine: what a ClickHouse server calls a session context.

Each connection has its own settings, current database and temporary tables; statements on
different connections run in parallel (chDB's connections are thread-safe and share one engine
and one data directory). A connection runs one statement at a time: the HTTP layer gives each
request without ``session_id`` a connection of its own for the request (an idle one kept clean
from an earlier request, see ``ch_sessions``), and each session its own connection for the
session's lifetime.

SQL reaches the engine as bytes, exactly as the client sent them. Inside the endpoint SQL text is
held as ``latin-1`` strings (one character per byte, see ``ch_sql``) and encoded back to the
same bytes here.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from chdb.state import sqlitelike

from embedded.ch_errors import BAD_ARGUMENTS, NOT_IMPLEMENTED, EngineError, from_engine_message
from embedded.ch_sql import quote

_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The setting each statement carries its HTTP query id in, so that it can be found among the
#: engine's processes (chDB gives every statement a query id of its own).
QUERY_ID_SETTING = "log_comment"


@dataclass(frozen=True)
class Outcome:
    """What one statement produced: the body in ``result_format`` (None when the statement has no
    result table, e.g. DDL or INSERT) and ClickHouse's progress counters; or, for a statement whose
    output is streamed, ``stream``, which carries the counters once read."""

    body: bytes = b""
    stream: ResultStream | None = None
    result_format: str | None = None
    result_rows: int = 0
    read_rows: int = 0
    read_bytes: int = 0
    written_rows: int = 0
    written_bytes: int = 0
    elapsed_s: float = 0.0


def latin1(text: str) -> bytes:
    """Endpoint-internal SQL text back to the bytes the client sent."""
    return text.encode("latin-1")


def _message(ex: Exception) -> str:
    """The engine's error message. chDB raises ``UnicodeDecodeError`` instead of its error when the
    message quotes bytes of the data that are not UTF-8 (a parse error's excerpt of a record): the
    message is then the bytes it could not decode."""
    if isinstance(ex, UnicodeDecodeError) and isinstance(ex.object, bytes):
        return ex.object.decode("utf-8", errors="replace")
    return str(ex)


class EngineConnection:
    """A chDB connection to ``path``. Not thread-safe: one statement at a time.

    Settings never leak between the statements of one connection: each call names the settings it
    wants, and any setting an earlier call changed that this one does not name goes back to its
    start-up value (``baseline``)."""

    def __init__(self, path: str, baseline: Mapping[str, str]):
        self._conn = sqlitelike.connect(path)
        # input()'s data, one file per running statement, inside the data directory (``path`` less its parameters)
        self._inputs = os.path.join(path.partition("?")[0], "input")
        self._baseline = baseline
        self._applied: dict[str, str] = {}
        self._database = "default"

    def close(self) -> None:
        with suppress(Exception):
            self._conn.close()

    def query(
        self,
        sql: bytes,
        fmt: str,
        *,
        settings: Mapping[str, str],
        database: str,
        params: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Run one statement with its output in ``fmt``. ``settings`` maps names to SQL literals;
        ``params`` are the values of ``{name:Type}`` placeholders."""
        self.apply(settings, database)
        res = self.raw(sql, fmt, params)
        return Outcome(
            body=res.bytes(),
            result_format=fmt,
            result_rows=res.rows_read(),
            read_rows=res.storage_rows_read(),
            read_bytes=res.storage_bytes_read(),
            written_rows=res.rows_written(),
            written_bytes=res.bytes_written(),
            elapsed_s=res.elapsed(),
        )

    def stream(
        self,
        sql: bytes,
        fmt: str,
        *,
        settings: Mapping[str, str],
        database: str,
        params: Mapping[str, str] | None = None,
    ) -> ResultStream:
        """Start one statement whose output is read chunk by chunk; no other statement may run on
        this connection until the stream is exhausted or closed."""
        self.apply(settings, database)
        try:
            return ResultStream(self._conn.send_query(sql, fmt, params=dict(params) if params else None))  # type: ignore[arg-type]  # chDB takes bytes too; its hints say str
        except Exception as ex:
            raise from_engine_message(_message(ex)) from None

    def insert(
        self,
        statement: bytes,
        input_format: str,
        data: bytes | memoryview,
        *,
        settings: Mapping[str, str],
        database: str,
    ) -> Outcome:
        """Run ``statement`` (an INSERT without FORMAT clause) with ``data`` in ``input_format``;
        all rows land or, on error, none of this call's blocks that failed do."""
        self.apply(settings, database)
        try:
            inserter = self._conn.send_insert(statement, input_format)  # type: ignore[arg-type]  # bytes, as in ``stream``
        except Exception as ex:
            raise from_engine_message(_message(ex)) from None
        try:
            if len(data):
                inserter.append(bytes(data))
            res = inserter.finish()
        except Exception as ex:
            with suppress(Exception):
                inserter.cancel()
            raise from_engine_message(_message(ex)) from None
        return Outcome(
            result_rows=res.rows_written,
            written_rows=res.rows_written,
            written_bytes=res.bytes_written,
            elapsed_s=res.elapsed,
        )

    def insert_from_input(
        self,
        statement: str,
        call: tuple[int, int],
        args: str,
        input_format: str,
        data: bytes | memoryview,
        *,
        settings: Mapping[str, str],
        database: str,
        params: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Run ``INSERT ... SELECT ... FROM input(args)`` (``call`` is where input() is in
        ``statement``) with ``data`` as input()'s rows, in ``input_format``.

        A ClickHouse server streams the request body into input(); chDB's streaming insert refuses
        an ``INSERT ... SELECT``, so the data goes to a file that the engine reads with
        ``file(path, input_format, args)`` in input()'s place: the same format, parsed by the same
        code (parallel parsing included), one statement that lands all rows or none."""
        if not args:
            raise EngineError(
                NOT_IMPLEMENTED,
                "input() without a structure: the embedded endpoint runs input('<name> <type>, ...') only",
            )
        os.makedirs(self._inputs, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self._inputs, suffix=".rows") as rows:
            rows.write(data)
            rows.flush()
            source = f"file({quote(rows.name)}, {quote(input_format)}, {args})"
            sql = statement[: call[0]] + source + statement[call[1] :]
            outcome = self.query(latin1(sql), "TabSeparated", settings=settings, database=database, params=params)
        return replace(outcome, body=b"", result_format=None, result_rows=outcome.written_rows)

    def apply(self, settings: Mapping[str, str], database: str) -> None:
        """Make ``settings`` and ``database`` current, as SET and USE would (for SET and USE)."""
        for name in settings:
            if not _SETTING_NAME.match(name):
                raise EngineError(BAD_ARGUMENTS, f"Setting name '{name}' is not a valid identifier")
        stale = [name for name in self._applied if name not in settings]
        if stale:
            self._reset(stale)
        changes = {name: value for name, value in settings.items() if self._applied.get(name) != value}
        if changes:
            # One SET is atomic: when any assignment is refused, none of them is applied.
            self.raw(latin1("SET " + ", ".join(f"{name} = {value}" for name, value in changes.items())))
            self._applied.update(changes)
        if database != self._database:
            self.raw(latin1("USE `" + database.replace("\\", "\\\\").replace("`", "\\`") + "`"))
            self._database = database

    def _reset(self, names: list[str]) -> None:
        def literal(name: str) -> str:
            return quote(self._baseline[name]) if name in self._baseline else "DEFAULT"

        try:
            self.raw(latin1("SET " + ", ".join(f"{name} = {literal(name)}" for name in names)))
        except EngineError:
            for name in names:
                with suppress(EngineError):
                    self.raw(latin1(f"SET {name} = {literal(name)}"))
        for name in names:
            self._applied.pop(name, None)

    def raw(
        self, sql: bytes, fmt: str = "TabSeparated", params: Mapping[str, str] | None = None
    ) -> Any:  # chDB's result; its hint is Any
        """Run ``sql`` as it is; engine errors become EngineError."""
        try:
            return self._conn.query(sql, fmt, params=dict(params) if params else None)  # type: ignore[arg-type]  # bytes, as in ``stream``
        except Exception as ex:
            raise from_engine_message(_message(ex)) from None


class ResultStream:
    """The output of a running statement, in chunks of whole blocks as the engine produces them,
    with ClickHouse's counters summed over the chunks read so far. An engine error while reading
    raises EngineError. ``close`` cancels the statement if it has not finished."""

    def __init__(self, engine_stream: sqlitelike.StreamingResult):
        self._stream = engine_stream
        self._done = False
        self.transform: Callable[[bytes], bytes] = bytes
        self.result_rows = 0
        self.read_rows = 0
        self.read_bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        while not self._done:
            try:
                res = self._stream.fetch()
            except Exception as ex:
                self._done = True
                raise from_engine_message(_message(ex)) from None
            if res is None:
                self._done = True
                return
            self.result_rows += res.rows_read()
            self.read_rows += res.storage_rows_read()
            self.read_bytes += res.storage_bytes_read()
            yield self.transform(res.bytes())

    @property
    def done(self) -> bool:
        """True once the output was read to its end (or failed)."""
        return self._done

    def close(self) -> None:
        if not self._done:
            self._done = True
            with suppress(Exception):
                self._stream.cancel()
