"""ClickHouse exceptions as the embedded endpoint reports them over HTTP.

Every failure the endpoint answers with is an ``EngineError`` carrying ClickHouse's numeric code
and symbolic name, rendered exactly as a ClickHouse server renders it (``Code: N. DB::Exception:
... (NAME) (version V)``) with the HTTP status ClickHouse gives that code
(``src/Server/HTTP/exceptionCodeToHTTPStatus.cpp``). Clients therefore see the same codes from the
embedded endpoint as from a real server.
"""

from __future__ import annotations

import re

# ClickHouse's own codes (``errorCodeToName``) for the errors the endpoint raises itself.
UNSUPPORTED_METHOD = 1
UNEXPECTED_END_OF_FILE = 3
CANNOT_READ_ALL_DATA = 33
BAD_ARGUMENTS = 36
TOO_LARGE_SIZE_COMPRESSED = 39
CHECKSUM_DOESNT_MATCH = 40
NOT_IMPLEMENTED = 48
SYNTAX_ERROR = 62
UNKNOWN_COMPRESSION_METHOD = 89
READONLY = 164
CORRUPTED_DATA = 246
CANNOT_DECOMPRESS = 271
SESSION_IS_LOCKED = 373
UNKNOWN_CODEC = 432
AUTHENTICATION_FAILED = 516

_NAMES = {
    UNSUPPORTED_METHOD: "UNSUPPORTED_METHOD",
    UNEXPECTED_END_OF_FILE: "UNEXPECTED_END_OF_FILE",
    CANNOT_READ_ALL_DATA: "CANNOT_READ_ALL_DATA",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    TOO_LARGE_SIZE_COMPRESSED: "TOO_LARGE_SIZE_COMPRESSED",
    CHECKSUM_DOESNT_MATCH: "CHECKSUM_DOESNT_MATCH",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    UNKNOWN_COMPRESSION_METHOD: "UNKNOWN_COMPRESSION_METHOD",
    READONLY: "READONLY",
    CORRUPTED_DATA: "CORRUPTED_DATA",
    CANNOT_DECOMPRESS: "CANNOT_DECOMPRESS",
    SESSION_IS_LOCKED: "SESSION_IS_LOCKED",
    UNKNOWN_CODEC: "UNKNOWN_CODEC",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED",
}

_STATUS_BY_NAME: dict[str, int] = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(
        ("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE", "ACCESS_DENIED"), 403
    ),
    **dict.fromkeys(
        (
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        ),
        400,
    ),
    **dict.fromkeys(
        (
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        ),
        404,
    ),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "CANNOT_SCHEDULE_TASK": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

_CODE_RE = re.compile(r"Code: (\d+)\. DB::Exception: ")
#: ``DB::NetException``, ``DB::ErrnoException`` and the other kinds ClickHouse renders by their class name.
_KIND_CODE_RE = re.compile(r"Code: (\d+)\. DB::\w+Exception: ")
_TRAILER_RE = re.compile(r"(?:\s*\(version [^)]*\))+\.?\s*(?:\(([A-Z0-9_]+)\))?\s*$")
_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*$")


class EngineError(Exception):
    """A ClickHouse exception: ``code`` and ``name`` are ClickHouse's, ``text`` is the message alone."""

    def __init__(self, code: int, text: str, name: str | None = None):
        super().__init__(text)
        self.code = code
        self.name = name or _NAMES.get(code, "")
        self.text = text

    @property
    def http_status(self) -> int:
        """The HTTP status a ClickHouse server answers this exception with."""
        return _STATUS_BY_NAME.get(self.name, 500)

    def render(self, version: str) -> str:
        """The response body, as ClickHouse writes it."""
        suffix = f" ({self.name})" if self.name else ""
        return f"Code: {self.code}. DB::Exception: {self.text}{suffix} (version {version})\n"


def from_engine_message(message: str) -> EngineError:
    """Parse the text of a chDB exception (``Code: 60. DB::Exception: ... (UNKNOWN_TABLE)``).

    chDB sometimes nests one rendering inside another or prefixes it with its own words; the last
    ``Code: N. DB::Exception:`` wins, and version trailers are dropped (``render`` adds one back).
    Without one, the first ``Code: N. DB::<Kind>Exception:`` (``DB::NetException``, ...) is the
    error: the renderings after it are those its message quotes (the log of a remote shard's tries).
    A message without a code becomes a code-0 error carrying the whole text.
    """
    matches = list(_CODE_RE.finditer(message)) or list(_KIND_CODE_RE.finditer(message))[:1]
    if not matches:
        return EngineError(0, message.strip() or "unknown error in the embedded ClickHouse engine")
    last = matches[-1]
    text = message[last.end() :].strip()
    name = None
    trailer = _TRAILER_RE.search(text)
    if trailer:
        name = trailer.group(1)
        text = text[: trailer.start()]
    named = _NAME_RE.search(text)
    if named:
        name = name or named.group(1)
        text = text[: named.start()].rstrip()
    return EngineError(int(last.group(1)), text, name)
