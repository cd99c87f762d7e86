"""The standbys among ``chtxn status``'s coordinator replicas. Pure: the caller reads the control topic.

``pipeline_health.replicas`` knows the replicas that led (from their LEADER-HEARTBEATs, and the owner
of the highest epoch in the ledger). A replica that does not lead sends a STANDBY-HEARTBEAT every
third of ``coordinator.leader_lease_s``, and a last one saying ``leaving`` when it is stopped;
``with_standbys`` adds what those say. A replica's latest heartbeat, of either kind, decides its role:

- its latest is a STANDBY-HEARTBEAT heard within the lease: ``standby``;
- its latest is a STANDBY-HEARTBEAT saying ``leaving``: ``left`` (stopped cleanly);
- its latest is a STANDBY-HEARTBEAT older than the lease: ``silent`` (stopped, or cut off);
- its latest is a LEADER-HEARTBEAT: the role ``pipeline_health.replicas`` gave it.

A standby's ``epoch`` is the latest epoch it led, as for every replica (0: none known).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from protocol.status.health import LEADER, LEFT, SILENT, STALE_LEADER, Heard, Replica

STANDBY = "standby"
#: The order replicas are listed in: the leader first.
ROLE_ORDER = {LEADER: 0, STALE_LEADER: 1, STANDBY: 2, LEFT: 3, SILENT: 4}


def with_standbys(found: Sequence[Replica], standbys: Mapping[str, Heard], *, lease_s: float) -> tuple[Replica, ...]:
    """``found`` (``pipeline_health.replicas``) with what ``standbys`` (the latest STANDBY-HEARTBEAT of
    each sender) say; the leader first, then by role and epoch, newest first."""
    by_id = {r.id: r for r in found}
    for who, heard in standbys.items():
        age = round(heard.age_s, 1)
        known = by_id.get(who)
        if known is not None and known.heard_s is not None and known.heard_s <= age:
            continue  # its leader heartbeat is the latest: it led after it stood by
        role = LEFT if heard.leaving else STANDBY if heard.age_s <= lease_s else SILENT
        by_id[who] = Replica(
            id=who,
            role=role,
            epoch=known.epoch if known else 0,
            heard_s=age,
            problem=heard.problem,
            cause=heard.cause,
        )
    return tuple(sorted(by_id.values(), key=lambda r: (ROLE_ORDER[r.role], -r.epoch, r.id)))
