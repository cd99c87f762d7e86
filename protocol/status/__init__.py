"""The verdicts of ``chtxn status``: the pipeline's health from the control topic and the ledger
(``health``) and the standby replicas among the coordinators (``standbys``).

Imports: protocol.
"""
