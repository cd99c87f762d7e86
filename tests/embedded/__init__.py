"""Tests of the embedded stand-ins, not of chtxn's own code: the Tansu broker, the chDB-backed
ClickHouse HTTP endpoint, and ``chtxn embedded up | status | down``."""
