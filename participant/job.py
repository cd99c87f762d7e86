"""The participant Spark job: ``spark-submit participant/job.py --config pipeline.toml``.

The driver:

1. loads the config and lists the partitions of the source topics;
2. groups them into at most as many tasks as the job has task slots (``participant.task_slots``,
   else ``sc.defaultParallelism``), so every participant runs at once;
3. runs ``sc.parallelize(groups, len(groups)).foreachPartition(run_task)`` in a job group, with
   speculative execution forced off; tasks run until cancelled;
4. fails with a message saying how many slots it needs, and how to get them on its master, when
   not every task is running within ``STARTUP_TIMEOUT_S`` (instead of waiting forever);
5. resubmits the job with exponential back-off when it fails, and cancels and regroups at once
   when partitions are added to a source topic;
6. on SIGTERM or SIGINT cancels the job and stops the SparkContext.

Importable too: ``ParticipantJob(cfg).run()``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.messages import TopicPartition

log = logging.getLogger("chtxn.participant.job")

#: Every task must be running this long after a submission, or the job fails.
STARTUP_TIMEOUT_S = 120.0
#: How often the driver looks for added partitions.
PARTITION_POLL_S = 10.0
BACKOFF_INITIAL_S, BACKOFF_MAX_S = 1.0, 60.0

Group = tuple[tuple[str, int], ...]  # (topic, partition) pairs: plain tuples pickle everywhere


def group_partitions(partitions: Iterable[TopicPartition], slots: int) -> list[Group]:
    """At most ``slots`` groups, sizes differing by at most one; the same input gives the same groups."""
    ordered = sorted(set(partitions))
    count = min(max(1, slots), len(ordered))
    return [tuple((tp.topic, tp.partition) for tp in ordered[i::count]) for i in range(count)]


def task_function(cfg: Any, log_level: str = "WARNING") -> Callable[[Iterator[Group]], None]:
    """What each Spark task runs: the participant of its group of partitions, until killed."""

    def run_task(groups: Iterator[Group]) -> None:
        from pyspark import TaskContext

        from clients import failpoints
        from participant.runner import TaskRunner

        failpoints.arm_from_env()
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        ctx = TaskContext.get()
        for group in groups:
            label = f"{socket.gethostname()}-{os.getpid()}-p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx else ""
            TaskRunner(cfg, [TopicPartition(topic=t, partition=p) for t, p in group], participant_id=label).run()

    return run_task


class ParticipantJob:
    """The driver's loop; ``run`` returns the exit code (0 after a clean stop)."""

    def __init__(
        self,
        cfg: Any,
        *,
        log_level: str = "WARNING",
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        partition_poll_s: float = PARTITION_POLL_S,
    ) -> None:
        self.cfg, self.log_level = cfg, log_level
        self.startup_timeout_s, self.partition_poll_s = startup_timeout_s, partition_poll_s
        self.stop = threading.Event()
        self._submissions = 0
        self._admin: Any = None

    def run(self) -> int:
        from pyspark import SparkConf, SparkContext

        from clients.kafka import KafkaClientFactory

        conf = SparkConf().setIfMissing("spark.app.name", f"chtxn-participant-{self.cfg.name}")
        conf.set("spark.speculation", "false")  # two copies of a participant would fight over a partition
        self._preflight()
        sc = SparkContext.getOrCreate(conf)
        self._admin = KafkaClientFactory(self.cfg).admin()
        self._install_signal_handlers()
        backoff = BACKOFF_INITIAL_S
        try:
            while not self.stop.is_set():
                try:
                    partitions = self._partitions()
                except Exception as exc:  # broker away: wait and try again
                    log.warning("cannot list the source partitions: %s; retrying in %.0f s", exc, backoff)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                outcome, ran = self._run_once(sc, partitions)
                if outcome in ("stopped", "regroup"):
                    backoff = BACKOFF_INITIAL_S
                    continue
                backoff = BACKOFF_INITIAL_S if ran else backoff
                log.warning("participant job ended (%s); resubmitting in %.0f s", outcome, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            return 0
        finally:
            try:
                sc.cancelAllJobs()
                sc.stop()
            except Exception as exc:  # Spark's own shutdown hook may have stopped it first
                log.info("SparkContext already stopped: %s", _first_line(exc))

    def _preflight(self) -> None:
        """Refuse at once what no task could fix (``SetupError``); ClickHouse being away is not refused."""
        from clients.clickhouse import make_client
        from participant.stager import Stager, check_target
        from protocol.errors import ClickHouseError

        try:
            client = make_client(self.cfg.clickhouse)
        except ClickHouseError as exc:
            log.warning("cannot check the target table now (tasks will retry): %s", exc)
            return
        try:
            check_target(
                Stager(client=client, section=self.cfg.clickhouse, dead_letters=None, attempts=3),
                self.cfg.clickhouse.target_table,
            )
        except ClickHouseError as exc:
            log.warning("cannot check the target table now (tasks will retry): %s", exc)
        finally:
            client.close()

    def _partitions(self) -> list[TopicPartition]:
        from clients.kafka import partitions_of

        return partitions_of(self._admin, self.cfg.pipeline.topics, bootstrap=self.cfg.kafka.bootstrap_servers)

    def _run_once(self, sc: Any, partitions: Sequence[TopicPartition]) -> tuple[str, bool]:
        """Submit one job and watch it: ``("stopped"|"regroup"|<failure>, every task ran)``."""
        from pyspark import InheritableThread

        slots = self.cfg.participant.task_slots or sc.defaultParallelism
        groups = group_partitions(partitions, slots)
        self._submissions += 1
        job_group = f"chtxn-{self.cfg.name}-{self._submissions}"
        outcome: dict[str, BaseException | None] = {}
        done = threading.Event()
        run_task = task_function(self.cfg, self.log_level)

        def submit() -> None:
            sc.setJobGroup(job_group, f"chtxn participants of {self.cfg.name}", interruptOnCancel=True)
            try:
                sc.parallelize(groups, len(groups)).foreachPartition(run_task)
                outcome["error"] = None
            except BaseException as exc:  # reported by the watching thread
                outcome["error"] = exc
            finally:
                done.set()

        log.info(
            "submitting %d participant tasks for %d partitions (%d slots)",
            len(groups),
            len(partitions),
            slots,
            extra={"job_group": job_group, "groups": [list(g) for g in groups]},
        )
        InheritableThread(target=submit, daemon=True).start()
        submitted, next_poll, all_running = time.monotonic(), time.monotonic() + self.partition_poll_s, False
        while not done.wait(1.0):
            if self.stop.is_set():
                return self._cancel(sc, job_group, done, "stopped"), all_running
            now = time.monotonic()
            if not all_running:
                running = _running_tasks(sc, job_group)
                all_running = running >= len(groups)
                if all_running:
                    log.info("all %d participant tasks are running", len(groups), extra={"job_group": job_group})
                elif now - submitted > self.startup_timeout_s:
                    self._cancel(sc, job_group, done, "no slots")
                    from protocol.errors import SetupError

                    raise SetupError(too_few_slots(sc.master, len(groups), running, self.startup_timeout_s))
            if now >= next_poll:
                next_poll = now + self.partition_poll_s
                try:
                    current = self._partitions()
                except Exception as exc:
                    log.warning("cannot list the source partitions: %s", exc)
                    continue
                if set(current) != set(partitions):
                    log.warning("source partitions changed (%d -> %d): regrouping", len(partitions), len(current))
                    return self._cancel(sc, job_group, done, "regroup"), all_running
        error = outcome.get("error")
        return (f"failed: {_first_line(error)}" if error else "tasks returned"), all_running

    @staticmethod
    def _cancel(sc: Any, job_group: str, done: threading.Event, why: str) -> str:
        sc.cancelJobGroup(job_group)
        done.wait(60)
        return why

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())


