"""HTTP sessions (``session_id``): the settings a client SET, the database it USEd, and the engine
connection that holds its temporary tables.

As on a ClickHouse server, a session runs one statement at a time (a second concurrent request
fails with SESSION_IS_LOCKED), and it is forgotten, its connection closed and so its temporary
tables dropped, ``session_timeout`` seconds (60 by default) after its last request or at
``close_session=1``. A request without a session gets a state of its own, gone when the request
ends, and an engine connection that no other request uses meanwhile: an idle one kept from an
earlier request when there is one (opening a connection, then USE, cost more than a small
statement itself), else a new one. A connection is kept only after a statement that succeeded and
cannot have left anything in it but settings and a current database, which the next request's
statement resets (``EngineConnection.apply``); anything else closes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from embedded.ch_connection import EngineConnection
from embedded.ch_errors import SESSION_IS_LOCKED, EngineError

DEFAULT_TIMEOUT_S = 60.0
#: Idle connections kept for requests without a session (more concurrent requests open more).
POOL_SIZE = 8
#: Statements after which a connection holds nothing a later request could see: no temporary
#: table, role or transaction (a statement naming TEMPORARY is excluded whatever its kind).
_CLEAN_KINDS = frozenset(
    {
        "SELECT",
        "WITH",
        "INSERT",
        "ALTER",
        "CREATE",
        "DROP",
        "EXISTS",
        "SHOW",
        "DESCRIBE",
        "DESC",
        "EXPLAIN",
        "CHECK",
        "OPTIMIZE",
        "TRUNCATE",
        "RENAME",
        "KILL",
    }
)


@dataclass
class SessionState:
    """What a session carries between its requests."""

    open_connection: Callable[[], EngineConnection]
    settings: dict[str, str] = field(default_factory=dict)  # name -> SQL literal
    database: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    last_used: float = 0.0
    reusable: bool = False  # set by ``ran``: the connection may serve another request
    _conn: EngineConnection | None = None

    def ran(self, kind: str, sql: str, *, external_tables: bool = False) -> None:
        """Note the statement this state's connection runs (``kind`` as ``ch_sql.statement_kind``);
        a request with external tables creates temporary tables, so its connection is not kept."""
        self.reusable = kind in _CLEAN_KINDS and not external_tables and "TEMPORARY" not in sql.upper()

    @property
    def connection(self) -> EngineConnection:
        """The session's engine connection, opened on first use."""
        if self._conn is None:
            self._conn = self.open_connection()
        return self._conn

    def release(self) -> None:
        """Close the connection (dropping the session's temporary tables)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class SessionStore:
    """Thread-safe map of session id to state; ``clock`` is injectable for tests."""

    def __init__(self, open_connection: Callable[[], EngineConnection], clock: Callable[[], float] = time.monotonic):
        self._open = open_connection
        self._clock = clock
        self._mutex = threading.Lock()
        self._states: dict[str, SessionState] = {}
        self._busy: set[str] = set()
        self._idle: list[EngineConnection] = []  # for requests without a session

    @contextmanager
    def hold(self, session_id: str | None, timeout_s: float | None = None) -> Iterator[SessionState]:
        """The session's state, locked against concurrent requests of the same session for the
        duration of the ``with`` block. Without an id, a state for this request alone."""
        if not session_id:
            state = SessionState(self._checkout)
            try:
                yield state
            except BaseException:
                state.release()
                raise
            self._checkin(state)
            return
        with self._mutex:
            now = self._clock()
            self._expire(now)
            if session_id in self._busy:
                raise EngineError(SESSION_IS_LOCKED, f"Session {session_id} is locked by a concurrent client")
            self._busy.add(session_id)
            state = self._states.setdefault(session_id, SessionState(self._open))
            if timeout_s is not None:
                state.timeout_s = timeout_s
        try:
            yield state
        finally:
            with self._mutex:
                self._busy.discard(session_id)
                state.last_used = self._clock()

    def close(self, session_id: str) -> None:
        """Forget a session (``close_session=1``)."""
        with self._mutex:
            state = self._states.pop(session_id, None) if session_id not in self._busy else None
        if state is not None:
            state.release()

    def close_all(self) -> None:
        """Forget every session that is not in use, and close the idle connections (at shutdown)."""
        with self._mutex:
            idle = [sid for sid in self._states if sid not in self._busy]
            states = [self._states.pop(sid) for sid in idle]
            conns, self._idle = self._idle, []
        for state in states:
            state.release()
        for conn in conns:
            conn.close()

    def _checkout(self) -> EngineConnection:
        with self._mutex:
            if self._idle:
                return self._idle.pop()
        return self._open()

    def _checkin(self, state: SessionState) -> None:
        """Keep the connection of a sessionless request that ended well, if it is clean."""
        conn, state._conn = state._conn, None
        if conn is None:
            return
        if state.reusable:
            with self._mutex:
                if len(self._idle) < POOL_SIZE:
                    self._idle.append(conn)
                    return
        conn.close()

    def _expire(self, now: float) -> None:
        for sid in [
            sid for sid, st in self._states.items() if now - st.last_used > st.timeout_s and sid not in self._busy
        ]:
            self._states.pop(sid).release()
