"""The embedded keeper: a standalone Apache ZooKeeper on loopback, for chDB's KeeperMap tables.

ZooKeeper runs from Debian's jars (see :mod:`embedded.keeper_jars`) as ``java -cp ...
org.apache.zookeeper.server.ZooKeeperServerMain DATA_DIR/zoo.cfg``, with the admin server off and
only the ``ruok``, ``stat`` and ``srvr`` four-letter words allowed.

Guarantees: :meth:`EmbeddedKeeper.start` returns only once the server answers ``ruok`` with
``imok`` and ``srvr`` with its version (it serves requests); :meth:`EmbeddedKeeper.stop` returns
only once no process of it is left. Its data (every znode, hence every KeeperMap row) lives under
``data_dir``, written to disk before a write is acknowledged, and survives a stop, SIGKILL
included, and a start on the same directory. After the first start the port is kept: starting
again serves the same ``host:port``, the address the ClickHouse endpoint's configuration names. An
attached keeper (the default) dies with the process that started it, even on SIGKILL (see
:mod:`procs`).

Sessions: ``tickTime`` is :data:`TICK_MS`, so the server grants session timeouts between 2 and 20
ticks (1 to 10 s). A session whose client cannot reach the server for its timeout expires; a
stopped server expires none until it runs again.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any

from embedded.keeper_jars import find
from embedded.service import LoopbackService, NotReady
from protocol.errors import SetupError

#: ZooKeeper's ``tickTime``: its unit of time for heartbeats and session timeouts.
TICK_MS = 500
#: The JVM's options: a small heap and one GC thread, as the keeper shares its machine with the pipeline.
JVM_OPTIONS = (
    "-Xms16m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ",
)
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
#: The four-letter words the server answers (others are refused).
FOUR_LETTER_WORDS = ("ruok", "stat", "srvr")


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` on PATH. Raises SetupError when neither exists."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise SetupError(
            "the embedded keeper (ZooKeeper) needs Java 17+, and "
            + (f"$JAVA_HOME/bin/java ({candidate}) does not exist" if home else "'java' is not on PATH")
            + ": install it (Debian: apt-get install openjdk-17-jre-headless)"
        )
    return candidate


def ask(host: str, port: int, word: str, timeout_s: float = 2.0) -> str:
    """Send a four-letter word (``ruok``, ``srvr``, ``stat``) and return the whole answer. Raises OSError."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(word.encode("ascii"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def port_is_free(host: str, port: int) -> bool:
    """True when the keeper could bind ``host:port`` now. ZooKeeper binds with SO_REUSEADDR, so the
    connections a stopped keeper left in TIME_WAIT do not keep it off its port; a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class EmbeddedKeeper(LoopbackService):
    """ZooKeeper serving ``data_dir`` on ``host:port`` (``port=0``: a free port, kept from then on).

    ``detached=True`` lets it outlive this process (``chtxn embedded up --keeper``); ``log_path``
    receives its output. Example::

        with EmbeddedKeeper(".chtxn/keeper") as keeper:
            keeper.address  # "127.0.0.1:PORT", for ClickHouse's <zookeeper> configuration
            keeper.stop(); keeper.start()  # same port, same data
    """

    name = "keeper"
    title = "the embedded keeper (ZooKeeper)"

    def __init__(self, data_dir: str | Path, port: int = 0, host: str = "127.0.0.1", **kwargs: Any) -> None:
        super().__init__(port, host, **kwargs)
        self.data_dir = Path(data_dir).resolve()

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        """The ``zoo.cfg`` written at each start."""
        return self.data_dir / "zoo.cfg"

    def start(self) -> EmbeddedKeeper:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        super().start()
        self.requested_port = self.port  # a restart serves the address ClickHouse was configured with
        return self

    def __enter__(self) -> EmbeddedKeeper:
        return self.start()

    def ask(self, word: str) -> str:
        """The server's answer to a four-letter word (see :func:`ask`). Raises OSError."""
        return ask(self.host, self.port, word)

    def _argv(self) -> list[str]:
        jars = find()
        self.config_path.write_text(
            "# Written by chtxn's embedded keeper (embedded/keeper.py) at each start.\n"
            f"tickTime={TICK_MS}\n"
            f"dataDir={self.data_dir}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            "admin.enableServer=false\n"
            f"4lw.commands.whitelist={','.join(FOUR_LETTER_WORDS)}\n"
            "autopurge.snapRetainCount=3\n"
            "autopurge.purgeInterval=1\n"
        )
        library = [f"-Djava.library.path={jars.library_path}"] if jars.library_path else []
        classpath = ":".join(str(jar) for jar in jars.classpath)
        return [java_binary(), *JVM_OPTIONS, *library, "-cp", classpath, MAIN_CLASS, str(self.config_path)]

    def _cwd(self) -> str:
        return str(self.data_dir)

    def _probe(self) -> None:
        """``ruok`` answers ``imok`` as soon as the port is open, before the data is loaded; ``srvr``
        answers "not currently serving requests" until then."""
        try:
            ruok = self.ask("ruok")
            srvr = self.ask("srvr") if ruok == "imok" else ""
        except OSError as exc:
            raise NotReady(f"ruok/srvr: {exc}") from exc
        if ruok != "imok":
            raise NotReady(f"ruok answered {ruok[:80]!r}")
        if not srvr.startswith("Zookeeper version:"):
            raise NotReady(f"srvr answered {srvr.strip()[:80]!r}")

    def _port_is_free(self) -> bool:
        return port_is_free(self.host, self.port)