def too_few_slots(master: str, needed: int, running: int, timeout_s: float) -> str:
    """Why the job gave up when only ``running`` of ``needed`` tasks started on ``master``, and what to do."""
    fewer = max(running, 1)
    if master.startswith("local"):
        return (
            f"the participant job needs {needed} task slots running at once but only {running} started within "
            f"{timeout_s:g} s: run with --master local[{needed},4] or set participant.task_slots to {fewer} or "
            "fewer (each task then holds more partitions)"
        )
    if master.startswith("spark://"):
        return (
            f"the participant job needs {needed} task slots running at once but only {running} started within "
            f"{timeout_s:g} s: give the application {needed} cores on the cluster's workers: enough workers with "
            f"free cores, --conf spark.cores.max={needed} (or unset it), other applications stopped, or set "
            f"participant.task_slots to {fewer} or fewer (each task then holds more partitions)"
        )
    return (
        f"the participant job needs {needed} task slots running at once but only {running} started within "
        f"{timeout_s:g} s: give the application {needed} executor cores in all: --conf "
        f"spark.executor.instances=E and --conf spark.executor.cores=C with E x C >= {needed}, and "
        f"spark.dynamicAllocation.enabled=false, or set participant.task_slots to {fewer} or fewer (each task "
        "then holds more partitions)"
    )


def _running_tasks(sc: Any, job_group: str) -> int:
    tracker = sc.statusTracker()
    running = 0
    for job_id in tracker.getJobIdsForGroup(job_group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job else ():
            stage = tracker.getStageInfo(stage_id)
            running += stage.numActiveTasks if stage else 0
    return running


def _first_line(error: BaseException | None) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="participant/job.py", description="The chtxn participant Spark job.")
    parser.add_argument("--config", required=True, help="the pipeline TOML file")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING or ERROR")
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=STARTUP_TIMEOUT_S,
        help=f"seconds every task has to start after a submission (default: {STARTUP_TIMEOUT_S:g})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    from protocol.config import load_config
    from protocol.errors import ChtxnError, ConfigError

    try:
        cfg = load_config(args.config, os.environ)
        return ParticipantJob(cfg, log_level=args.log_level, startup_timeout_s=args.startup_timeout).run()
    except ConfigError as exc:
        print(f"chtxn participant: config error: {exc}", file=sys.stderr)
        return 2
    except ChtxnError as exc:
        print(f"chtxn participant: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    from participant.job import main as _main  # so Spark pickles task functions by module, not by value

    sys.exit(_main())
