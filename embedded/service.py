"""A local server process on one loopback port: pick the port, spawn, wait until it answers, stop.

Guarantees: :meth:`LoopbackService.start` returns only once the subclass's probe succeeds, and
raises :class:`~protocol.errors.SetupError` (with the end of the server's output) when the server
exits or does not answer in time, leaving no process behind. :meth:`LoopbackService.stop` returns
only once no process of the server is left. When the port was left to us (``port=0``) and another
process takes it between our pick and the server's bind, the start is retried on a new port.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from procs import ManagedProcess, free_port, port_is_free
from protocol.errors import SetupError

log = logging.getLogger(__name__)

#: Tries when the port was picked for us and another process took it before the server bound it.
_PORT_ATTEMPTS = 3


class NotReady(Exception):
    """Raised by a probe: the server does not answer yet; look again."""


class _Exited(Exception):
    pass


class LoopbackService:
    """Base of the embedded servers. Subclasses set ``name``/``title`` and implement ``_argv``/``_probe``.

    ``detached=True`` lets the server outlive this process (it is then stopped by pid, see
    :func:`procs.stop_group`); otherwise it dies with this process. ``log_path`` receives
    its output. Constructing starts nothing.
    """

    name = "service"
    title = "the embedded service"

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        log_path: Path | None = None,
        detached: bool = False,
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.port = port
        self.log_path = log_path
        self.detached = detached
        self.ready_timeout_s = ready_timeout_s
        self._process: ManagedProcess | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{self.title} is not started")
        return self._process.pid

    @property
    def token(self) -> str | None:
        """The start token of the server process (see :func:`procs.start_token`)."""
        return None if self._process is None else self._process.token

    def running(self) -> bool:
        """True while the process this object started runs."""
        return self._process is not None and self._process.running()

    def answers(self) -> bool:
        """True when a server (ours or not) answers on ``host:port`` right now."""
        try:
            self._probe()
        except NotReady:
            return False
        return True

    def start(self) -> LoopbackService:
        """Start the server and wait until it answers. Raises SetupError."""
        if self._process is not None:
            raise RuntimeError(f"{self.title} is already running on {self.host}:{self.port}")
        attempts = _PORT_ATTEMPTS if self.requested_port == 0 else 1
        for attempt in range(1, attempts + 1):
            self.port = self.requested_port or free_port(self.host)
            if not self._port_is_free():
                raise SetupError(
                    f"cannot start {self.title}: {self.host}:{self.port} is already in use; "
                    "stop what listens there or choose another port (port 0 picks a free one)"
                )
            self._process = ManagedProcess(
                self.name,
                self._argv(),
                log_path=self.log_path,
                env=self._env(),
                detached=self.detached,
                cwd=self._cwd(),
            )
            self._process.start()
            try:
                self._wait_ready()
            except _Exited:
                process, self._process = self._process, None
                process.stop()
                taken = not self._port_is_free()
                if taken and attempt < attempts:
                    log.info(
                        "port taken before the server could bind, retrying",
                        extra={"service": self.name, "port": self.port},
                    )
                    continue
                raise SetupError(
                    f"{self.title} exited while starting on {self.host}:{self.port}"
                    + (" (the port was taken by another process)" if taken else "")
                    + f"; its output:\n{process.log_tail()}"
                ) from None
            except BaseException:
                self.stop()
                raise
            log.info("embedded server ready", extra={"service": self.name, "port": self.port, "pid": self.pid})
            return self
        raise AssertionError("unreachable: the last attempt returns or raises")

    def stop(self) -> None:
        """Stop the server; returns once no process of it is left. Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            process.stop()

    def __enter__(self) -> LoopbackService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for subclasses ------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        """The command line serving on ``self.host:self.port``."""
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        """The server's environment (None: ours)."""
        return None

    def _cwd(self) -> str | None:
        return None

    def _probe(self) -> None:
        """Return when the server answers; raise :class:`NotReady` when it does not yet."""
        raise NotImplementedError

    def _port_is_free(self) -> bool:
        """Whether the server could bind ``host:port`` now (see :func:`procs.port_is_free`)."""
        return port_is_free(self.host, self.port)

    # -- internals -----------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        def probe() -> None:
            assert self._process is not None
            if self._process.poll() is not None:
                raise _Exited()
            self._probe()

        try:
            for attempt in Retrying(
                stop=stop_after_delay(self.ready_timeout_s),
                wait=wait_fixed(0.05),
                retry=retry_if_exception_type(NotReady),
                reraise=True,
            ):
                with attempt:
                    probe()
        except NotReady as exc:
            assert self._process is not None
            raise SetupError(
                f"{self.title} on {self.host}:{self.port} did not answer within "
                f"{self.ready_timeout_s:g}s (last: {exc}); its output:\n{self._process.log_tail()}"
            ) from None
