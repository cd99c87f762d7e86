"""Dead letters: their table and their form on the dead-letter topic (``letters``), and replay's
rules (``replay``). Architecture: "Dead letters".

Imports: protocol, protocol.ledger, protocol.tables.
"""
