"""confluent-kafka configurations, the client factory (``KafkaClientFactory``) and the topic checks
every chtxn process shares.

Precedence of properties: chtxn's defaults, then ``[kafka.properties]`` from the pipeline
config (passed through untouched, as every Kafka tool does), then the caller's ``extra``
(librdkafka property names, e.g. ``consumer_conf(cfg, **{"group.id": "x"})``).
librdkafka's own log lines go to the Python logger ``chtxn.kafka``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from protocol import naming, topic_patterns
from protocol.config.parse import PipelineConfig
from protocol.errors import SetupError
from protocol.messages import TopicPartition

_librdkafka_log = logging.getLogger("chtxn.kafka")

#: How long a metadata request may take before the broker counts as unreachable.
DEFAULT_TIMEOUT_S = 10.0


class BrokerUnreachable(SetupError):
    """No Kafka broker answered at the configured bootstrap address in time (may be transient)."""


def _common(cfg: PipelineConfig) -> dict[str, Any]:
    return {"bootstrap.servers": cfg.kafka.bootstrap_servers, "logger": _librdkafka_log}


def consumer_conf(cfg: PipelineConfig, **extra: Any) -> dict[str, Any]:
    """A consumer in group ``<pipeline>`` starting per ``start_from``.

    It never commits or stores offsets on its own: offsets reach the group only through an
    explicit ``commit(offsets=...)`` (after ACK-COMMIT), and are never read back as truth.
    """
    return {
        **_common(cfg),
        "group.id": naming.consumer_group(cfg.name),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": cfg.pipeline.start_from,
        **cfg.kafka.properties,
        **extra,
    }


def producer_conf(cfg: PipelineConfig, **extra: Any) -> dict[str, Any]:
    """An idempotent producer (``acks=all``): a retried send is never written twice."""
    return {**_common(cfg), "enable.idempotence": True, "acks": "all", **cfg.kafka.properties, **extra}


def admin(cfg: PipelineConfig, **extra: Any) -> AdminClient:
    """An admin client; creating it does no network I/O."""
    return AdminClient({**_common(cfg), **cfg.kafka.properties, **extra})


class KafkaClientFactory:
    """Makes every Kafka client of one pipeline, so that each applies the bootstrap servers and
    ``[kafka.properties]`` (the precedence of the module docstring): ``consumer(**overrides)``,
    ``producer(**overrides)``, ``admin()``.

    Built once from the pipeline config and handed to the components that make clients. It holds
    nothing but the config: making it does no I/O, and it pickles (Spark ships participants).
    """

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg

    def consumer(self, **overrides: Any) -> Consumer:
        """A consumer per ``consumer_conf``; ``overrides`` are librdkafka properties."""
        return Consumer(consumer_conf(self.cfg, **overrides))

    def producer(self, **overrides: Any) -> Producer:
        """A producer per ``producer_conf``; ``overrides`` are librdkafka properties."""
        return Producer(producer_conf(self.cfg, **overrides))

    def admin(self) -> AdminClient:
        """An admin client; making it does no network I/O."""
        return admin(self.cfg)


def cluster_metadata(
    client: AdminClient | Consumer, timeout_s: float = DEFAULT_TIMEOUT_S, bootstrap: str = ""
) -> ClusterMetadata:
    """Metadata of every topic, within ``timeout_s``; raises ``BrokerUnreachable`` otherwise.

    Lists all topics rather than asking for one by name, so no topic is auto-created.
    """
    try:
        return client.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        where = f"at {bootstrap}" if bootstrap else "at kafka.bootstrap_servers"
        raise BrokerUnreachable(
            f"cannot reach a Kafka broker {where} within {timeout_s:g} s: {_reason(exc)}; check "
            "kafka.bootstrap_servers or CHTXN_KAFKA_BOOTSTRAP_SERVERS, and that the broker is "
            "running (embedded: chtxn embedded up)"
        ) from None


def partitions_of(
    client: AdminClient | Consumer,
    topics: list[str] | tuple[str, ...],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    bootstrap: str = "",
) -> list[TopicPartition]:
    """Every partition of ``topics``, sorted; raises ``SetupError`` naming a missing topic. An entry
    ``re:<regex>`` stands for every topic whose whole name it matches (``protocol.topic_patterns``)."""
    metadata = cluster_metadata(client, timeout_s, bootstrap)
    existing = [name for name, found in metadata.topics.items() if found.error is None and found.partitions]
    result: list[TopicPartition] = []
    for topic in topic_patterns.matching(topics, existing):
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise SetupError(
                f"Kafka topic {topic!r} does not exist{' on ' + bootstrap if bootstrap else ''}: create it "
                f"(e.g. kafka-topics.sh --create --topic {topic} --partitions N) or fix pipeline.topics"
            )
        result.extend(TopicPartition(topic=topic, partition=p) for p in found.partitions)
    return sorted(result)


def create_topics(
    client: AdminClient,
    partitions: Mapping[str, int],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    bootstrap: str = "",
) -> dict[str, bool]:
    """Create the topics named in ``partitions`` (name -> partition count) that do not exist.

    Idempotent: returns, per topic, True if this call created it and False if it already
    existed (its partition count is left as it is). Returns once the new topics show in metadata.
    """
    existing = cluster_metadata(client, timeout_s, bootstrap).topics
    wanted = [
        NewTopic(name, num_partitions=n, replication_factor=-1)
        for name, n in partitions.items()
        if name not in existing
    ]
    created = {name: False for name in partitions}
    if not wanted:
        return created
    futures = client.create_topics(wanted, operation_timeout=timeout_s, request_timeout=timeout_s)
    for name, future in futures.items():
        try:
            future.result()
            created[name] = True
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race with another init
                raise SetupError(f"cannot create Kafka topic {name!r}: {_reason(exc)}") from None
    _wait_visible(client, [n for n, c in created.items() if c], timeout_s, bootstrap)
    return created


def _wait_visible(client: AdminClient, topics: list[str], timeout_s: float, bootstrap: str) -> None:
    deadline = time.monotonic() + timeout_s
    while topics:
        visible = cluster_metadata(client, timeout_s, bootstrap).topics
        topics = [t for t in topics if t not in visible or not visible[t].partitions]
        if topics and time.monotonic() > deadline:
            raise SetupError(
                f"created Kafka topics {topics} but they did not appear in metadata within {timeout_s:g} s"
            )
        if topics:
            time.sleep(0.05)


def check_control_topic(
    client: AdminClient | Consumer, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S, bootstrap: str = ""
) -> None:
    """Raise ``SetupError`` unless ``topic`` exists with exactly one partition.

    chtxn's control messages are totally ordered only within one partition.
    """
    found = cluster_metadata(client, timeout_s, bootstrap).topics.get(topic)
    if found is None or found.error is not None:
        raise SetupError(f"control topic {topic} does not exist: run chtxn init --config <pipeline.toml>")
    count = len(found.partitions)
    if count != 1:
        raise SetupError(
            f"control topic {topic} has {count} partitions; chtxn needs exactly 1: delete and recreate it "
            "with one partition, or point pipeline.control_topic at a new topic"
        )


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(exc)
