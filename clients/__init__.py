"""Client factories for Kafka (confluent-kafka) and ClickHouse (clickhouse-connect).

Components receive clients made here instead of building their own, so tests and fault
injection can hand in something else, and so every client gets the same settings.
"""
