"""Dead letters on the coordinator's side: publishing each committed txn's letters once
(``publisher``), reading them (``view``) and ``chtxn dlq replay`` (``replay``, ``replay_doubt``).
Architecture: "Dead letters".

Imports: clients, protocol.*, coordinator.ledger.
"""
