"""ClickHouse clients and the retry policy every ClickHouse call goes through.

Retry decisions come from exception types and ClickHouse error codes (``protocol.chcodes``),
never from message text. A call that finally fails raises ``protocol.errors.ClickHouseError``
naming the operation, with ``code`` (0 when the server gave none) and ``retryable``.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn
from urllib.parse import urlsplit

import clickhouse_connect
import tenacity
import urllib3.exceptions
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import Error as DriverError, OperationalError

from protocol import chcodes, secrets
from protocol.config.sections import ClickHouseSection
from protocol.errors import ClickHouseError

log = logging.getLogger(__name__)
_told = threading.local()  # ``retries_told``'s callback of this thread

#: Failures of the path to the server (no ClickHouse error code): always worth another try.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    socket.timeout,
    urllib3.exceptions.HTTPError,
)
#: urllib3's reason for a connection that could not be opened, inside its longer message.
_NO_CONNECTION = re.compile(r"Failed to establish a new connection: ([^\"')]+)")
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (DriverError, *_TRANSPORT_ERRORS)


class InsertBody(bytes):
    """The body of an ``INSERT`` for ``Client.command(data=...)``: the same bytes, sent whole.

    clickhouse-connect (1.12) decodes a command's whole body and joins it to the statement, only to
    tell whether the request may be retried as a read; an INSERT never is, whatever its body. That
    costs 0.18-0.40 µs per JSON record, about as much as building the body (``benchmarks.records``). Asked
    to decode, this body answers "": the statement alone decides, at the cost of one copy."""

    __slots__ = ()

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return ""


def make_client(section: ClickHouseSection, *, url_key: str = "clickhouse.url", **settings: Any) -> Client:
    """A clickhouse-connect client for ``section``, shareable between threads.

    Every request carries ``async_insert=0`` (the commit protocol needs synchronous inserts),
    then ``section.insert_settings``, then ``settings``. No session id is generated, so many
    threads may use the client at once. Connecting queries the server once: an unreachable or
    refusing server raises ``ClickHouseError`` saying what to check, ``url_key`` naming the setting
    that gave ``section.url`` (``shard_client``: a shard's).
    """
    url = urlsplit(section.url)
    secure = url.scheme == "https"
    try:
        return clickhouse_connect.get_client(
            host=url.hostname or "localhost",
            port=url.port or (8443 if secure else 8123),
            secure=secure,
            username=section.user,
            password=section.password,
            database=section.database,
            settings={"async_insert": 0, **section.insert_settings, **settings},
            autogenerate_session_id=False,
            connect_timeout=section.connect_timeout_s,
            send_receive_timeout=section.send_receive_timeout_s,
        )
    except _CONNECT_ERRORS as exc:
        code = error_code(exc)
        if code in chcodes.CREDENTIALS:
            raise ClickHouseError(
                f"ClickHouse at {secrets.mask_url(section.url)} refused user {section.user!r}: {_describe(exc)}; "
                f"{chcodes.CREDENTIALS_FIX}",
                code=code,
                retryable=False,
            ) from exc
        raise ClickHouseError(
            f"cannot connect to ClickHouse at {secrets.mask_url(section.url)} (database {section.database!r}, user "
            f"{section.user!r}): {_describe(exc)}; check {url_key}, clickhouse.user and "
            "clickhouse.password, and that the server is running (embedded: chtxn embedded up)",
            code=code,
            retryable=is_retryable(exc),
        ) from exc


def shard_client(index: int, section: ClickHouseSection, **settings: Any) -> Client:
    """``make_client`` for the 0-based shard ``index`` of ``clickhouse.shards`` (``section``, one of
    ``PipelineConfig.shard_sections``): a failure to connect names that shard's entry."""
    return make_client(section, url_key=f"clickhouse.shards[{index}] (shard {index + 1})", **settings)


def error_code(exc: BaseException) -> int:
    """ClickHouse's error code carried by ``exc``, or 0 when there is none (e.g. a dropped connection)."""
    code = getattr(exc, "code", None)
    if isinstance(exc, (DriverError, ClickHouseError)) and isinstance(code, int):
        return code
    return 0


def is_retryable(exc: BaseException) -> bool:
    """True when repeating the same call may succeed.

    Transport failures and clickhouse-connect's ``OperationalError`` without a code are
    retryable; a server error is retryable exactly when its code is ``chcodes.RETRYABLE``.
    """
    if isinstance(exc, ClickHouseError):
        return exc.retryable
    if isinstance(exc, DriverError):
        code = getattr(exc, "code", None)
        if code is not None:
            return chcodes.classify(code) is chcodes.ErrorClass.RETRY
        return isinstance(exc, OperationalError)
    return isinstance(exc, _TRANSPORT_ERRORS)


def is_clickhouse_failure(exc: BaseException) -> bool:
    """True for the exceptions a ClickHouse call raises (as opposed to bugs in the caller)."""
    return isinstance(exc, (DriverError, ClickHouseError, *_TRANSPORT_ERRORS))


def as_clickhouse_error(exc: BaseException, what: str, attempts: int = 1) -> ClickHouseError:
    """``exc`` as a ``ClickHouseError`` naming the operation ``what``."""
    if isinstance(exc, ClickHouseError) and not attempts > 1:
        return exc
    code = error_code(exc)
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return ClickHouseError(f"{what} failed{tries}: {_describe(exc)}", code=code, retryable=is_retryable(exc))


def _describe(exc: BaseException) -> str:
    code = error_code(exc)
    text = str(exc).strip() or type(exc).__name__
    if code:
        return f"ClickHouse error {code} ({chcodes.name_of(code)}): {text}"
    if refused := _NO_CONNECTION.search(text):  # the reason, without urllib3's retry and pool wording
        return refused.group(1)
    return f"{type(exc).__name__}: {text}"


@contextmanager
def retries_told(tell: Callable[[ClickHouseError], None]) -> Iterator[None]:
    """Within the block, on this thread, ``tell(error)`` before each wait of a ``retrying`` policy:
    ``error`` is the retryable failure, as a ``ClickHouseError`` naming the operation. A caller that
    says nothing while it retries (a coordinator standby's STANDBY-HEARTBEATs) can say why; a
    failure of ``tell`` is logged, never raised into the retries."""
    outer = getattr(_told, "tell", None)
    _told.tell = tell
    try:
        yield
    finally:
        _told.tell = outer


def _log_retry(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    retrying = state.retry_object
    tell = getattr(_told, "tell", None)
    if tell is not None and exc is not None:
        try:
            tell(as_clickhouse_error(exc, getattr(retrying, "what", "clickhouse call"), 1))
        except Exception as failure:
            log.warning("could not tell a retry: %s", failure)
    log.warning(
        "retrying %s after a retryable ClickHouse error",
        getattr(retrying, "what", "clickhouse call"),
        extra={
            "operation": getattr(retrying, "what", ""),
            "attempt": state.attempt_number,
            "code": error_code(exc) if exc else 0,
            "error": _describe(exc) if exc else "",
            "sleep_s": round(state.upcoming_sleep, 3),
        },
    )


class ClickHouseRetrying(tenacity.Retrying):
    """``tenacity.Retrying`` that raises ``ClickHouseError`` naming ``what`` when it gives up.

    Non-retryable errors are raised at once (converted the same way); exceptions that do not
    come from ClickHouse (bugs, ``ChtxnError`` of the caller) pass through unchanged.
    """

    def __init__(self, *args: Any, what: str = "clickhouse call", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.what = what

    def copy(self, *args: Any, **kwargs: Any) -> ClickHouseRetrying:
        clone = super().copy(*args, **kwargs)
        clone.what = self.what
        return clone

    def _attempts(self) -> int:
        return int(self.statistics.get("attempt_number", 1))

    def __iter__(self) -> Generator[tenacity.AttemptManager, None, None]:
        try:
            yield from super().__iter__()
        except BaseException as exc:
            self._reraise(exc)

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(fn, *args, **kwargs)
        except BaseException as exc:
            self._reraise(exc)

    def _reraise(self, exc: BaseException) -> NoReturn:
        converted = as_clickhouse_error(exc, self.what, self._attempts()) if is_clickhouse_failure(exc) else exc
        if converted is exc:
            raise exc
        raise converted from exc


#: The waits between tries of ``retrying``: from this, doubling, up to ``RETRY_MAX_S`` (plus jitter).
RETRY_INITIAL_S = 0.1
RETRY_MAX_S = 5.0


def retry_budget_s(attempts: int) -> float:
    """The longest ``retrying(attempts, ...)`` sleeps in all before it gives up (the tries' own time aside)."""
    return sum(min(RETRY_MAX_S, RETRY_INITIAL_S * 2**n) + RETRY_INITIAL_S for n in range(max(0, attempts - 1)))


def retrying(
    attempts: int,
    what: str,
    *,
    initial_s: float = RETRY_INITIAL_S,
    max_s: float = RETRY_MAX_S,
    sleep: Callable[[float], None] = time.sleep,
) -> ClickHouseRetrying:
    """A retry policy for one ClickHouse operation: up to ``attempts`` tries in all.

    Waits grow exponentially from ``initial_s`` up to ``max_s``, with jitter; each retry is
    logged with the operation, attempt number and error code. Use it either way::

        rows = retrying(8, "read the ledger head")(client.query, sql, parameters=params)

        for attempt in retrying(8, f"insert chunk {token}"):
            with attempt:
                client.insert(table, data, settings={"insert_deduplication_token": token})

    Retrying an insert is safe only with a deduplication token: the first try may have landed.
    """
    return ClickHouseRetrying(
        what=what,
        stop=tenacity.stop_after_attempt(max(1, attempts)),
        wait=tenacity.wait_exponential(multiplier=initial_s, max=max_s) + tenacity.wait_random(0, initial_s),
        retry=tenacity.retry_if_exception(is_retryable),
        before_sleep=_log_retry,
        reraise=True,
        sleep=sleep,
    )
