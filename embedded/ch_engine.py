"""ClickHouse's engine (chDB) with its data under one directory, shared by all HTTP requests.

Guarantees:
- One statement runs at a time: every call into chDB holds one lock, so the settings and database
  a request asks for are exactly those its statement runs with, and a compare-and-set built on
  ``insert_deduplication_token`` cannot interleave with another insert.
- Settings never leak between requests: each request names the settings it wants; any setting
  an earlier request changed and this one does not name goes back to the engine's start-up value.
- Data is ClickHouse's own on-disk format under ``data_dir``: closing and opening the engine on
  the same directory gives back every committed part.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from chdb import session as chdb_session

from embedded.ch_errors import BAD_ARGUMENTS, EngineError, from_engine_message
from embedded.ch_sql import RESULT_KINDS, output_format, quote, statement_kind

CANNOT_OPEN_DATA_DIR = 76  # ClickHouse's CANNOT_OPEN_FILE
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Outcome:
    """What one statement produced: the body in ``result_format`` (None when the statement has no
    result table, e.g. DDL or INSERT) and ClickHouse's progress counters."""

    body: bytes = b""
    result_format: str | None = None
    read_rows: int = 0
    read_bytes: int = 0
    written_rows: int = 0
    written_bytes: int = 0
    elapsed_s: float = 0.0


class Engine:
    """A chDB session on ``data_dir``. Thread-safe; open one per process. Raises EngineError
    (CANNOT_OPEN_FILE) when the directory cannot be opened, e.g. another process serves it."""

    def __init__(self, data_dir: str | Path):
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._session = chdb_session.Session(str(path))
        except Exception as ex:
            raise EngineError(
                CANNOT_OPEN_DATA_DIR,
                f"Cannot open the ClickHouse data directory {path} ({ex}): only one process at a time can serve a "
                "data directory; stop the other endpoint or chDB process using it, or choose another directory",
                "CANNOT_OPEN_FILE",
            ) from None
        self._applied: dict[str, str] = {}
        self._database = "default"
        version, tz = self._raw("SELECT version(), timezone()").bytes().decode().rstrip("\n").split("\t")
        self.version: str = version
        self.timezone: str = tz
        rows = self._raw("SELECT name, value FROM system.settings").bytes().decode().splitlines()
        self._baseline = {name: _unescape_tsv(value) for name, _, value in (r.partition("\t") for r in rows)}

    def close(self) -> None:
        """Release the session; the data stays on disk."""
        with self._lock:
            self._session.close()

    def query(
        self,
        sql: str,
        *,
        settings: Mapping[str, str],
        database: str,
        default_format: str,
        params: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Run one statement. ``settings`` maps setting names to SQL literals; ``params`` are the
        values of ``{name:Type}`` placeholders; output is in the statement's own FORMAT clause or
        else ``default_format``."""
        kind = statement_kind(sql)
        with self._lock:
            self._apply(settings, database)
            res = self._raw(sql, default_format, params)
        fmt = (output_format(sql) or default_format) if kind in RESULT_KINDS else None
        return Outcome(
            body=res.bytes(),
            result_format=fmt,
            read_rows=res.rows_read(),
            read_bytes=res.bytes_read(),
            written_rows=res.rows_written(),
            written_bytes=res.bytes_written(),
            elapsed_s=res.elapsed(),
        )

    def insert(
        self,
        statement: str,
        input_format: str,
        data: bytes | memoryview,
        *,
        settings: Mapping[str, str],
        database: str,
    ) -> Outcome:
        """Run ``statement`` (an INSERT without FORMAT clause) with ``data`` in ``input_format``;
        all rows land or, on error, none of this call's blocks that failed do."""
        with self._lock:
            self._apply(settings, database)
            try:
                inserter = self._session.send_insert(statement, input_format)
            except Exception as ex:
                raise from_engine_message(str(ex)) from None
            try:
                if len(data):
                    inserter.append(bytes(data))
                res = inserter.finish()
            except Exception as ex:
                with suppress(Exception):
                    inserter.cancel()
                raise from_engine_message(str(ex)) from None
        return Outcome(written_rows=res.rows_written, written_bytes=res.bytes_written, elapsed_s=res.elapsed)

    def check(self, settings: Mapping[str, str], database: str) -> None:
        """Validate settings and database as ``query`` would, running nothing (for SET and USE)."""
        with self._lock:
            self._apply(settings, database)

    def _apply(self, settings: Mapping[str, str], database: str) -> None:
        for name in settings:
            if not _SETTING_NAME.match(name):
                raise EngineError(BAD_ARGUMENTS, f"Setting name '{name}' is not a valid identifier")
        stale = [name for name in self._applied if name not in settings]
        if stale:
            self._reset(stale)
        changes = {name: value for name, value in settings.items() if self._applied.get(name) != value}
        if changes:
            # One SET is atomic: when any assignment is refused, none of them is applied.
            self._raw("SET " + ", ".join(f"{name} = {value}" for name, value in changes.items()))
            self._applied.update(changes)
        if database != self._database:
            self._raw("USE `" + database.replace("\\", "\\\\").replace("`", "\\`") + "`")
            self._database = database

    def _reset(self, names: list[str]) -> None:
        def literal(name: str) -> str:
            return quote(self._baseline[name]) if name in self._baseline else "DEFAULT"

        try:
            self._raw("SET " + ", ".join(f"{name} = {literal(name)}" for name in names))
        except EngineError:
            for name in names:
                with suppress(EngineError):
                    self._raw(f"SET {name} = {literal(name)}")
        for name in names:
            self._applied.pop(name, None)

    def _raw(self, sql: str, fmt: str = "TabSeparated", params: Mapping[str, str] | None = None):  # noqa: ANN202 - chDB's result type
        try:
            return self._session.query(sql, fmt, params=dict(params) if params else None)
        except Exception as ex:
            raise from_engine_message(str(ex)) from None


def _unescape_tsv(value: str) -> str:
    """A TabSeparated field back to its text (system.settings values are escaped in TSV)."""
    if "\\" not in value:
        return value
    out, i = [], 0
    escapes = {"t": "\t", "n": "\n", "\\": "\\", "'": "'", "0": "\0", "r": "\r", "b": "\b", "f": "\f"}
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            out.append(escapes.get(value[i + 1], value[i + 1]))
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)
