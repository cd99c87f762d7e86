"""The shared contract, pure: no Kafka, ClickHouse or Spark client, no I/O (docs/architecture.md).

Its core modules are the vocabulary every process speaks: control messages and their codec
(``messages``, ``codec``), names (``naming``), errors and ClickHouse error codes (``errors``,
``chcodes``), secrets, routes and topic patterns, chunking and the size trigger, chunk insert
settings, and the shape of a verdict (``checks``). Its packages, one concept each:

- ``protocol.config``: ``pipeline.toml``, decoded, checked and overridden by the environment;
- ``protocol.coordinator``: the coordinator's state machine (commit steps, take-over, txn phases);
- ``protocol.participant``: the participant's state machine;
- ``protocol.ledger``: the ledger's rows, its reads as SQL, claims, checkpoints, pauses, resets;
- ``protocol.offsets``: where a partition starts (its log's identity, offsets by time);
- ``protocol.tables``: ClickHouse table shapes, target rules, replicated DDL, schema evolution;
- ``protocol.dead_letters``: dead letters and their replay;
- ``protocol.doctor``, ``protocol.status``, ``protocol.verify``: the verdicts of ``chtxn doctor``,
  ``chtxn status`` and ``chtxn verify --deep``.

Imports: nothing (no client library, no other first-party package: tests/pure/test_layering.py).
Its core modules import none of its packages.
"""
