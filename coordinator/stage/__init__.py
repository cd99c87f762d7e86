"""Stage tables: created and dropped (``tables``, ``sets``: one per target), checked at commit step 5
(``tables``), and published at commit step 7 (``publish``). Architecture: "One transaction".

Imports: clients, protocol.*.
"""
