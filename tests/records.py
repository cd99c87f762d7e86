"""``Rec``: a Kafka record as test code builds it, with the accessors of a confluent-kafka Message."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rec:
    """The accessors of a confluent-kafka Message."""

    t: str
    p: int
    o: int
    v: bytes | None
    k: bytes | None = None

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v
