"""The operator's changes as soak faults (``tests.soak.schedule.CHANGE_KINDS``), each carried out the
way docs/operations.md tells an operator to, on the live pipeline, with the real CLI.

A change soak's pipeline reads two topics: the main one, which the producers write, and a quiet
side topic, so that the main topic's route can be removed and the config stays valid. Routes and
the commit point are changed by rewriting the pipeline's config file and restarting the processes
one by one (standby coordinator, leader, then the participant job), as a rollout does. What each
change does to the records' expected counts goes into ``Changes`` for the id oracle
(``tests.soak.ids``); what must be refused and was not goes into ``violations``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from tests.helpers import create_topic, wait_until
from tests.soak.cluster import COORDINATORS, REPO
from tests.soak.ids import Changes
from tests.soak.schedule import FaultPlan

#: How long chtxn may take to report the partitions of a re-created topic stopped.
STOPPED_TIMEOUT_S = 90.0
#: How long a coordinator of the other commit point may take to refuse to start.
REFUSAL_TIMEOUT_S = 60.0
#: How long the switch may be refused while the stopped leader's lease runs out.
LEASE_TIMEOUT_S = 60.0
#: The second table a route move alternates with.
OTHER_TABLE = "events_b"


class ChangeFaults:
    """Mixed into ``tests.soak.faults.Injector``; ``setup_changes`` first."""

    cluster: Any  # Cluster
    traffic: Any  # Traffic
    check: Any  # Pipeline
    ledger: Any  # LedgerStore

    def setup_changes(self, side_topic: str, clickhouse_url: str, commit_point: str) -> None:
        self.changes = Changes(tables={self.check.cfg.clickhouse.target_table})
        self.violations: list[str] = []
        self.side_topic = side_topic
        self.table = self.check.cfg.clickhouse.target_table
        self.commit_point = commit_point
        self.main_routed = True
        self._clickhouse_url = clickhouse_url
        self._admin = AdminClient({"bootstrap.servers": self.check.cfg.kafka.bootstrap_servers})

    # ---- the operator's tools -----------------------------------------------------------------

    def chtxn(self, *args: str, config: Path | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """``chtxn ARGS --config FILE`` as an operator runs it, against ClickHouse directly."""
        return subprocess.run(
            [sys.executable, "-m", "cli", *args, "--config", str(config or self.check.config_path)],
            cwd=REPO,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(REPO), "CHTXN_CLICKHOUSE_URL": self._clickhouse_url}

    def operator(self, *args: str, config: Path | None = None) -> subprocess.CompletedProcess:
        """A command that must succeed; its failure stops the fault with the command's output."""
        done = self.chtxn(*args, config=config)
        if done.returncode != 0:
            raise AssertionError(f"chtxn {' '.join(args)} exited {done.returncode}: {done.stderr[-800:]}")
        return done

    def main_heads(self) -> dict[int, int]:
        topic = self.check.topic
        return {tp.partition: end for tp, end in self.ledger.head()[1].items() if tp.topic == topic}

    def _config(self, **values: str | list[str]) -> str:
        """The config file's text with ``key = value`` lines replaced (keys unique in the file)."""
        text = self.check.config_path.read_text()
        for key, value in values.items():
            text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {json.dumps(value)}", text)
            if not n:
                raise AssertionError(f"no {key} line in {self.check.config_path}")
        return text

    def rollout(self, text: str) -> str:
        """Write the new config and restart the standby, the leader, then the job: returns who was restarted."""
        self.check.config_path.write_text(text)
        leader = self.leader() or COORDINATORS[0]
        for name in (self.standby(leader), leader):
            self.cluster.kill(name)
            self.cluster.start_coordinator(name)
            wait_until(lambda n=name: self.cluster.alive(n), 10, f"{name} restarted")
        self.cluster.kill("participant")
        self.cluster.start_participant()
        wait_until(
            lambda: self.cluster.supervise() or self.cluster.python_workers(), 240, "the restarted job's task workers"
        )
        return f"{self.standby(leader)}, {leader}, participant"

    # ---- changes ------------------------------------------------------------------------------

    def _topic_recreate(self, plan: FaultPlan, record: Any) -> None:
        """The main topic deleted and created again under load; the operator answers the stopped
        partitions with pause, reset --to-earliest, resume."""
        topic = record.target = self.check.topic
        partitions = len(self.check.partitions)
        self.traffic.pause()
        self.changes.deleted[self.traffic.generation] = self.main_heads()
        self._delete(topic)
        self.hold(plan.hold_s)
        for _ in range(3):  # a client may auto-create it meanwhile, with the broker's default partitions
            try:
                create_topic(self._admin, topic, partitions)
                break
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                record.detail += "auto-created meanwhile: deleted again; "
                self._delete(topic)
        self.traffic.new_generation()
        self.traffic.resume()
        started = time.monotonic()
        record.detail += f"created again with {partitions} partitions; "
        try:
            found = wait_until(
                self._stopped_check, STOPPED_TIMEOUT_S, f"chtxn status to name {topic} stopped", interval_s=1
            )
            record.detail += f"stopped after {time.monotonic() - started:.1f}s ({found[:80]}); "
        except AssertionError:
            self.violations.append(
                f"fault #{plan.index}: {topic} re-created, not reported stopped in {STOPPED_TIMEOUT_S:g}s"
            )
            record.detail += "never reported stopped; "
        self.operator("pause", "--reason", "soak: topic re-created")
        args = [a for p in range(partitions) for a in ("--partition", f"{topic}/{p}")]
        reset = json.loads(self.operator("reset", *args, "--to-earliest", "--json").stdout)
        self.operator("resume")
        record.detail += "reset " + ", ".join(
            f"{m['partition']} {m['committed']}->{m['reset_to']}" for m in reset["partitions"]
        )

    def _stopped_check(self) -> str | None:
        self.cluster.supervise()
        done = self.chtxn("status", "--json", timeout_s=60)
        try:
            checks = {c["name"]: c for c in json.loads(done.stdout).get("checks", [])}
        except json.JSONDecodeError:
            return None
        check = checks.get("partition logs")
        if check and check["status"] == "fail" and self.check.topic in check.get("found", ""):
            return str(check["found"])
        return None

    def _route_move(self, plan: FaultPlan, record: Any) -> None:
        table = OTHER_TABLE if self.table != OTHER_TABLE else self.check.cfg.clickhouse.target_table
        self.changes.tables.add(table)
        restarted = self.rollout(self._config(target_table=table))
        record.target, self.table = f"{self.table} -> {table}", table
        record.detail = f"restarted {restarted}"

    def _route_remove(self, plan: FaultPlan, record: Any) -> None:
        topic = record.target = self.check.topic
        self.rollout(self._config(topics=[self.side_topic]))
        self.hold(plan.hold_s)
        restarted = self.rollout(self._config(topics=[topic, self.side_topic]))
        record.detail = f"removed for {plan.hold_s:.1f}s, put back; restarted {restarted} twice"

    def _reset_race(self, plan: FaultPlan, record: Any) -> None:
        """Pause, rewind one partition by ``rewind`` records, resume; ``race`` says how the commands
        interleave. A reset applied must move exactly what it reports; one refused moves nothing."""
        race, rewind = plan.params["race"], plan.params["rewind"]
        partition = plan.index % len(self.check.partitions)
        where = f"{self.check.topic}/{partition}"
        record.target = where
        paused = race != "reset-at-once"  # a reset of a running pipeline must be refused
        if paused:
            self.operator("pause", "--reason", f"soak: reset race {race}")
        time.sleep(plan.params["gap_s"])  # the fault itself: how long the operator takes between the commands
        to = max(0, self.main_heads().get(partition, 0) - rewind)
        argv = [
            "reset",
            "--partition",
            where,
            "--to-offset",
            str(to),
            "--json",
            "--config",
            str(self.check.config_path),
        ]
        reset = subprocess.Popen(
            [sys.executable, "-m", "cli", *argv],
            cwd=REPO,
            env=self._env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if race == "resume-beside-reset":
            self.chtxn("resume")
        out, err = reset.communicate(timeout=120)
        if race == "reset-at-once" and reset.returncode == 0:
            self.violations.append(f"fault #{plan.index}: a reset of a running pipeline was applied: {out}")
        if reset.returncode == 0:
            self._rewound(json.loads(out))
            record.detail = f"{race}: reset applied: {out.strip()[-160:]}"
        else:
            record.detail = f"{race}: reset refused: {err.strip()[-160:]}"
        if paused:
            self.operator("resume")

    def _rewound(self, report: dict) -> None:
        generation = self.traffic.generation
        for move in report["partitions"]:
            partition = int(move["partition"].rsplit("/", 1)[1])
            committed, to = move["committed"], move["reset_to"]
            if to < committed:
                self.changes.rewinds.append((generation, partition, to, committed))
            elif to > committed:  # skipped: never read
                self.violations.append(f"a rewind reset moved {move['partition']} forward ({committed} -> {to})")

    def _commit_point_switch(self, plan: FaultPlan, record: Any) -> None:
        """A rolling switch: the standby restarted with the new commit point must refuse to start;
        then the procedure: pause, stop the leader, switch, start both with the new config, resume."""
        new = "keeper" if self.commit_point == "token" else "token"
        record.target = f"{self.commit_point} -> {new}"
        text = self._config(commit_point=new)
        ahead = self.check.config_path.with_name(self.check.config_path.stem + f"-{new}.toml")
        ahead.write_text(text)
        leader = self._leader()
        standby = self.standby(leader)
        self.cluster.kill(standby)
        self.cluster.start_coordinator(standby, config=ahead)
        self.cluster.held.add(standby)
        try:
            wait_until(lambda: not self.cluster.alive(standby), REFUSAL_TIMEOUT_S, f"{standby} ({new}) to refuse")
            refused = "commit-point switch" in self.cluster.tail(standby, 3000)
            record.detail = f"{standby} with {new} refused (exit {self.cluster.procs[standby].returncode}); "
        except AssertionError:
            refused = False
            self.cluster.kill(standby)
        if not refused:
            self.violations.append(
                f"fault #{plan.index}: a {new} coordinator beside a {self.commit_point} ledger did not refuse"
            )
        self.operator("pause", "--reason", f"soak: switching to {new}")
        self.cluster.kill(leader)
        switch = wait_until(
            lambda: self.cluster.supervise() or self._switched(new),
            LEASE_TIMEOUT_S,
            f"chtxn commit-point switch --to {new}",
        )
        self.check.config_path.write_text(text)
        self.commit_point = new
        for name in COORDINATORS:
            self.cluster.start_coordinator(name)
        self.operator("resume")
        record.detail += f"switched at slot {switch.get('commit_seq')}"

    def _switched(self, new: str) -> dict | None:
        done = self.chtxn("commit-point", "switch", "--to", new, "--reason", "soak", "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    def _dlq_expire(self, plan: FaultPlan, record: Any) -> None:
        """Retention took every dead letter from the topic (the embedded broker cannot delete
        records, so the topic is deleted and created again, empty); chtxn's own record stays."""
        topic = record.target = self.check.cfg.dead_letter_topic
        self._delete(topic)
        create_topic(self._admin, topic, 1)

    def _delete(self, topic: str) -> None:
        for future in self._admin.delete_topics([topic], operation_timeout=30).values():
            future.result(30)
        wait_until(lambda: topic not in self._admin.list_topics(timeout=5).topics, 30, f"topic {topic} deleted")
