"""Run one request's statement on its session's connection, as a ClickHouse server's HTTP handler
runs it.

- ``SET`` and ``USE`` change the session (or only this request, without a session);
- the external tables of a multipart body exist for this statement only;
- ``INSERT ... FORMAT f <data>`` streams the data into the engine; ``INSERT ... SELECT ... FROM
  input(s) FORMAT f <data>`` reads the data in input()'s place (``EngineConnection.insert_from_input``);
  ``INSERT ... VALUES`` runs as one
  statement, so that ``{name:Type}`` inside VALUES is bound and an error raised while the rows are
  written reaches the client (the engine's streaming insert reports some of those as a success
  with nothing written: a violated CONSTRAINT, KeeperMap's "key exists" under
  ``keeper_map_strict_mode``, an unreachable keeper);
- the statement runs with its HTTP query id in the ``log_comment`` setting, so that ``KILL QUERY
  WHERE query_id = ...`` and ``system.processes`` see the ids clients chose;
- Native output for a client that sent ``client_protocol_version`` is re-framed (``ch_native``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace

from embedded.ch_connection import QUERY_ID_SETTING, EngineConnection, Outcome, latin1
from embedded.ch_errors import EngineError
from embedded.ch_form import ExternalTable
from embedded.ch_native import BINARY_TYPES_SETTING, reframe
from embedded.ch_request import Statement
from embedded.ch_sessions import SessionState
from embedded.ch_sql import RESULT_KINDS, output_format, quote, set_assignments, use_database, with_http_query_ids

#: Statements whose output is streamed (chDB streams queries only).
_STREAMED_KINDS = frozenset({"SELECT", "WITH"})
#: Formats whose output is the plain concatenation of their blocks' output: chDB writes each
#: streamed chunk as a whole output of the format, so a format with a header, footer or separator
#: between blocks (JSON, Arrow, Parquet, ...WithNames, Values, Pretty) is sent whole instead.
_STREAMED_FORMATS = frozenset(
    {
        "Native",
        "TabSeparated",
        "TSV",
        "TabSeparatedRaw",
        "TSVRaw",
        "CSV",
        "JSONEachRow",
        "JSONLines",
        "NDJSON",
        "JSONCompactEachRow",
        "JSONStringsEachRow",
        "JSONCompactStringsEachRow",
        "RowBinary",
        "LineAsString",
        "RawBLOB",
    }
)


@dataclass(frozen=True)
class Request:
    """What the HTTP layer resolved about one request."""

    statement: Statement
    settings: dict[str, str]  # name -> SQL literal, this request's own
    query_params: dict[str, str]
    database: str | None  # from the URL or X-ClickHouse-Database
    default_format: str
    query_id: str
    protocol_version: int = 0
    external_tables: Sequence[ExternalTable] = ()


@contextmanager
def execute(session: SessionState, request: Request) -> Iterator[Outcome]:
    """Run ``request`` in ``session``; raises EngineError as the engine reports it. A SELECT's
    output is streamed (``Outcome.stream``) while the ``with`` block lasts, and its external
    tables exist until the block ends."""
    stmt = request.statement
    settings = {**session.settings, **request.settings}
    database = request.database or session.database or "default"
    conn = session.connection
    if stmt.kind == "SET" and (pairs := set_assignments(stmt.sql)) is not None:
        conn.apply({**settings, **dict(pairs)}, database)
        session.settings.update(pairs)
        yield Outcome()
        return
    if stmt.kind == "USE" and (target := use_database(stmt.sql)) is not None:
        conn.apply(settings, target)
        session.database = target
        yield Outcome()
        return
    settings[QUERY_ID_SETTING] = quote(request.query_id)
    session.ran(stmt.kind, stmt.sql, external_tables=bool(request.external_tables))
    created: list[ExternalTable] = []
    try:
        for table in request.external_tables:
            _create_external(conn, table, settings, database)
            created.append(table)
        outcome = _run(conn, request, settings, database)
        try:
            yield outcome
        finally:
            if outcome.stream is not None:
                if not outcome.stream.done:  # cancelled half-read: do not hand the connection on
                    session.reusable = False
                outcome.stream.close()
    finally:
        _drop_external(conn, created)


def _run(conn: EngineConnection, request: Request, settings: dict[str, str], database: str) -> Outcome:
    stmt = request.statement
    if stmt.insert is not None and (call := stmt.insert.input_call) is not None:
        insert = stmt.insert
        return conn.insert_from_input(
            insert.statement,
            call,
            insert.input_args,
            insert.input_format,
            stmt.data,
            settings=settings,
            database=database,
            params=request.query_params,
        )
    if stmt.insert is not None and stmt.insert.input_format != "Values":
        return conn.insert(
            latin1(stmt.insert.statement), stmt.insert.input_format, stmt.data, settings=settings, database=database
        )
    sql = stmt.sql
    if stmt.insert is not None:  # INSERT ... VALUES: one statement (see the module's docstring)
        sql = f"{stmt.insert.statement} VALUES {bytes(stmt.data).decode('latin-1')}"
    fmt = (output_format(sql) or request.default_format) if stmt.kind in RESULT_KINDS else None
    revision = request.protocol_version if fmt == "Native" else 0
    keep_binary_types = False
    if revision:
        keep_binary_types = settings.get(BINARY_TYPES_SETTING, "'0'").strip("'") not in ("0", "false", "")
        settings[BINARY_TYPES_SETTING] = "1"
    # An INSERT ... VALUES goes as sent: its rows are data, and can be large.
    sql_bytes = latin1(with_http_query_ids(sql) if stmt.insert is None else sql)
    if stmt.kind in _STREAMED_KINDS and fmt in _STREAMED_FORMATS:
        stream = conn.stream(sql_bytes, fmt, settings=settings, database=database, params=request.query_params)
        if revision:
            stream.transform = lambda chunk: reframe(chunk, revision, keep_binary_types)
        return Outcome(result_format=fmt, stream=stream)
    outcome = conn.query(
        sql_bytes, fmt or request.default_format, settings=settings, database=database, params=request.query_params
    )
    if fmt is None:
        return replace(outcome, body=b"", result_format=None, result_rows=outcome.written_rows)
    if revision:
        outcome = replace(outcome, body=reframe(outcome.body, revision, keep_binary_types))
    return outcome


def _create_external(conn: EngineConnection, table: ExternalTable, settings: dict[str, str], database: str) -> None:
    name = _identifier(table.name)
    conn.apply(settings, database)
    conn.raw(latin1(f"CREATE TEMPORARY TABLE {name} ({table.structure}) ENGINE = Memory"))
    try:
        conn.insert(latin1(f"INSERT INTO {name}"), table.fmt, table.data, settings=settings, database=database)
    except EngineError:
        _drop_external(conn, [table])
        raise


def _drop_external(conn: EngineConnection, tables: Sequence[ExternalTable]) -> None:
    for table in tables:
        with suppress(EngineError):
            conn.raw(latin1(f"DROP TEMPORARY TABLE IF EXISTS {_identifier(table.name)}"))


def _identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
