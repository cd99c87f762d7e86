"""The verdicts of ``chtxn status``: from what the control topic and the ledger say, the coordinator
replicas with their roles, the commit rate, and one check per question (``protocol.checks.Check``,
as ``chtxn doctor`` gives them). Pure: the caller reads the control topic and the ledger.

A leader sends LEADER-HEARTBEAT and a standby STANDBY-HEARTBEAT, each every third of
``coordinator.leader_lease_s`` and a last one saying ``leaving`` when it is stopped cleanly. The
replicas known here are those heard within the control topic's tail (``protocol.status.standbys``
merges the standbys in) or owning the highest epoch in the ledger; a replica not heard within the
lease is ``silent`` (killed, or cut off from the broker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from protocol.checks import Check
from protocol.messages import TopicPartition

LEADER, STALE_LEADER, LEFT, SILENT = "leader", "stale leader", "left", "silent"


class Heard(msgspec.Struct, frozen=True, kw_only=True):
    """The latest LEADER-HEARTBEAT of one sender: its epoch, its age in seconds, whether it said ``leaving``."""

    epoch: int
    age_s: float
    leaving: bool = False
    problem: str = ""  # a STANDBY-HEARTBEAT's: why the replica cannot lead now
    cause: str = ""  # what the problem is with (``protocol.messages.PROBLEM_CAUSES``)


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    """A coordinator replica: ``role`` is ``leader`` (heartbeating, highest epoch heard), ``stale
    leader`` (still heartbeating an older epoch: it steps down at its next commit), ``left`` (its last
    heartbeat handed the lease over: stopped cleanly) or ``silent`` (led before, or owns the highest
    epoch, but not heard within the lease)."""

    id: str
    role: str
    epoch: int  # the latest epoch it led (heartbeat or ledger claim)
    heard_s: float | None  # seconds since its latest heartbeat; None: none in the control topic's tail
    problem: str = ""  # its latest STANDBY-HEARTBEAT's problem: why it cannot lead now
    cause: str = ""  # what that problem is with (``protocol.messages.PROBLEM_CAUSES``)


def replicas(
    heard: Mapping[str, Heard], *, lease_s: float, highest_epoch: int, highest_owner: str
) -> tuple[Replica, ...]:
    """The replicas from ``heard`` (the latest LEADER-HEARTBEAT of each sender) and the owner of the
    highest epoch in the ledger; the leader first, then by role and epoch, newest first."""
    live = {who: h.epoch for who, h in heard.items() if h.age_s <= lease_s and not h.leaving}
    top = max(live.values(), default=0)
    found: list[Replica] = []
    for who, h in heard.items():
        if h.leaving:
            role = LEFT
        else:
            role = SILENT if who not in live else LEADER if h.epoch == top else STALE_LEADER
        found.append(Replica(id=who, role=role, epoch=h.epoch, heard_s=round(h.age_s, 1)))
    if highest_owner and highest_owner not in heard:
        found.append(Replica(id=highest_owner, role=SILENT, epoch=highest_epoch, heard_s=None))
    order = {LEADER: 0, STALE_LEADER: 1, LEFT: 2, SILENT: 3}
    return tuple(sorted(found, key=lambda r: (order[r.role], -r.epoch, r.id)))


#: What to do about a replica's problem, by its cause: the fix ``chtxn status`` gives for no leader.
CAUSE_FIXES = {
    "keeper": "start Keeper (or ZooKeeper), or fix <zookeeper> in the ClickHouse server's config: no commit slot "
    "can be claimed while it is down; chtxn doctor probes it",
    "clickhouse": "start the ClickHouse server or fix clickhouse.url; chtxn doctor checks it",
    "kafka": "start the Kafka broker or fix kafka.bootstrap_servers; chtxn doctor checks it",
    "other": "read the coordinator's error above and its log",
}
_CAUSE_NAMES = {"keeper": "Keeper", "clickhouse": "ClickHouse", "kafka": "the Kafka broker", "other": "an error"}


def problem_check(name: str, replicas: Sequence[Replica], *, lease_s: float, retry_s: float = 0.0) -> Check | None:
    """fail naming the cause, when replicas report a problem; None when none does. The most common
    cause among them decides the fix. A report counts for ``retry_s`` past the lease and one more
    lease: a troubled replica says nothing while it retries a ClickHouse operation (up to ``retry_s``
    of waits, ``clients.clickhouse.retry_budget_s``), then reports again."""
    within_s = 2 * lease_s + retry_s
    troubled = [r for r in replicas if r.problem and r.heard_s is not None and r.heard_s <= within_s]
    if not troubled:
        return None
    causes = [r.cause or "other" for r in troubled]
    cause = max(set(causes), key=lambda c: (causes.count(c), c != "other"))
    said = "; ".join(f"{r.id}: {r.problem}" for r in troubled)
    return Check(
        name=name,
        status="fail",
        found=f"the coordinators cannot lead, the cause is {_CAUSE_NAMES.get(cause, cause)} ({said})",
        fix=CAUSE_FIXES.get(cause, CAUSE_FIXES["other"]),
    )


def leader_check(
    found: Sequence[Replica],
    *,
    lease_s: float,
    highest_epoch: int,
    every: Sequence[Replica] = (),
    retry_s: float = 0.0,
) -> Check:
    """ok: one leader heard within the lease; warn: an older leader heartbeats too; fail: no leader,
    naming the cause the standbys in ``every`` report (``problem_check``) when they report one."""
    leaders = [r for r in found if r.role == LEADER]
    stale = [r for r in found if r.role == STALE_LEADER]
    if not leaders and (named := problem_check("leader", every, lease_s=lease_s, retry_s=retry_s)) is not None:
        return named
    if not leaders:
        last = next((r for r in found if r.heard_s is not None), None)
        seen = f"; {last.id} led epoch {last.epoch} until {last.heard_s:g} s ago" if last else ""
        if last and last.role == LEFT:
            seen += " (stopped, it handed the lease over)"
        return Check(
            name="leader",
            status="fail",
            found=f"no LEADER-HEARTBEAT within coordinator.leader_lease_s ({lease_s:g} s){seen}",
            fix="start a coordinator (chtxn coordinator --config FILE), or read the coordinators' logs",
        )
    leader = leaders[0]
    found_text = f"{leader.id} leads epoch {leader.epoch}, heard {leader.heard_s:g} s ago"
    if leader.epoch < highest_epoch:
        found_text += f" (epoch {highest_epoch} is claimed in the ledger: a take-over is under way)"
    if stale:
        olds = ", ".join(f"{r.id} (epoch {r.epoch})" for r in stale)
        return Check(
            name="leader",
            status="warn",
            found=f"{found_text}; still heartbeating as leaders of older epochs: {olds}",
            fix="none needed if it passes: an older leader steps down at its next commit; if it lasts, "
            "that replica cannot read the control topic",
        )
    return Check(name="leader", status="ok", found=found_text)


def participants_check(
    holders: Mapping[TopicPartition, str], partitions: Sequence[TopicPartition], *, timeout_s: float
) -> Check:
    """ok: every source partition held by a participant heard within the heartbeat timeout."""
    orphans = [tp for tp in partitions if not holders.get(tp)]
    if orphans:
        named = ", ".join(f"{tp.topic}/{tp.partition}" for tp in orphans)
        return Check(
            name="participants",
            status="fail",
            found=f"no participant heartbeat within {timeout_s:g} s (transaction.heartbeat_interval_s x "
            f"heartbeat_misses) for {len(orphans)} of {len(partitions)} partitions: {named}",
            fix="start the participant job (chtxn participant --config FILE), or read its log",
        )
    who = len({holders[tp] for tp in partitions})
    found = f"{_count(len(partitions), 'partition')} held by {_count(who, 'participant')}"
    return Check(name="participants", status="ok", found=found)


def routes_check(held: Mapping[str, Sequence[str]]) -> Check:
    """ok: every source topic goes to one table; fail: topics the routes of several tables match (``held``:
    topic -> those tables), which the leader holds: none of their records are read, the others flow."""
    if held:
        named = "; ".join(
            f"{topic} matches the routes of {', '.join(tables)}" for topic, tables in sorted(held.items())
        )
        return Check(
            name="routes",
            status="fail",
            found=f"{_count(len(held), 'topic')} held, not read: {named}",
            fix="narrow the [[route]] patterns so that each topic goes to one table, then restart the coordinators "
            "and the participant job; it then starts as a newly found topic does",
        )
    return Check(name="routes", status="ok", found="every source topic goes to one table")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def stall_limit_s(interval_s: float, write_status_timeout_s: float, idle_interval_s: float = 0.0) -> float:
    """A pipeline that runs commits every ``interval_s`` while it reads, and at least every
    ``idle_interval_s`` when idle (an empty txn commits too); one whose txns abort or hang commits
    nothing. This long without a commit is a stall: two whole txns, each as long as an idle one, that
    each ran to their WRITE-STATUS timeout."""
    return 2 * (max(interval_s, idle_interval_s) + write_status_timeout_s)


def commits_check(age_s: float | None, head_seq: int, *, limit_s: float) -> Check:
    """ok: a commit within ``limit_s`` (``stall_limit_s``); fail: none, or none that recent."""
    if age_s is None:
        return Check(
            name="commits",
            status="fail",
            found="no commit yet" if not head_seq else f"the row of commit slot {head_seq} was not found",
            fix="a leader commits its first txn seconds after it starts: check the leader and participants",
        )
    if age_s > limit_s:
        return Check(
            name="commits",
            status="fail",
            found=f"last commit {age_s:.0f} s ago (slot {head_seq}); limit {limit_s:g} s, "
            "2 x (transaction.idle_interval_s, or interval_s if longer, + transaction.write_status_timeout_s)",
            fix="see why txns end without committing: chtxn txn list --state ABORTED",
        )
    return Check(name="commits", status="ok", found=f"last commit {age_s:.1f} s ago (slot {head_seq})")


def rows_per_s(commits: Sequence[tuple[float, int]]) -> tuple[float | None, float]:
    """(rows per second, seconds covered) over ``commits``, each (commit time, rows): the rows
    committed after the oldest, over the time from the oldest to the newest. None with fewer than two
    commits or no time between them."""
    ordered = sorted(commits)
    if len(ordered) < 2:
        return None, 0.0
    span = ordered[-1][0] - ordered[0][0]
    if span <= 0:
        return None, 0.0
    return sum(rows for _, rows in ordered[1:]) / span, span
