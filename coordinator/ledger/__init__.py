"""The ledger table through ClickHouse: claims, writes and reads (``store``, ``access``, ``rows``,
``history``), the commit point a claim wins a slot by (``commit_point``) and switching it
(``commit_points``), checkpoints and expiry (``upkeep``), upgrades of older ledgers
(``upgrade``), and pauses (``pauses``). Architecture: "The commit point and the ledger".

Imports: clients, protocol.*.
"""
