"""The coordinator service: the I/O shell around ``protocol.coordinator``'s state machine.

Its core modules: the service and its replicas (``service``), the leader's loop and lanes
(``leader``, ``lanes``, ``txn_actions``, ``txn_publisher``), the lease and take-over (``lease``,
``takeover``), the control channel, metrics and readiness, logs, ``chtxn doctor`` and ``chtxn verify``.
Its packages, one concept each:

- ``coordinator.ledger``: the ledger store, its commit points, checkpoints, upgrades, pauses;
- ``coordinator.stage``: stage tables, their checks and their publish (commit steps 4, 5, 7);
- ``coordinator.offsets``: where each source partition starts, its log's identity, resets;
- ``coordinator.dead_letters``: publishing and replaying dead letters.

Imports: clients, protocol.*, coordinator.* (its own packages; tests/pure/test_layering.py).
"""
