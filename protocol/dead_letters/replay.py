"""Dead-letter replay, pure: which letters a replay takes, what each becomes, and the record that says
it was replayed (``coordinator.dead_letters.replay`` does the I/O; ``chtxn dlq replay`` is the command).

A replayed letter is its record again (key, value, the record's own headers) with three headers:

- ``chtxn.replay.of``: where the letter is, ``<dead-letter topic>/<partition>/<offset>``;
- ``chtxn.replay.source``: the record it was, ``<topic>/<partition>/<offset>``;
- ``chtxn.replay.by``: who replayed it (``user@host`` unless told otherwise).

Each letter goes out once. In the same Kafka transaction as the records, the replay writes one
record per letter to the replay log, a compacted topic beside the dead-letter topic
(``<dead-letter topic>.replays``), keyed by the letter's ``chtxn.replay.of``: the records and the
log are visible together or not at all, and a replay takes no letter the log already holds, nor a
second letter of a source record already replayed.

**A batch in doubt.** Before a batch's transaction, the replay commits an intent to the log (key
``INTENT_KEY``): the batch's letters and each destination partition's log end. A run that then
finds letters of the latest intent missing from the log (the batch was killed or failed before its
commit) reads those partitions from the recorded ends, and takes every record of such a letter it
can see there as replayed, writing its log record (``settled``) instead of producing it again.
Kafka hides an aborted batch from ``read_committed`` readers, so there nothing is found and the
letters go out again; the embedded broker shows aborted records, and there they are found. Either
way each letter is visible in its destination once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from protocol.dead_letters.letters import PublishedLetter

REPLAY_OF, REPLAY_SOURCE, REPLAY_BY = "chtxn.replay.of", "chtxn.replay.source", "chtxn.replay.by"
REPLAY_HEADERS = (REPLAY_OF, REPLAY_SOURCE, REPLAY_BY)

#: What a planned letter becomes.
REPLAY, REPLAYED, DONE_BEFORE, SAME_RECORD = "replay", "replayed", "already replayed", "same record"


def replay_log_topic(dead_letter_topic: str) -> str:
    """The replay log of ``dead_letter_topic``: a compacted topic of one partition."""
    return f"{dead_letter_topic}.replays"


def replay_transactional_id(pipeline: str) -> str:
    """The replays of one pipeline share it: a replay started fences one still running."""
    return f"{pipeline}.chtxn-dlq-replay"


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """Which letters: every condition given must hold (``everything``: no condition, all letters)."""

    txns: tuple[str, ...] = ()
    topic: str = ""
    partition: int | None = None
    first: int | None = None  # source offsets first..last, both included (None: open)
    last: int | None = None
    everything: bool = False

    def matches(self, letter: PublishedLetter) -> bool:
        return (
            (not self.txns or letter.txn in self.txns)
            and (not self.topic or letter.topic == self.topic)
            and (self.partition is None or letter.partition == self.partition)
            and (self.first is None or letter.offset >= self.first)
            and (self.last is None or letter.offset <= self.last)
        )

    def describe(self) -> str:
        parts = [f"txn {' or '.join(self.txns)}"] if self.txns else []
        if self.topic:
            parts.append(f"topic {self.topic}")
        if self.partition is not None:
            parts.append(f"partition {self.partition}")
        if self.first is not None or self.last is not None:
            parts.append(f"offsets {'' if self.first is None else self.first}-{'' if self.last is None else self.last}")
        return ", ".join(parts) or "all letters"


def parse_offsets(text: str) -> tuple[int | None, int | None]:
    """``N`` (one offset), ``N-M`` (both included), ``N-`` or ``-M``; ``ValueError`` otherwise."""
    first, dash, last = text.partition("-")
    try:
        low = int(first) if first else None
        high = int(last) if last else None if dash else low
    except ValueError:
        raise ValueError(f"--offsets {text!r}: give N, N-M, N- or -M (source offsets, both ends included)") from None
    if (low is None and high is None) or (low is not None and high is not None and low > high):
        raise ValueError(f"--offsets {text!r}: give N, N-M, N- or -M with N <= M")
    return low, high


class ReplayRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A replay log record (JSON), keyed by ``of``: letter ``of`` (record ``source``) went to ``to`` (a
    topic/partition/offset) by ``by`` at ``at_ms`` (unix ms)."""

    of: str
    source: str
    to: str
    by: str
    at_ms: int


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ReplayRecord)


def encode_record(record: ReplayRecord) -> bytes:
    return _encoder.encode(record)


def decode_record(data: bytes | None) -> ReplayRecord | None:
    """The replay record in ``data``; None for a tombstone or what is not one (skipped)."""
    if data is None:
        return None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        return None


