"""Where each source partition starts: the initial offsets and gaps (``source``, ``first_start``),
whether a partition's log is still the one the ledger's offsets came from (``partition_logs``),
and ``chtxn reset`` (``reset``). Architecture: "Where a partition starts: initial offsets and gaps".

Imports: clients, protocol.*, coordinator.ledger.
"""
