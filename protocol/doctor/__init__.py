"""The verdicts of ``chtxn doctor``: what was found on the server and the broker (``facts``), and the
judgement of it (``rules``, ``tables``; ``shards`` over a sharded ClickHouse).

Imports: protocol, protocol.config, protocol.ledger, protocol.tables.
"""
