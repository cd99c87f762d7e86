"""What one HTTP request asks of ClickHouse: URL parameters sorted as ClickHouse sorts them,
credentials, and the statement split from any inline data.

URL parameters are of four kinds, as on a ClickHouse server:
- transport parameters (``query``, ``database``, ``session_id``, ``query_id``, ``default_format``,
  ``user``, ``password``, ``wait_end_of_query``, ...), read by the endpoint itself;
- HTTP-only settings (``enable_http_compression``, ``send_progress_in_http_headers``, ``http_*``,
  ``cancel_http_readonly_queries_on_client_close``), which shape the reply and go no further;
- ``param_<name>``, the values of ``{name:Type}`` placeholders;
- every other name, a ClickHouse setting applied to this statement only (an unknown name fails
  the request with UNKNOWN_SETTING, as on a server), except ``<name>_structure``, ``_types`` and
  ``_format`` of an external table ``<name>`` sent in a multipart body.

The fields of a ``multipart/form-data`` body count as URL parameters. Values are decoded as
``latin-1`` (one character per byte), so SQL reaches the engine as the very bytes that were sent;
only ``param_*`` values are decoded as UTF-8 (the engine takes them as text).
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from embedded.ch_errors import AUTHENTICATION_FAILED, EngineError
from embedded.ch_sql import InsertWithData, quote, split_insert, statement_kind

if TYPE_CHECKING:
    from email.message import Message

TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "session_id",
        "session_timeout",
        "session_check",
        "close_session",
        "query_id",
        "user",
        "password",
        "quota_key",
        "stacktrace",
        "role",
        "wait_end_of_query",
        "buffer_size",
        "compress",
        "decompress",
        "client_protocol_version",
        "readonly",
    }
)
HTTP_ONLY_SETTINGS = frozenset(
    {
        "enable_http_compression",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "cancel_http_readonly_queries_on_client_close",
        "add_http_cors_header",
    }
)
#: ClickHouse parses at most max_query_size (256 KiB) of text looking for an INSERT's data.
MAX_STATEMENT_BYTES = 256 * 1024


@dataclass(frozen=True)
class RequestParams:
    """The URL parameters of one request, sorted by kind."""

    transport: dict[str, str] = field(default_factory=dict)
    http_settings: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # name -> SQL literal
    query_params: dict[str, str] = field(default_factory=dict)
    external: dict[str, str] = field(default_factory=dict)  # <table>_structure/_types/_format -> value

    @classmethod
    def parse(
        cls, query_string: str, form_fields: Iterable[tuple[str, str]] = (), external_tables: Collection[str] = ()
    ) -> RequestParams:
        """Sort the URL's parameters, then a form body's fields (which win over the URL's)."""
        parsed = cls()
        external_names = {
            f"{table}_{suffix}" for table in external_tables for suffix in ("structure", "types", "format")
        }
        pairs = [*parse_qsl(query_string, keep_blank_values=True, encoding="latin-1"), *form_fields]
        for name, value in pairs:
            if name in external_names:
                parsed.external[name] = value
            elif name in TRANSPORT_PARAMS:
                parsed.transport[name] = value
            elif name in HTTP_ONLY_SETTINGS or name.startswith("http_"):
                parsed.http_settings[name] = value
            elif name.startswith("param_"):
                parsed.query_params[name[len("param_") :]] = value.encode("latin-1").decode("utf-8", errors="replace")
            else:
                parsed.settings[name] = quote(value)
        return parsed

    def flag(self, name: str, default: bool = False) -> bool:
        """A boolean transport parameter or HTTP setting, read as ClickHouse reads it."""
        value = self.transport.get(name, self.http_settings.get(name))
        if value is None:
            return default
        return value.strip().lower() not in ("0", "false", "")


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str


def credentials(params: RequestParams, headers: Message) -> Credentials | None:
    """The user and password sent by Basic auth, ``X-ClickHouse-User``/``-Key`` or ``user``/``password``."""
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:].strip()).decode("latin-1").partition(":")
        except ValueError:
            user, password = "", ""
        return Credentials(user, password)
    if headers.get("X-ClickHouse-User") is not None or headers.get("X-ClickHouse-Key") is not None:
        return Credentials(headers.get("X-ClickHouse-User") or "default", headers.get("X-ClickHouse-Key") or "")
    if "user" in params.transport or "password" in params.transport:
        return Credentials(params.transport.get("user") or "default", params.transport.get("password", ""))
    return None


def authenticate(sent: Credentials | None, users: Mapping[str, str] | None) -> None:
    """Accept anyone when ``users`` is None (an endpoint started without users); else only a user of
    ``users`` (name -> password) with its password, a request without credentials being user
    ``default`` with an empty password. Raises AUTHENTICATION_FAILED with ClickHouse's text."""
    if users is None:
        return
    given = sent or Credentials("default", "")
    name = given.user.encode("latin-1").decode("utf-8", errors="replace")
    expected = users.get(name)
    # compare_digest either way, so a wrong name takes as long as a wrong password
    if hmac.compare_digest(given.password.encode("latin-1"), (expected or "").encode()) and expected is not None:
        return
    raise EngineError(
        AUTHENTICATION_FAILED,
        f"{name}: Authentication failed: password is incorrect, or there is no user with such name",
    )


@dataclass(frozen=True)
class Statement:
    """The SQL of a request (``latin-1`` text: one character per byte sent), and for an INSERT with
    inline rows, where those rows are."""

    sql: str
    kind: str
    insert: InsertWithData | None = None
    data: bytes | memoryview = b""


def split_statement(query_param: str | None, body: bytes) -> Statement:
    """Join the ``query`` parameter and the body as ClickHouse does (``query + "\\n" + body``) and
    split an INSERT's statement from its data without copying a large body."""
    param = (query_param or "").encode("latin-1")
    prefix = param + b"\n" if param else b""
    head = prefix + body[: max(0, MAX_STATEMENT_BYTES - len(prefix))]
    text = head.decode("latin-1")
    kind = statement_kind(text)
    if kind == "INSERT":
        split = split_insert(text)
        if split is not None:
            offset = split.data_offset
            data = memoryview(body)[offset - len(prefix) :] if offset >= len(prefix) else (prefix + body)[offset:]
            return Statement(split.statement, kind, split, data)
    sql = (prefix + body).decode("latin-1") if body else (query_param or "")
    return Statement(sql, kind)
