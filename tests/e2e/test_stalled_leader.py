"""Two coordinator replicas; the leader's ClickHouse is slow and the leader itself freezes for
longer than its lease between counting a txn and claiming its commit slot (SIGSTOP, as a VM
pause or a long GC would). The standby takes over; the frozen leader wakes up and claims.

Required (docs/architecture.md §13, "leader stalled longer than its lease mid-commit"): no txn whose
ACK-COMMIT went out is missing from the target, and the exactly-once oracle holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_END, Consumer, TopicPartition as KafkaTP

from protocol import codec, naming
from protocol.messages import AckCommit
from tests.faults.proxied import Addresses, direct, via
from tests.faults.tcp_proxy import TcpProxy
from tests.helpers import unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import make_pipeline

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


class AckWatcher:
    """Every ACK-COMMIT on the control topic, whoever sent it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acks: list[AckCommit] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "ack-watcher", "enable.auto.commit": False}
        )
        self._consumer.assign([KafkaTP(topic, 0, OFFSET_END)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for record in self._consumer.consume(100, 0.1):
                if record.error() is None and isinstance(message := codec.decode(record.value()), AckCommit):
                    self.acks.append(message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def spawn(config: Path, name: str, log: Path, failpoints: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHTXN_COORDINATOR_ID": name, "CHTXN_FAILPOINTS": failpoints}
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "coordinator", "--config", str(config)],
        cwd=REPO,
        env=env,
        stdout=open(log, "a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    ("commit_point", "point"),
    [
        ("token", "leader.before-commit"),
        ("keeper", "leader.before-commit"),
        ("keeper", "leader.after-keeper-claim"),  # frozen holding the slot's key, before its row
    ],
)
def test_a_leader_frozen_past_its_lease_mid_commit_loses_nothing_it_acknowledged(
    request, tmp_path, commit_point: str, point: str
):
    stack = request.getfixturevalue("keeper_stack" if commit_point == "keeper" else "stack")
    with TcpProxy(stack.clickhouse_host, stack.clickhouse_port) as proxy:
        slow = make_pipeline(
            Addresses(stack.kafka_bootstrap, via(stack.clickhouse_url, proxy)),
            tmp_path,
            unique_name("e2estall"),
            partitions=2,
            settings={"ledger.commit_point": commit_point},
        )
        pipeline = direct(slow, stack.clickhouse_url)
        fast_config = tmp_path / "direct.toml"
        fast_config.write_text(
            slow.config_path.read_text().replace(via(stack.clickhouse_url, proxy), stack.clickhouse_url)
        )
        produced = pipeline.produce(2_000)
        acks = AckWatcher(stack.kafka_bootstrap, pipeline.cfg.control_topic)
        procs: dict[str, subprocess.Popen] = {}
        try:
            with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
                procs["c1"] = spawn(slow.config_path, "c1", tmp_path / "c1.log", failpoints=f"{point}@c1=stall(12)*1")
                # Leading, not just owning epoch 1: with the keeper commit point the epoch's key is
                # c1's before its ledger row is, and a standby started in between (c1's ClickHouse
                # slowed below) would rightly take a lease c1 has not begun to heartbeat.
                wait_until(lambda: '"msg": "leading"' in (tmp_path / "c1.log").read_text(), 60, "c1 leads")
                assert pipeline.ledger().epoch_owner(1) == "c1"
                procs["c2"] = spawn(fast_config, "c2", tmp_path / "c2.log")
                proxy.delay(0.3)  # c1's ClickHouse is slow from now on

                def c1_reached_or_lost_the_point() -> str | None:
                    text = (tmp_path / "c1.log").read_text()
                    return text if f"failpoint {point} fires" in text or "no longer leading" in text else None

                # through a proxy adding 0.3 s to each request: about 35 s on a quiet 2-core machine
                c1_log = wait_until(c1_reached_or_lost_the_point, 120, f"c1 counted a txn and reached {point}")
                assert f"failpoint {point} fires" in c1_log, f"c1 lost its lease before reaching {point}:\n{c1_log}"
                os.killpg(procs["c1"].pid, signal.SIGSTOP)  # frozen: no heartbeat either
                ledger = pipeline.ledger()
                wait_until(lambda: ledger.epoch_owner(ledger.max_epoch()) == "c2", 30, "c2 takes over")
                wait_until(
                    lambda: any(c.txn == naming.seal_txn(ledger.max_epoch()) for c in ledger.commits()),
                    30,
                    "c2 sealed its first slot",
                )
                os.killpg(procs["c1"].pid, signal.SIGCONT)  # c1 wakes up and claims its slot
                wait_until(lambda: "stepping down" in (tmp_path / "c1.log").read_text(), 60, "c1 steps down")
                proxy.restore()
                more = pipeline.produce(1_000, start_id=produced)
                produced += more
                wait_until(lambda: pipeline.target_count() == produced, 90, "every record committed by c2")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in procs.values():
                proc.wait(60)
            acks.close()
    commits = {c.txn: c for c in pipeline.ledger().commits()}
    assert acks.acks, "no ACK-COMMIT seen"
    for ack in acks.acks:
        assert ack.txn in commits, f"{ack.txn} was acknowledged (epoch {ack.epoch}) but is not in the commit chain"
    assert pipeline.ledger().lost() == []
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    assert report.rows_in_target == produced
