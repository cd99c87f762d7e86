"""The control channel: one consumer and one producer on the single-partition control topic."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Producer, TopicPartition as KafkaTP

from clients import kafka as kafka_clients
from clients.kafka import BrokerUnreachable
from protocol import codec
from protocol.config import PipelineConfig
from protocol.messages import ControlMessage

log = logging.getLogger(__name__)


class ControlChannel:
    """Reads the control topic from its end at start-up (history is never needed) and broadcasts.

    ``send`` waits for the broker's acknowledgement: a message the caller saw sent is durable; one
    not acknowledged in time raises ``BrokerUnreachable`` (transient: the service backs off and
    starts again).
    """

    def __init__(self, cfg: PipelineConfig, *, client_id: str) -> None:
        self.cfg = cfg
        self.topic = cfg.control_topic
        self.client_id = client_id
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None

    def open(self) -> None:
        admin = kafka_clients.admin(self.cfg)
        kafka_clients.check_control_topic(admin, self.topic)
        self._consumer = Consumer(kafka_clients.consumer_conf(
            self.cfg, **{"group.id": f"{self.cfg.name}.chtxn-control-reader", "enable.auto.commit": False,
                         "client.id": self.client_id, "fetch.wait.max.ms": self.cfg.kafka.control_fetch_wait_ms,
                         "auto.offset.reset": "latest"}))
        self._consumer.assign([KafkaTP(self.topic, 0, OFFSET_END)])
        self._producer = Producer(kafka_clients.producer_conf(
            self.cfg, **{"client.id": self.client_id, "linger.ms": 0, "acks": "all", "enable.idempotence": True}))

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
        if self._consumer is not None:
            self._consumer.close()
        self._consumer = self._producer = None

    def poll(self, timeout: float, max_messages: int = 500) -> Iterator[ControlMessage]:
        assert self._consumer is not None, "open() first"
        for record in self._consumer.consume(max_messages, timeout):
            error = record.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("control topic read error", extra={"error": str(error)})
                continue
            message = codec.decode(record.value())
            if message is not None and message.pipeline == self.cfg.name:
                yield message

    def send(self, message: ControlMessage, timeout: float = 10.0) -> None:
        assert self._producer is not None, "open() first"
        self._producer.produce(self.topic, key=self.cfg.name.encode(), value=codec.encode(message))
        if self._producer.flush(timeout) > 0:
            raise BrokerUnreachable(
                f"could not deliver a {type(message).__name__} to control topic {self.topic} within {timeout:g} s: "
                f"is the broker at {self.cfg.kafka.bootstrap_servers} up?"
            )
