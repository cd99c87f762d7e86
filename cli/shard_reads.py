"""What ``chtxn status`` and ``chtxn txn show`` read of each shard of a sharded ClickHouse
(``clickhouse.shards``): one query of its ``system.tables`` (``protocol.status.shards.TABLES_SQL``),
all shards at once, each bounded by a timeout so that a shard that is down or frozen costs that
long, once. The figures are ``protocol.status.shards``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import msgspec

from clients.clickhouse import as_clickhouse_error, is_clickhouse_failure, make_client
from protocol.config.parse import PipelineConfig
from protocol.config.sections import ClickHouseSection
from protocol.status.shards import TABLES_SQL, Answer, ShardStage, ShardStatus, marker, shard_status, txn_stage

#: Seconds a shard may take to answer ``chtxn txn show``.
TIMEOUT_S = 10.0


def status_of_shards(cfg: PipelineConfig, timeout_s: float) -> tuple[ShardStatus, ...]:
    """Every shard's ``ShardStatus`` (the pipeline's target tables and stage tables), in shard order."""
    answers = _read(cfg, cfg.tables, timeout_s)
    return tuple(
        shard_status(i, url, answer, tables=cfg.tables, pipeline=cfg.name)
        for i, (url, answer) in enumerate(zip(cfg.clickhouse.shards, answers))
    )


def stages_on_shards(
    cfg: PipelineConfig, stages: Sequence[str], timeout_s: float = TIMEOUT_S
) -> tuple[ShardStage, ...]:
    """Which of a txn's stage tables ``stages`` each shard holds now, and their rows, in shard order."""
    answers = _read(cfg, stages, timeout_s)
    return tuple(
        txn_stage(i, url, answer, stages=stages) for i, (url, answer) in enumerate(zip(cfg.clickhouse.shards, answers))
    )


def _read(cfg: PipelineConfig, names: Sequence[str], timeout_s: float) -> list[Answer]:
    sections = [
        msgspec.structs.replace(
            s,
            connect_timeout_s=min(s.connect_timeout_s, timeout_s),
            send_receive_timeout_s=min(s.send_receive_timeout_s, timeout_s),
        )
        for s in cfg.shard_sections
    ]
    parameters = {"db": cfg.clickhouse.database, "names": list(names), "marker": marker(cfg.name)}
    with ThreadPoolExecutor(max_workers=len(sections), thread_name_prefix="shard-read") as pool:
        return list(pool.map(lambda section: _ask(section, parameters), sections))


def _ask(section: ClickHouseSection, parameters: dict) -> Answer:
    try:
        client = make_client(section)
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        return str(exc)
    try:
        return [(str(name), int(rows)) for name, rows in client.query(TABLES_SQL, parameters=parameters).result_rows]
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        return str(as_clickhouse_error(exc, "read system.tables"))
    finally:
        client.close()
