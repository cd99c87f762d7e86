"""Reading the control topic in offset order, without holes.

Every protocol hop is one control-topic record, and a reader that misses one stalls a txn until a
timeout aborts it (an END never seen: no WRITE-STATUS; a WRITE-STATUS never seen: no commit).
Kafka gives a consumer a partition's records in offset order, and on the control topic (no
compaction, no transactional writers) with no offset left out. The embedded broker (Tansu 0.6,
memory storage) does not always: while two producers append to one partition at once, it can
serve the later record batch before the earlier one is readable, and a consumer at the tail
then moves past the earlier one for good (``tests/integration/test_control_reader.py``).

``ControlReader`` delivers records only in unbroken offset order. At a hole it stops, reads again
from the first offset missing, and waits up to ``HOLE_WAIT_S`` for it to show; a hole that is
still there then is accepted with a warning (no record can fill it: on a real Kafka cluster, a
control topic someone made compacted), and the protocol's timeouts cover what it held.
``Holes`` is the decision alone, pure: the offsets of a batch in, what to deliver and where to
read again out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, TopicPartition as KafkaTP

from clients import failpoints
from protocol import codec
from protocol.messages import ControlMessage

log = logging.getLogger(__name__)

#: How long a reader waits for a missing offset to show before it goes on without it.
HOLE_WAIT_S = 1.0


@dataclass
class Holes:
    """Which records of each batch to deliver so that the offsets delivered have no hole.

    ``expected`` is the next offset to deliver (None: whatever comes first). ``found`` counts the
    holes seen; ``skipped`` lists those given up on, as ``(first missing, first after)``.
    """

    wait_s: float = HOLE_WAIT_S
    expected: int | None = None
    since: float | None = None  # when the hole at ``expected`` was first seen
    found: int = 0
    skipped: list[tuple[int, int]] = field(default_factory=list)

    def take(self, offsets: Sequence[int], now: float) -> tuple[list[int], int | None]:
        """Positions in ``offsets`` to deliver, in order, and the offset to read again from (None:
        read on). Offsets below ``expected`` were delivered before (a batch read again)."""
        deliver: list[int] = []
        for i, offset in enumerate(offsets):
            if self.expected is not None and offset < self.expected:
                continue
            if self.expected is not None and offset > self.expected:
                if self.since is None:
                    self.since, self.found = now, self.found + 1
                if now - self.since < self.wait_s:
                    return deliver, self.expected
                self.skipped.append((self.expected, offset))
            deliver.append(i)
            self.expected, self.since = offset + 1, None
        return deliver, None


class ControlReader:
    """Decoded control messages from partition 0 of ``topic``, in offset order, none left out.

    ``who`` names the reader for the ``control.hide-record`` failpoint (``<who>/<message kind>``),
    which hides one record from it as the embedded broker can. ``on_hole`` is called once per hole
    found (a metric). Example::

        reader = ControlReader(Consumer(conf), cfg.control_topic, who="c1")
        reader.assign(OFFSET_END)
        for message in reader.read(500, timeout=0.05): ...
    """

    def __init__(
        self,
        consumer: Consumer,
        topic: str,
        *,
        who: str = "",
        clock: Callable[[], float] = time.monotonic,
        wait_s: float = HOLE_WAIT_S,
        on_hole: Callable[[], None] | None = None,
    ) -> None:
        self.consumer, self.topic, self.who, self.clock = consumer, topic, who, clock
        self.holes = Holes(wait_s=wait_s)
        self.on_hole = on_hole

    def assign(self, offset: int) -> None:
        """Read from ``offset`` (a logical offset such as ``OFFSET_END``: from the first record seen)."""
        self.holes.expected = offset if offset >= 0 else None
        self.consumer.assign([KafkaTP(self.topic, 0, offset)])

    def read(self, max_messages: int, timeout: float) -> list[ControlMessage]:
        """Messages of the records read within ``timeout`` that follow the last one delivered
        without a hole; records that do not decode (another version, garbage) are passed over."""
        offsets: list[int] = []
        messages: list[ControlMessage | None] = []
        for record in self.consumer.consume(max_messages, timeout):
            error = record.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("control topic read error: %s", error, extra={"topic": self.topic})
                continue
            message = codec.decode(record.value())
            if message is not None and self._hidden(message):
                continue
            offsets.append(record.offset())  # type: ignore[arg-type]  # None only on an error record
            messages.append(message)
        skipped, found = len(self.holes.skipped), self.holes.found
        deliver, again = self.holes.take(offsets, self.clock())
        if self.holes.found > found and self.on_hole is not None:  # take() stops at the first hole
            self.on_hole()
        for first, after in self.holes.skipped[skipped:]:
            log.warning(
                "control topic offsets %d-%d never arrived within %g s: going on without them",
                first,
                after - 1,
                self.holes.wait_s,
                extra={"topic": self.topic},
            )
        if again is not None:
            self.consumer.assign([KafkaTP(self.topic, 0, again)])  # drops what was fetched past it
        return [m for m in (messages[i] for i in deliver) if m is not None]

    def _hidden(self, message: ControlMessage) -> bool:
        try:
            failpoints.hit("control.hide-record", f"{self.who}/{type(message).__struct_config__.tag}")
        except failpoints.FailpointError:
            return True
        return False

    def close(self) -> None:
        self.consumer.close()
