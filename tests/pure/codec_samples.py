"""One fixed sample of every control-message kind, shared by the golden-bytes tests.

``golden/<kind>.v1.hex`` holds the bytes chtxn wrote for these samples when the fixture was
made. Never edit or delete a fixture: when a field is appended, add a new fixture beside it.
"""

from __future__ import annotations

from protocol.messages import (
    Abort,
    AckCommit,
    ControlMessage,
    EndCommit,
    Heartbeat,
    LeaderHeartbeat,
    Leave,
    ParticipantFigures,
    PartitionHolder,
    PartitionOffset,
    PartitionPosition,
    Pause,
    Reset,
    StandbyHeartbeat,
    StartCommit,
    TopicStage,
    WriteStatus,
)

_BASE = {"pipeline": "orders", "epoch": 3}

SAMPLES: dict[str, ControlMessage] = {
    "start-commit": StartCommit(
        **_BASE,
        txn="e3_t17",
        sender="coord-a",
        stage_table="events__chtxn_e3_t17",
        stage_tables=(
            TopicStage(topic="src", stage_table="events__chtxn_e3_t17"),
            TopicStage(topic="clicks", stage_table="clicks__chtxn_e3_t17"),
        ),
        offsets=(
            PartitionOffset(topic="src", partition=0, offset=100),
            PartitionOffset(topic="src", partition=1, offset=7),
        ),
        holders=(
            PartitionHolder(topic="src", partition=0, sender="part-a"),
            PartitionHolder(topic="src", partition=1, sender="part-b"),
        ),
        chunk_rows=5000,
        shards=(2,),  # src/0 is placed on shard 2 of 3, src/1 on shard 0: held
        shard_count=3,
    ),
    "end-commit": EndCommit(
        **_BASE,
        txn="e3_t17",
        sender="coord-a",
        next=StartCommit(
            **_BASE,
            txn="e3_t18",
            sender="coord-a",
            stage_table="events__chtxn_e3_t18",
            offsets=(
                PartitionOffset(topic="src", partition=0, offset=-1),
                PartitionOffset(topic="src", partition=2, offset=0),
            ),
            holders=(
                PartitionHolder(topic="src", partition=0, sender="part-a"),
                PartitionHolder(topic="src", partition=2, sender="part-c"),
            ),
            chunk_rows=5000,
        ),
    ),
    "write-status": WriteStatus(
        **_BASE,
        txn="e3_t17",
        sender="part-src-0",
        topic="src",
        partition=0,
        start_offset=100,
        end_offset=250,
        rows=148,
        chunks=2,
        dead_letters=2,
        bytes=9000,
        errors=("row 3: CANNOT_PARSE_TEXT",),
    ),
    "ack-commit": AckCommit(
        **_BASE,
        txn="e3_t17",
        sender="coord-a",
        commit_seq=41,
        offsets=(PartitionOffset(topic="src", partition=0, offset=250),),
    ),
    "abort": Abort(**_BASE, txn="e3_t17", sender="coord-a", reason="write-status timeout"),
    "heartbeat": Heartbeat(
        **_BASE,
        txn="e3_t17",
        sender="part-src-0",
        partitions=(PartitionPosition(topic="src", partition=0, position=180, log_end=300, buffered_rows=80),),
        continues=True,
        leaving=True,
        figures=ParticipantFigures(rows_read=1200, chunks_staged=3, inserts=4, insert_seconds=0.75, retries=1),
    ),
    "leader-heartbeat": LeaderHeartbeat(**_BASE, txn="", sender="coord-a", leaving=True),
    "leave": Leave(pipeline="orders", epoch=0, txn="", sender="driver-host-4242", job="driver-host-4242-1732600000"),
    "standby-heartbeat": StandbyHeartbeat(
        **_BASE, txn="", sender="coord-b", leaving=True, problem="Code: 999. Keeper unreachable", cause="keeper"
    ),
    "pause": Pause(pipeline="orders", epoch=0, txn="", sender="chtxn-cli", paused=True, who="alice@ops", reason="disk"),
    "reset": Reset(
        pipeline="orders", epoch=0, txn="reset_s42", sender="bob@ops", commit_seq=42, who="bob@ops", reason="replay"
    ),
}
