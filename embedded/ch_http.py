"""ClickHouse's HTTP interface over the engine: the request handler (the threaded server that runs
it is ``embedded.ch_http_server``).

One request is one statement, answered as a ClickHouse server answers it: the result in the
requested format (compressed when the client allows), ``X-ClickHouse-Query-Id``, ``-Format``,
``-Timezone``, ``-Server-Display-Name`` and ``-Summary`` headers; or an error body
``Code: N. DB::Exception: ...`` with ``X-ClickHouse-Exception-Code`` and ClickHouse's HTTP status.
``/ping`` and a bare ``GET /`` answer ``Ok.``. A ``GET`` request, or ``readonly=1``, may only read.
A result over ``STREAM_AFTER_BYTES`` is sent chunked as the engine produces it; an error after
that arrives inside the stream (ClickHouse's ``__exception__`` block, ``X-ClickHouse-Exception-Tag``).
With ``compress=1`` the reply body, errors after authentication included, is sent as ClickHouse's
native compressed blocks (inside any HTTP Content-Encoding); with ``decompress=1`` the request body
is read as such blocks (``ch_compression``).
Requests run concurrently, one thread per client connection; the statement of one whose client
disconnects is cancelled when it only reads.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Protocol
from urllib.parse import urlsplit

from embedded import ch_compression
from embedded.ch_codec import StreamEncoder, choose_response_encoding, decode_body, encode_body, read_body
from embedded.ch_engine import Engine, Outcome
from embedded.ch_errors import BAD_ARGUMENTS, READONLY, SYNTAX_ERROR, UNEXPECTED_END_OF_FILE, EngineError
from embedded.ch_execute import Request, execute
from embedded.ch_form import ExternalTable, external_tables, is_form, parse_form
from embedded.ch_request import RequestParams, authenticate, credentials, split_statement
from embedded.ch_sessions import SessionStore
from embedded.ch_sql import READ_ONLY_KINDS
from embedded.ch_watch import DisconnectWatcher

log = logging.getLogger("embedded.clickhouse")

#: Idle keep-alive connections are closed after this long.
KEEP_ALIVE_S = 600
#: A result up to this size is sent whole (Content-Length, complete summary); a larger one streams.
STREAM_AFTER_BYTES = 1 << 20
_STD_EXCEPTION = 1001


class Serving(Protocol):
    """What a request's handler uses of its server (``embedded.ch_http_server.HttpServer``)."""

    engine: Engine
    sessions: SessionStore
    watcher: DisconnectWatcher
    users: dict[str, str] | None
    display_name: str

    def running(self, query_id: str) -> AbstractContextManager[None]: ...


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = KEEP_ALIVE_S
    server: Serving  # type: ignore[assignment]  # the socketserver attribute, as this handler uses it

    def do_GET(self) -> None:  # http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_message(self, format: str, *args: object) -> None:  # `format`: the stdlib's parameter name
        log.debug("%s " + format, self.address_string(), *args)

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        params = RequestParams.parse(url.query)
        query_id = params.transport.get("query_id") or str(uuid.uuid4())
        try:
            body = read_body(self.rfile, self.headers.get("Transfer-Encoding"), self.headers.get("Content-Length"))
        except (EngineError, ValueError, OSError) as ex:
            self.close_connection = True
            err = (
                ex
                if isinstance(ex, EngineError)
                else EngineError(UNEXPECTED_END_OF_FILE, f"Cannot read the request body: {ex}")
            )
            self._send_error(err, query_id)
            return
        if url.path.rstrip("/") in ("/ping", "/replicas_status") or (
            method == "GET" and "query" not in params.transport
        ):
            self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
            return
        # As on a server, only the URL's compress/decompress count (a form body is read unframed),
        # and the reply is framed from the moment it is set up, after authentication.
        native = params.flag("compress")
        framed_errors = False
        try:
            authenticate(credentials(params, self.headers), self.server.users)
            framed_errors = native
            body = decode_body(body, self.headers.get("Content-Encoding"))
            files: dict[str, bytes] = {}
            if is_form(self.headers.get("Content-Type")):
                form = parse_form(body, self.headers["Content-Type"])
                params = RequestParams.parse(url.query, form.fields, form.files.keys())
                query_id = params.transport.get("query_id") or query_id
                body, files = b"", form.files
            elif params.flag("decompress"):
                verify = not params.flag("http_native_compression_disable_checksumming_on_decompress")
                body = ch_compression.decompress(body, verify=verify)
            self._execute(method, params, body, query_id, external_tables(files, params.external), native)
        except EngineError as err:
            self._send_error(err, query_id, framed_errors)
        except Exception as ex:
            log.exception("unexpected failure serving %s", self.path)
            self._send_error(
                EngineError(_STD_EXCEPTION, f"{type(ex).__name__}: {ex}", "STD_EXCEPTION"), query_id, framed_errors
            )

    def _execute(
        self, method: str, params: RequestParams, body: bytes, query_id: str, tables: list[ExternalTable], native: bool
    ) -> None:
        """Run the request's statement and send its reply (in compressed blocks when ``native``);
        raises EngineError while nothing is sent."""
        stmt = split_statement(params.transport.get("query"), body)
        if stmt.insert is None and not stmt.sql.strip():
            raise EngineError(SYNTAX_ERROR, "Empty query")
        if (method == "GET" or params.flag("readonly")) and stmt.kind not in READ_ONLY_KINDS:
            raise EngineError(
                READONLY,
                "Cannot execute query in readonly mode. For queries over HTTP, method GET implies readonly. "
                "You should use method POST for modifying queries",
            )
        request = Request(
            statement=stmt,
            settings=params.settings,
            query_params=params.query_params,
            database=params.transport.get("database") or self.headers.get("X-ClickHouse-Database"),
            default_format=params.transport.get("default_format")
            or self.headers.get("X-ClickHouse-Format")
            or "TabSeparated",
            query_id=query_id,
            protocol_version=_protocol_version(params.transport.get("client_protocol_version")),
            external_tables=tables,
        )
        session_id = params.transport.get("session_id")
        timeout = float(params.transport["session_timeout"]) if params.transport.get("session_timeout") else None
        watch = stmt.kind in READ_ONLY_KINDS and stmt.insert is None
        with (
            self.server.running(query_id),
            self.server.sessions.hold(session_id, timeout) as session,
            self.server.watcher.watch(self.connection, query_id) if watch else nullcontext(),
            execute(session, request) as outcome,
        ):
            # The reply's last bytes go out after the session is released: a client may send its
            # next request the moment it has read them.
            finish: Callable[[], None]
            if outcome.stream is None:
                finish = partial(self._send_outcome, outcome, params, query_id, native)
            else:
                finish = self._send_stream(outcome, params, query_id, native)
        if session_id and params.flag("close_session"):
            self.server.sessions.close(session_id)
        finish()

    def _send_outcome(self, outcome: Outcome, params: RequestParams, query_id: str, native: bool) -> None:
        headers = self._result_headers(outcome, query_id, len(outcome.body))
        body = ch_compression.compress(outcome.body) if native else outcome.body
        encoding = self._response_encoding(params)
        if body and encoding:
            body = encode_body(body, encoding)
            headers["Content-Encoding"] = encoding
        self._send(200, body, headers)

    def _send_stream(self, outcome: Outcome, params: RequestParams, query_id: str, native: bool) -> Callable[[], None]:
        """Buffer a streamed result up to STREAM_AFTER_BYTES and send it whole, as ``_send_outcome``
        (an error so far is raised); past that, send it chunked with the summary so far, and an
        error from then on inside the stream, as a server does (each piece in compressed blocks
        when ``native``). Returns what sends the rest."""
        stream = outcome.stream
        assert stream is not None
        started = time.monotonic()
        chunks = iter(stream)
        head = bytearray()
        for chunk in chunks:
            head += chunk
            if len(head) >= STREAM_AFTER_BYTES:
                break
        else:
            return partial(
                self._send_outcome,
                _with_counters(outcome, bytes(head), time.monotonic() - started),
                params,
                query_id,
                native,
            )
        headers = self._result_headers(_with_counters(outcome, b"", time.monotonic() - started), query_id, len(head))
        tag = secrets.token_hex(8)
        headers["X-ClickHouse-Exception-Tag"] = tag
        headers["Transfer-Encoding"] = "chunked"
        encoding = self._response_encoding(params)
        encoder = StreamEncoder(encoding) if encoding else None
        if encoding:
            headers["Content-Encoding"] = encoding
        encode = encoder.compress if encoder else bytes
        frame = ch_compression.compress if native else bytes

        def pack(data: bytes) -> bytes:
            return encode(frame(data))

        try:
            self.send_response(200)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self._write_chunk(pack(bytes(head)))
            try:
                for chunk in chunks:
                    self._write_chunk(pack(chunk))
            except EngineError as err:
                message = err.render(self.server.engine.version).rstrip("\n")
                block = f"__exception__\r\n{tag}\r\n{message}\n{len(message)} {tag}\r\n__exception__\r\n"
                self._write_chunk(pack(block.encode()))
                self.close_connection = True
            if encoder:
                self._write_chunk(encoder.flush())
        except OSError:
            self.close_connection = True  # the client left; leaving ``execute`` cancels the statement
        return self._end_chunks

    def _end_chunks(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _response_encoding(self, params: RequestParams) -> str | None:
        encoding = choose_response_encoding(self.headers.get("Accept-Encoding"))
        return encoding if encoding and params.flag("enable_http_compression", default=True) else None

    def _result_headers(self, outcome: Outcome, query_id: str, result_bytes: int) -> dict[str, str]:
        summary = {
            "read_rows": outcome.read_rows,
            "read_bytes": outcome.read_bytes,
            "written_rows": outcome.written_rows,
            "written_bytes": outcome.written_bytes,
            "total_rows_to_read": outcome.read_rows,
            "result_rows": outcome.result_rows,
            "result_bytes": result_bytes if outcome.result_format else outcome.written_bytes,
            "elapsed_ns": int(outcome.elapsed_s * 1e9),
        }
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Summary"] = json.dumps({k: str(v) for k, v in summary.items()}, separators=(",", ":"))
        headers["Content-Type"] = _content_type(outcome.result_format)
        if outcome.result_format:
            headers["X-ClickHouse-Format"] = outcome.result_format
        return headers

    def _send_error(self, err: EngineError, query_id: str, native: bool = False) -> None:
        """Answer with ``err``: its text as the body, in compressed blocks when ``native``."""
        if err.code in (0, _STD_EXCEPTION) or err.http_status >= 500:
            log.info("query %s failed: code %s: %s", query_id, err.code, err.text)
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Exception-Code"] = str(err.code)
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        body = err.render(self.server.engine.version).encode()
        self._send(err.http_status, ch_compression.compress(body) if native else body, headers)

    def _common_headers(self, query_id: str) -> dict[str, str]:
        return {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Server-Display-Name": self.server.display_name,
            "X-ClickHouse-Timezone": self.server.engine.timezone,
            "Keep-Alive": f"timeout={KEEP_ALIVE_S}",
        }

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True


def _with_counters(outcome: Outcome, body: bytes, elapsed_s: float) -> Outcome:
    stream = outcome.stream
    assert stream is not None
    return replace(
        outcome,
        body=body,
        stream=None,
        result_rows=stream.result_rows,
        read_rows=stream.read_rows,
        read_bytes=stream.read_bytes,
        elapsed_s=elapsed_s,
    )


def _protocol_version(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise EngineError(BAD_ARGUMENTS, f"client_protocol_version must be an integer, not '{value}'") from None


def _content_type(fmt: str | None) -> str:
    if fmt is None:
        return "text/plain; charset=UTF-8"
    if fmt.startswith(("TabSeparated", "TSV")):
        return "text/tab-separated-values; charset=UTF-8"
    if fmt.startswith("CSV"):
        return "text/csv; charset=UTF-8; header=absent"
    if fmt.startswith("JSON"):
        return "application/json; charset=UTF-8"
    if fmt.startswith(("Pretty", "Vertical", "Markdown", "Values", "XML")):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"
