"""Where a source partition starts: whether its log is still the log the ledger's offsets were taken
from (``partition_logs``), and the first offset at or after a time (``search``, for ``chtxn
reset``). Architecture: "Where a partition starts: initial offsets and gaps".

Imports: protocol, protocol.ledger.
"""