#: The replay log key of the latest batch's intent (no letter key has this form).
INTENT_KEY = "chtxn.replay.intent"


class ReplayIntent(msgspec.Struct, frozen=True, kw_only=True):
    """A replay log record (JSON, key ``INTENT_KEY``), committed before a batch's records: the
    batch's letters (``keys``) and, per destination partition (``"<topic>/<partition>"``), its log
    end before the batch: any record of the batch lies at or after it."""

    keys: tuple[str, ...]
    ends: dict[str, int]
    by: str
    at_ms: int


_intent_decoder = msgspec.json.Decoder(ReplayIntent)


def encode_intent(intent: ReplayIntent) -> bytes:
    return _encoder.encode(intent)


def decode_intent(data: bytes | None) -> ReplayIntent | None:
    """The intent in ``data``; None for a tombstone or what is not one."""
    if data is None:
        return None
    try:
        return _intent_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def in_doubt(intent: ReplayIntent | None, done: Mapping[str, ReplayRecord]) -> set[str]:
    """The letters of ``intent``'s batch the log does not hold: they may or may not be visible."""
    return set() if intent is None else {k for k in intent.keys if k not in done}


def settled(
    headers: Sequence[tuple[str, bytes]] | None, doubt: set[str], *, topic: str, partition: int, offset: int, at_ms: int
) -> ReplayRecord | None:
    """The log record of a record found at ``topic/partition/offset`` if it is the replay of a letter
    in ``doubt`` (by its ``chtxn.replay.*`` headers); None otherwise."""
    marks = {name: raw.decode(errors="replace") for name, raw in headers or () if name in REPLAY_HEADERS}
    key = marks.get(REPLAY_OF, "")
    if key not in doubt:
        return None
    return ReplayRecord(
        of=key,
        source=marks.get(REPLAY_SOURCE, ""),
        to=f"{topic}/{partition}/{offset}",
        by=marks.get(REPLAY_BY, ""),
        at_ms=at_ms,
    )


def letter_key(dead_letter_topic: str, letter: PublishedLetter) -> str:
    """``<dead-letter topic>/<partition>/<offset>``: the letter's place, its replay log key."""
    return f"{dead_letter_topic}/{letter.dlq_partition}/{letter.dlq_offset}"


def source_key(letter: PublishedLetter) -> str:
    return f"{letter.topic}/{letter.partition}/{letter.offset}"


def replay_headers(letter: PublishedLetter, dead_letter_topic: str, by: str) -> list[tuple[str, bytes]]:
    """The record's own headers (those of an earlier replay dropped), then the replay's."""
    own = [(name, raw) for name, raw in letter.headers if name not in REPLAY_HEADERS]
    marks = (letter_key(dead_letter_topic, letter), source_key(letter), by)
    return [*own, *((name, value.encode()) for name, value in zip(REPLAY_HEADERS, marks))]


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """One selected letter and what the replay does with it: ``REPLAY`` it to ``to_topic``
    (``to_partition``: -1 for the partitioner's choice), or skip it because it was replayed before
    (``DONE_BEFORE``) or is a second letter of a record this replay
    already takes (``SAME_RECORD``)."""

    letter: PublishedLetter
    key: str
    to_topic: str
    to_partition: int
    action: str
    record: ReplayRecord | None = None  # the log's: the earlier replay (DONE_BEFORE), or this one (REPLAYED)


def plan(
    letters: Iterable[PublishedLetter],
    selection: Selection,
    done: Mapping[str, ReplayRecord],
    *,
    dead_letter_topic: str,
    to_topic: str = "",
) -> list[Planned]:
    """What a replay does with each letter ``selection`` takes, in the order given (publish order).
    ``done`` is the replay log (key -> record). Without ``to_topic`` a letter goes back to its own
    source partition; with it, to the partition the producer picks by key."""
    replayed_sources = {r.source: r for r in done.values()}
    taken: set[str] = set()
    planned = []
    for letter in letters:
        if not selection.matches(letter):
            continue
        key, source = letter_key(dead_letter_topic, letter), source_key(letter)
        earlier = done.get(key) or replayed_sources.get(source)
        if earlier is not None:
            action = DONE_BEFORE
        elif source in taken:
            action = SAME_RECORD
        else:
            action = REPLAY
            taken.add(source)
        planned.append(
            Planned(
                letter=letter,
                key=key,
                to_topic=to_topic or letter.topic,
                to_partition=-1 if to_topic else letter.partition,
                action=action,
                record=earlier,
            )
        )
    return planned


def to_replay(planned: Sequence[Planned]) -> list[Planned]:
    return [p for p in planned if p.action == REPLAY]
