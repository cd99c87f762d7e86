"""ClickHouse error codes, sorted into what a caller should do about them.

Codes and names are ClickHouse's own (``src/Common/ErrorCodes.cpp``; in SQL,
``errorCodeToName(code)``). Three classes:

- ``RETRY``: the server or the path to it is busy, short of resources or briefly unavailable.
  Repeating the same request (with the same deduplication token) is safe and may succeed.
- ``DATA``: the records sent cannot be parsed or converted into the table's columns, or break a
  limit on one value (nested deeper than ``input_format_json_max_depth``, a string longer than a
  ``FixedString``). Repeating will fail the same way; the participant splits the chunk and sends
  the bad records to the dead-letter topic. In a chunk insert (a fixed ``INSERT ... FORMAT``
  query) these codes can only come from the bytes sent.
- ``PERMANENT``: everything else (missing table, syntax, permissions, ...). Repeating will not
  help; the operation fails and says why.

``MEMORY`` codes are ``RETRY`` codes that one record can also cause: ClickHouse says the same
when the server is short of memory and when parsing one record needs more than a query may use
(``max_memory_usage``). A caller retries them like any ``RETRY`` code; the stager
(``participant.stager``) blames a record only after it fails alone again while the server shows
memory to spare, never the records of a server that is short of memory.

Decisions are made from codes only, never from message text.
"""

from __future__ import annotations

import enum

#: Codes callers name: a table that does not exist, and a column (identifier) that does not.
UNKNOWN_IDENTIFIER = 47
UNKNOWN_TABLE = 60
#: A statement the server cannot parse: an older server than the syntax chtxn tries first.
SYNTAX_ERROR = 62
#: A setting the server does not know: an older server than a setting chtxn tries first.
UNKNOWN_SETTING = 115
#: MOVE PARTITION between tables of different columns ("Tables have different structure").
INCOMPATIBLE_COLUMNS = 122
#: The server refused the user or the password (``PERMANENT``): the operator fixes the credentials.
CREDENTIALS: dict[int, str] = {
    192: "UNKNOWN_USER",
    193: "WRONG_PASSWORD",
    194: "REQUIRED_PASSWORD",
    516: "AUTHENTICATION_FAILED",
}
#: What to do about a ``CREDENTIALS`` code.
CREDENTIALS_FIX = (
    "set clickhouse.user and clickhouse.password (or CHTXN_CLICKHOUSE_PASSWORD) to a user of that server "
    "and its password (an embedded endpoint started with `chtxn embedded up --user U --password P` takes "
    "only U with P; one started without them takes any)"
)


class ErrorClass(enum.Enum):
    RETRY = "retry"
    DATA = "data"
    PERMANENT = "permanent"


#: Transient failures: repeating the identical request may succeed.
RETRYABLE: dict[int, str] = {
    3: "UNEXPECTED_END_OF_FILE",  # request body cut short in transit
    159: "TIMEOUT_EXCEEDED",
    173: "CANNOT_ALLOCATE_MEMORY",  # MEMORY
    202: "TOO_MANY_SIMULTANEOUS_QUERIES",
    203: "NO_FREE_CONNECTION",
    209: "SOCKET_TIMEOUT",
    210: "NETWORK_ERROR",
    225: "NO_ZOOKEEPER",
    236: "ABORTED",
    241: "MEMORY_LIMIT_EXCEEDED",  # MEMORY
    242: "TABLE_IS_READ_ONLY",
    244: "UNEXPECTED_ZOOKEEPER_ERROR",
    252: "TOO_MANY_PARTS",
    254: "NO_ACTIVE_REPLICAS",
    279: "ALL_CONNECTION_TRIES_FAILED",
    285: "TOO_FEW_LIVE_REPLICAS",
    286: "UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE",
    289: "REPLICA_IS_NOT_IN_QUORUM",
    319: "UNKNOWN_STATUS_OF_INSERT",  # the insert may or may not have landed: retry with the same token
    364: "RECEIVED_ERROR_TOO_MANY_REQUESTS",
    373: "SESSION_IS_LOCKED",
    384: "PART_IS_TEMPORARILY_LOCKED",
    415: "ALL_REPLICAS_LOST",
    416: "REPLICA_STATUS_CHANGED",
    425: "SYSTEM_ERROR",
    439: "CANNOT_SCHEDULE_TASK",
    473: "DEADLOCK_AVOIDED",
    517: "CANNOT_ASSIGN_ALTER",
    738: "PART_IS_LOCKED",
    749: "TCP_CONNECTION_LIMIT_REACHED",
    762: "HTTP_CONNECTION_LIMIT_REACHED",
    777: "MEMORY_RESERVATION_KILLED",
    778: "MEMORY_RESERVATION_FAILED",
    999: "KEEPER_EXCEPTION",
    1017: "ASYNC_INSERT_FLUSH_TIMEOUT",
    1019: "QUERY_SLOT_ACQUISITION_TIMEOUT",
    1020: "MEMORY_RESERVATION_ACQUISITION_TIMEOUT",
}

