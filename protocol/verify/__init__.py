"""``chtxn verify --deep``: each offset of a target counted against the committed ranges, as SQL
(``check``), and its report (``report``). Architecture: "Guarantees, and the conditions they need".

Imports: protocol, protocol.dead_letters, protocol.ledger.
"""
