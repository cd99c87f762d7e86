"""The ledger, chtxn's commit log, as data and SQL text: its rows and table (``rows``), its reads
(``sql``) and what readers make of them (``view``), the Keeper commit point's claims (``claims``),
which commit point a ledger uses (``commit_points``), checkpoints and retention (``checkpoint``),
pauses and resets as commits (``pauses``, ``resets``), and which table each range went to
(``range_tables``). Architecture: "The commit point and the ledger".

Imports: protocol, protocol.tables.
"""
