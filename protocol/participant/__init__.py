"""The participant's state machine: ``state.ParticipantState``, one per Spark task, no I/O. Its
events and actions (``events``), the partitions it holds and what is read into them
(``partitions``, ``stint``), and its invariants (``invariants``). Architecture: "Participants".

Imports: protocol.
"""
