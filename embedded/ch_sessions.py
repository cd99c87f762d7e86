"""HTTP sessions (``session_id``): the settings a client SET, the database it USEd, and the engine
connection that holds its temporary tables.

As on a ClickHouse server, a session runs one statement at a time (a second concurrent request
fails with SESSION_IS_LOCKED), and it is forgotten, its connection closed and so its temporary
tables dropped, ``session_timeout`` seconds (60 by default) after its last request or at
``close_session=1``. A request without a session gets a state and a connection of its own, both
gone when the request ends.
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


@dataclass
class SessionState:
    """What a session carries between its requests."""

    open_connection: Callable[[], EngineConnection]
    settings: dict[str, str] = field(default_factory=dict)  # name -> SQL literal
    database: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    last_used: float = 0.0
    _conn: EngineConnection | None = None

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

    @contextmanager
    def hold(self, session_id: str | None, timeout_s: float | None = None) -> Iterator[SessionState]:
        """The session's state, locked against concurrent requests of the same session for the
        duration of the ``with`` block. Without an id, a state for this request alone."""
        if not session_id:
            state = SessionState(self._open)
            try:
                yield state
            finally:
                state.release()
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
        """Forget every session that is not in use (at shutdown)."""
        with self._mutex:
            idle = [sid for sid in self._states if sid not in self._busy]
            states = [self._states.pop(sid) for sid in idle]
        for state in states:
            state.release()

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, st in self._states.items() if now - st.last_used > st.timeout_s and sid not in self._busy]:
            self._states.pop(sid).release()
