"""HTTP sessions (``session_id``): the settings a client SET and the database it USEd.

As on a ClickHouse server, a session runs one statement at a time (a second concurrent request
fails with SESSION_IS_LOCKED), and its state is forgotten ``session_timeout`` seconds (60 by
default) after its last request. Only sessions that hold state are kept in memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from embedded.ch_errors import SESSION_IS_LOCKED, EngineError

DEFAULT_TIMEOUT_S = 60.0


@dataclass
class SessionState:
    """What a session carries between its requests."""

    settings: dict[str, str] = field(default_factory=dict)  # name -> SQL literal
    database: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    last_used: float = 0.0


class SessionStore:
    """Thread-safe map of session id to state; ``clock`` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._mutex = threading.Lock()
        self._states: dict[str, SessionState] = {}
        self._busy: set[str] = set()

    @contextmanager
    def hold(self, session_id: str | None, timeout_s: float | None = None) -> Iterator[SessionState]:
        """The session's state, locked against concurrent requests of the same session for the
        duration of the ``with`` block. Without an id, a throwaway state."""
        if not session_id:
            yield SessionState()
            return
        with self._mutex:
            now = self._clock()
            self._expire(now)
            if session_id in self._busy:
                raise EngineError(SESSION_IS_LOCKED, f"Session {session_id} is locked by a concurrent client")
            self._busy.add(session_id)
            state = self._states.get(session_id) or SessionState()
            if timeout_s is not None:
                state.timeout_s = timeout_s
        try:
            yield state
        finally:
            with self._mutex:
                self._busy.discard(session_id)
                state.last_used = self._clock()
                if state.settings or state.database:
                    self._states[session_id] = state

    def close(self, session_id: str) -> None:
        """Forget a session (``close_session=1``)."""
        with self._mutex:
            self._states.pop(session_id, None)

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, st in self._states.items() if now - st.last_used > st.timeout_s and sid not in self._busy]:
            del self._states[sid]
