"""One shard's stage tables (``coordinator.stage.sets.StageSet`` on that shard's server) that count the rows
published on it (``chtxn_shard_rows_published_total{shard}``, whatever the placement) and each failed
attempt to publish on it (``chtxn_shard_publish_failures_total{shard}``), so that a shard that keeps a
sharded txn's publish waiting is seen by name. The publishing itself is
``StageSet``'s, unchanged; ``coordinator.stage.shards.ShardedStages`` runs it shard by shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coordinator.metrics import CoordinatorMetrics
from coordinator.stage.publish import StageTableMissing
from coordinator.stage.sets import StageSet
from coordinator.stage.tables import StageTables


class MeteredShard(StageSet):
    """The stage tables of ``tables`` on shard ``shard`` (``protocol.shards.where``), whose failed publishes
    ``metrics`` counts. No I/O in the constructor."""

    def __init__(
        self, tables: Mapping[str, StageTables], *, coordinator: str, shard: str, metrics: CoordinatorMetrics
    ) -> None:
        super().__init__(tables, coordinator=coordinator)
        self.shard, self.metrics = shard, metrics

    def publish(self, stages: str, txn: str, on_move: Any = None) -> int:
        try:
            rows = super().publish(stages, txn, on_move)
        except StageTableMissing:
            raise  # published before (or lost): the publisher decides which, not a failure of this shard
        except Exception:
            self.metrics.shard_publish_failed(self.shard)
            raise
        self.metrics.shard_published(self.shard, rows)
        return rows
