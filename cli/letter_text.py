"""How ``chtxn dlq`` commands write a dead letter's position and times (``cli.dlq``, ``cli.dlq_replay``)."""

from __future__ import annotations

from datetime import datetime, timezone

from protocol.dead_letters.letters import PublishedLetter


def position(x: PublishedLetter) -> str:
    """Where a letter is in the dead-letter topic: ``partition:offset``."""
    return f"{x.dlq_partition}:{x.dlq_offset}"


def utc_time(ms: int) -> str:
    """A record timestamp (ms) as ``YYYY-MM-DD HH:MM:SS.mmm UTC``; ``-`` for none."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
