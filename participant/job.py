"""The participant Spark job: ``spark-submit participant/job.py --config pipeline.toml``.

The driver:

1. loads the config and checks what every task needs before Spark starts one
   (``participant.preflight``): the source and control topics, the target table; ClickHouse or the
   broker away is retried with back-off, one log line per attempt, for ``participant.outage_timeout_s``;
   then starts its SparkContext within a bound (``participant.spark_context``);
2. groups the partitions into at most as many tasks as the job has task slots
   (``participant.task_slots``, else ``sc.defaultParallelism``), so every participant runs at once;
3. runs ``sc.parallelize(groups, len(groups)).foreachPartition(run_task)`` in a job group named for
   the pipeline (job, stage and description, with the partitions of each task), with speculative
   execution forced off; tasks run until cancelled;
4. ends the job when a task raised an error no retry mends (a setup error it found, an outage past
   its time): the task's one line crosses Spark (``participant.job_errors``) and is printed once, with
   its exit code; fails with a message saying how many slots it needs, and how to get them on its
   master, when not every task is running within ``STARTUP_TIMEOUT_S`` (instead of waiting forever);
5. resubmits the job with exponential back-off when it fails otherwise, and cancels and regroups at
   once when partitions are added to a source topic; checks the broker and ClickHouse every
   ``PARTITION_POLL_S`` and ends the job when one stayed away for ``participant.outage_timeout_s``;
6. on SIGTERM or SIGINT tells its tasks to leave (``participant.leaving``): each finishes its part
   of the open txn, so it commits instead of aborting, and returns; cancels the job only when they
   are not gone after ``transaction.write_status_timeout_s``; then stops the SparkContext.

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
import warnings
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
#: How long a stopped SparkContext waits for this process's own SIGTERM before it counts as Spark's doing.
STOPPING_S = 5.0

Group = tuple[tuple[str, int], ...]  # (topic, partition) pairs: plain tuples pickle everywhere


def group_partitions(partitions: Iterable[TopicPartition], slots: int) -> list[Group]:
    """At most ``slots`` groups, sizes differing by at most one; the same input gives the same groups."""
    ordered = sorted(set(partitions))
    count = min(max(1, slots), len(ordered))
    return [tuple((tp.topic, tp.partition) for tp in ordered[i::count]) for i in range(count)]


def task_function(cfg: Any, log_level: str = "WARNING", job: str = "") -> Callable[[Iterator[Group]], None]:
    """What each Spark task runs: the participant of its group of partitions, until killed. Its logs
    are JSON lines; an error no retry of the task mends leaves it as ``job_errors.TaskFatal``."""

    def run_task(groups: Iterator[Group]) -> None:
        from pyspark import TaskContext

        from clients import failpoints
        from clients.logs import quiet_libraries, setup_logging
        from participant.job_errors import task_errors
        from participant.runner import TaskRunner

        failpoints.arm_from_env()
        setup_logging(log_level)  # JSON lines, as the coordinator's
        quiet_libraries(log_level)
        ctx = TaskContext.get()
        for group in groups:
            label = f"{socket.gethostname()}-{os.getpid()}-p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx else ""
            tps = [TopicPartition(topic=t, partition=p) for t, p in group]
            with task_errors(log, label):  # a setup error or an outage past its time ends the job
                TaskRunner(cfg, tps, participant_id=label, job=job).run()

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
        self._watch: Any = None  # participant.preflight.Watch, made in run
        from participant.leaving import job_id

        self.job_id = job_id()  # the tasks leave on a LEAVE naming it

    def run(self) -> int:
        """Run until stopped: 0. An error that ends the job is raised; ``participant.job_errors``
        gives its exit code and its line."""
        from pyspark import SparkConf

        from participant import spark_context
        from participant.job_errors import SparkUnavailable
        from participant.preflight import Watch, kafka_admin, preflight

        self._install_signal_handlers()
        # Participant job step 1: what every task needs, before Spark starts one
        checked = preflight(self.cfg, stop=self.stop)
        if checked is None:
            return 0
        self.cfg = checked[0]  # the tasks run with the driver's config, a Distributed target's shards learnt here
        conf = SparkConf().setIfMissing("spark.app.name", f"chtxn-participant-{self.cfg.name}")
        conf.set("spark.speculation", "false")  # two copies of a participant would fight over a partition
        sc = spark_context.start(spark_context.quiet(conf), bound_s=self.startup_timeout_s)
        sc.environment["SPARK_HIDE_TRACEBACK"] = "1"  # a task's error is one line; tasks log a bug's traceback
        self._admin = kafka_admin(self.cfg)
        self._watch = Watch(self.cfg, self._admin)
        backoff = BACKOFF_INITIAL_S
        try:
            while not self.stop.is_set():
                partitions = self._watch.partitions(time.monotonic())
                if partitions is None:  # the broker away: one line per attempt, OutageError past the timeout
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                outcome, ran = self._run_once(sc, partitions)
                if outcome in ("stopped", "regroup"):
                    backoff = BACKOFF_INITIAL_S
                    continue
                backoff = BACKOFF_INITIAL_S if ran else backoff
                if spark_context.stopped(sc):  # the master or the cluster manager ended the application,
                    if self.stop.wait(STOPPING_S):  # or a SIGTERM to the process group stopped the JVM too
                        break
                    raise SparkUnavailable(f"Spark stopped the job ({outcome}): check the Spark master and its log")
                log.warning("participant job ended (%s); resubmitting in %.0f s", outcome, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            return 0
        finally:
            self._watch.close()
            try:
                spark_context.stop(sc)
            except Exception as exc:  # Spark's own shutdown hook may have stopped it first
                log.info("SparkContext already stopped: %s", _first_line(exc))

    def _run_once(self, sc: Any, partitions: Sequence[TopicPartition]) -> tuple[str, bool]:
        """Submit one job and watch it: ``("stopped"|"regroup"|<failure>, every task ran)``. Raises
        ``TaskEnded`` when a task named an error no retry mends, ``OutageError`` when ClickHouse or the
        broker stayed away too long, ``SparkUnavailable`` when not every task got a slot."""
        from pyspark import InheritableThread

        from participant import spark_context
        from participant.job_errors import OutageError, SparkUnavailable, TaskEnded, failure_line, fatal_in

        slots = self.cfg.participant.task_slots or sc.defaultParallelism
        groups = group_partitions(partitions, slots)
        self._submissions += 1
        job_group = f"chtxn-{self.cfg.name}-{self._submissions}"
        outcome: dict[str, BaseException | None] = {}
        done = threading.Event()
        run_task = task_function(self.cfg, self.log_level, self.job_id)
        name, description = spark_context.job_names(self.cfg.name, self._submissions, groups)

        def submit() -> None:
            # Participant job step 3: named for the pipeline in the Spark UI (job, stage, description)
            sc.setJobGroup(job_group, description, interruptOnCancel=True)
            try:
                with spark_context.named_call_site(sc, name):
                    sc.parallelize(groups, len(groups)).setName(name).foreachPartition(run_task)
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
                from participant.leaving import leave

                if leave(self.cfg, self.job_id, done):  # the tasks finish their part of the open txn
                    return "stopped", all_running  # and are gone: nothing to cancel
                return self._cancel(sc, job_group, done, "stopped"), all_running
            now = time.monotonic()
            if not all_running:
                running = _running_tasks(sc, job_group)
                all_running = running >= len(groups)
                if all_running:
                    log.info("all %d participant tasks are running", len(groups), extra={"job_group": job_group})
                elif now - submitted > self.startup_timeout_s:
                    self._cancel(sc, job_group, done, "no slots")
                    raise SparkUnavailable(too_few_slots(sc.master, len(groups), running, self.startup_timeout_s))
            if now >= next_poll:
                next_poll = now + self.partition_poll_s
                try:  # Participant job step 5: the broker and ClickHouse, each failed check one line
                    current = self._watch.partitions(now)
                    self._watch.clickhouse_answers(now)
                except OutageError:
                    self._cancel(sc, job_group, done, "outage")
                    raise
                if current is not None and set(current) != set(partitions):
                    log.warning("source partitions changed (%d -> %d): regrouping", len(partitions), len(current))
                    return self._cancel(sc, job_group, done, "regroup"), all_running
        error = outcome.get("error")
        if error is not None and (named := fatal_in(str(error))) is not None:
            raise TaskEnded(*named)  # Participant job step 4: a task's error no retry mends ends the job
        return (f"failed: {failure_line(error)}" if error else "tasks returned"), all_running

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
    """Run the job; the exit code is ``participant.job_errors.ExitCode``, and an error ends it with
    one line ``chtxn: <message>`` on stderr, spark-submit's when it runs the job
    (``participant.driver_stderr``), as are the job's log lines."""
    parser = argparse.ArgumentParser(
        prog="participant/job.py",
        description="The chtxn participant Spark job. Exit codes: 0 stopped, 1 internal error, 2 config error, "
        "3 setup error (a topic or table missing or wrong), 4 ClickHouse or Kafka unreachable for longer than "
        "participant.outage_timeout_s, 5 Spark (master unreachable, too few task slots).",
    )
    parser.add_argument("--config", required=True, help="the pipeline TOML file")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default) or ERROR")
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=STARTUP_TIMEOUT_S,
        help=f"seconds every task has to start after a submission (default: {STARTUP_TIMEOUT_S:g})",
    )
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\.")  # pyspark on pandas 3
    from participant.driver_stderr import use_jvm_stderr

    use_jvm_stderr()  # spark-submit merges this process's stderr into its stdout: Spark's stderr instead
    args = parser.parse_args(argv)
    from clients.logs import quiet_libraries, setup_logging
    from participant.job_errors import ExitCode, describe, exit_code
    from protocol import secrets
    from protocol.config.parse import load_config
    from protocol.errors import ConfigError

    setup_logging(args.log_level)  # JSON lines, as the coordinator's
    quiet_libraries(args.log_level)
    try:
        cfg = load_config(args.config, os.environ)
        return ParticipantJob(cfg, log_level=args.log_level, startup_timeout_s=args.startup_timeout).run()
    except Exception as exc:
        code = exit_code(exc)
        kind = "config error: " if isinstance(exc, ConfigError) else ""
        if code is ExitCode.INTERNAL:
            log.debug("the participant job failed", exc_info=True)  # --log-level DEBUG shows the traceback
            kind = f"internal error: {type(exc).__name__}: "
        print(f"chtxn: {secrets.redact(kind + describe(exc))}", file=sys.stderr, flush=True)
        return int(code)


if __name__ == "__main__":
    from participant.job import main as _main  # so Spark pickles task functions by module, not by value

    sys.exit(_main())
