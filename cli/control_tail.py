"""What the tail of a pipeline's control topic says of who is alive: the latest LEADER-HEARTBEAT and
STANDBY-HEARTBEAT of each coordinator replica, and the participant holding each partition
(``chtxn status``, ``chtxn commit-point``).
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaException, TopicPartition as KafkaTP

from clients.log_ends import log_ends
from protocol import codec
from protocol.config.parse import PipelineConfig
from protocol.errors import SetupError
from protocol.messages import Heartbeat, LeaderHeartbeat, StandbyHeartbeat, TopicPartition
from protocol.status.health import Heard

#: How far back the control topic is read for heartbeats.
CONTROL_TAIL = 2_000


def heartbeats(
    cfg: PipelineConfig, consumer, now: float, timeout_s: float
) -> tuple[dict[str, Heard], dict[str, Heard], dict[TopicPartition, str]]:
    """(leaders, standbys, holders) from the last ``CONTROL_TAIL`` records of the control topic up to its
    end as it was when called: each sender of a LEADER-HEARTBEAT, and each of a STANDBY-HEARTBEAT, with
    the epoch and age (seconds) of its latest one (and whether it said ``leaving``), and the holder of
    each partition heard within the heartbeat timeout.

    Stops at the log end read first (``log_ends``), at a record written after ``now``, or at
    partition EOF, whichever comes first: it never waits for records that keep coming.
    """
    control = (cfg.control_topic, 0)
    try:
        low, _ = consumer.get_watermark_offsets(KafkaTP(*control), timeout=timeout_s)
    except KafkaException as exc:  # no such topic, or no broker
        raise SetupError(
            f"cannot read control topic {cfg.control_topic}: {exc}; run chtxn init --config FILE"
        ) from None
    end = log_ends(consumer, [control], timeout_s)[control]
    leaders: dict[str, Heard] = {}
    standbys: dict[str, Heard] = {}
    holders: dict[TopicPartition, str] = {}
    if end <= low:
        return leaders, standbys, holders
    consumer.assign([KafkaTP(cfg.control_topic, 0, max(low, end - CONTROL_TAIL))])
    now_ms = now * 1000
    done = False
    deadline = time.monotonic() + timeout_s
    try:
        while not done and time.monotonic() < deadline:
            records = consumer.consume(500, 0.05)
            for record in records:
                if record.error() is not None:
                    done = True  # partition EOF
                    continue
                stamp = record.timestamp()[1]
                if record.offset() >= end - 1 or stamp >= now_ms:
                    done = True  # the end as it was when called
                message = codec.decode(record.value())
                if message is None or message.pipeline != cfg.name:
                    continue
                age_s = max(0.0, (now_ms - stamp) / 1000)
                if isinstance(message, LeaderHeartbeat):
                    leaving = bool(getattr(message, "leaving", False))  # leaders older than the field never leave
                    leaders[message.sender] = Heard(epoch=message.epoch, age_s=age_s, leaving=leaving)
                elif isinstance(message, StandbyHeartbeat):
                    standbys[message.sender] = Heard(
                        epoch=message.epoch,
                        age_s=age_s,
                        leaving=message.leaving,
                        problem=message.problem,
                        cause=message.cause,
                    )
                elif isinstance(message, Heartbeat) and age_s <= cfg.heartbeat_timeout_s:
                    for pos in message.partitions:
                        holders[pos.tp] = message.sender
            if not records and not done:
                done = consumer.position([KafkaTP(*control)])[0].offset >= end  # past markers that hold no record
    finally:
        consumer.unassign()
    return leaders, standbys, holders