#: Retryable codes one record can cause too: out of memory (see the module's docstring).
MEMORY: dict[int, str] = {
    173: "CANNOT_ALLOCATE_MEMORY",
    241: "MEMORY_LIMIT_EXCEEDED",
}

#: The records themselves are bad: the same bytes always fail the same way.
DATA: dict[int, str] = {
    6: "CANNOT_PARSE_TEXT",
    25: "CANNOT_PARSE_ESCAPE_SEQUENCE",
    26: "CANNOT_PARSE_QUOTED_STRING",
    27: "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
    32: "ATTEMPT_TO_READ_AFTER_EOF",  # a record cut short inside the chunk
    33: "CANNOT_READ_ALL_DATA",  # a record cut short inside the chunk
    38: "CANNOT_PARSE_DATE",
    41: "CANNOT_PARSE_DATETIME",
    53: "TYPE_MISMATCH",
    69: "ARGUMENT_OUT_OF_BOUND",
    70: "CANNOT_CONVERT_TYPE",
    72: "CANNOT_PARSE_NUMBER",
    117: "INCORRECT_DATA",
    128: "TOO_LARGE_ARRAY_SIZE",
    130: "CANNOT_READ_ARRAY_FROM_TEXT",
    131: "TOO_LARGE_STRING_SIZE",
    190: "SIZES_OF_ARRAYS_DONT_MATCH",
    306: "TOO_DEEP_RECURSION",  # JSON nested deeper than input_format_json_max_depth
    321: "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",  # e.g. a Date past 2149 with date_time_overflow_behavior = 'throw'
    346: "CANNOT_CONVERT_CHARSET",
    349: "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN",
    376: "CANNOT_PARSE_UUID",
    395: "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO",  # a throwIf in a DEFAULT or MATERIALIZED expression
    407: "DECIMAL_OVERFLOW",
    441: "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
    444: "UNKNOWN_PROTOBUF_FORMAT",  # a Protobuf record that is not a message of the schema
    467: "CANNOT_PARSE_BOOL",
    469: "VIOLATED_CONSTRAINT",
    563: "CANNOT_READ_MAP_FROM_TEXT",
    632: "UNEXPECTED_DATA_AFTER_PARSED_VALUE",
    675: "CANNOT_PARSE_IPV4",
    676: "CANNOT_PARSE_IPV6",
    691: "UNKNOWN_ELEMENT_OF_ENUM",
}


def classify(code: int | None) -> ErrorClass:
    """What to do about ClickHouse error ``code``; an unknown or missing code is ``PERMANENT``."""
    if code in RETRYABLE:
        return ErrorClass.RETRY
    if code in DATA:
        return ErrorClass.DATA
    return ErrorClass.PERMANENT


def is_memory(code: int | None) -> bool:
    """Whether ``code`` says ClickHouse ran out of memory: the server's load, or one record's size."""
    return code in MEMORY


def name_of(code: int) -> str:
    """The symbolic name of ``code`` when this table knows it, else ``"code <n>"``."""
    return RETRYABLE.get(code) or DATA.get(code) or CREDENTIALS.get(code) or f"code {code}"
