"""The control channel: one consumer and one producer on the single-partition control topic."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from confluent_kafka import OFFSET_END, Producer

from clients import kafka as kafka_clients
from clients.control_reader import ControlReader
from clients.kafka import BrokerUnreachable, KafkaClientFactory
from protocol import codec, naming
from protocol.config.parse import PipelineConfig
from protocol.messages import ControlMessage


class ControlChannel:
    """Reads the control topic from its end at start-up (history is never needed) and broadcasts.

    ``send`` waits for the broker's acknowledgement: a message the caller saw sent is durable; one
    not acknowledged in time raises ``BrokerUnreachable`` (transient: the service backs off and
    starts again).
    """

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        client_id: str,
        who: str = "",
        on_hole: Callable[[], None] | None = None,
        kafka: KafkaClientFactory | None = None,
    ) -> None:
        self.cfg = cfg
        self.kafka = kafka or KafkaClientFactory(cfg)
        self.on_hole = on_hole  # called per hole in the control topic's offsets (``ControlReader``)
        self.topic = cfg.control_topic
        self.client_id = client_id
        self.who = who or client_id  # the reader's name for failpoints
        self._reader: ControlReader | None = None
        self._producer: Producer | None = None

    def open(self) -> None:
        kafka_clients.check_control_topic(
            self.kafka.admin(), self.topic, bootstrap=self.kafka.cfg.kafka.bootstrap_servers
        )
        self._reader = ControlReader(
            self.kafka.consumer(
                **{
                    "group.id": naming.control_reader_group(self.cfg.name),
                    "enable.auto.commit": False,
                    "client.id": self.client_id,
                    "fetch.wait.max.ms": self.cfg.kafka.control_fetch_wait_ms,
                    "auto.offset.reset": "latest",
                }
            ),
            self.topic,
            who=self.who,
            on_hole=self.on_hole,
        )
        self._reader.assign(OFFSET_END)
        self._producer = self.kafka.producer(
            **{"client.id": self.client_id, "linger.ms": 0, "acks": "all", "enable.idempotence": True}
        )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
        if self._reader is not None:
            self._reader.close()
        self._reader = self._producer = None

    def poll(self, timeout: float, max_messages: int = 500) -> Iterator[ControlMessage]:
        """This pipeline's messages read within ``timeout``, in order, none left out (``ControlReader``)."""
        assert self._reader is not None, "open() first"
        for message in self._reader.read(max_messages, timeout):
            if message.pipeline == self.cfg.name:
                yield message

    def send(self, message: ControlMessage, timeout: float = 10.0) -> None:
        assert self._producer is not None, "open() first"
        self._producer.produce(self.topic, key=self.cfg.name.encode(), value=codec.encode(message))
        if self._producer.flush(timeout) > 0:
            raise BrokerUnreachable(
                f"could not deliver a {type(message).__name__} to control topic {self.topic} within {timeout:g} s: "
                f"is the broker at {self.cfg.kafka.bootstrap_servers} up?"
            )
