"""The verdicts of ``chtxn status``: the pipeline's health from the control topic and the ledger
(``health``), the standby replicas among the coordinators (``standbys``) and the shards of a sharded
ClickHouse (``shards``, also for ``chtxn txn show``).

Imports: protocol.
"""
