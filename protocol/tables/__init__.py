"""ClickHouse tables as chtxn judges them: a table's shape (``shape``), the one judgement of a target
(``target_rules``), the DDL of tables kept by Keeper (``replicated_ddl``) and schema evolution's
rules (``schema_types``).

Imports: protocol, protocol.config, protocol.coordinator.
"""
