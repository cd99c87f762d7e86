"""The coordinator's state machine: ``state.CoordinatorState.handle(event, now) -> [actions]``, no I/O.
Events and actions (``events``), the txns in flight and every commit step's driver (``flight``,
``txns``, ``spare``, ``outbox``, ``verdict``), who is alive (``liveness``), the lease
(``leadership``), chunk sizes (``chunk_sizing``), and the invariants the pure tests check after
every event (``invariants``). Architecture: "One transaction", "Leadership and take-over", "The
coordinator's txn phases".

Imports: protocol.
"""
