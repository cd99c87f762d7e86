"""The participant job's SparkContext: started within a bound, quiet, and its jobs named for the
pipeline in the Spark UI.

- ``check_master``: a ``spark://`` master that refuses connections is one line within seconds.
- ``start``: a master that accepts connections but never registers the application (not a Spark
  master, or a hung one) would block the SparkContext for Spark's own 3 x 20 s and then stop it; the
  context is started on a thread and given ``bound_s`` instead (``SparkUnavailable``).
- ``quiet``: Spark at WARN (``spark.log.level``) in the driver's JVM, which in local mode runs the
  executors too; the launcher also gives the driver's JVM ``LOG4J2``, which keeps Spark's INFO lines
  of the start-up away and a failed task to one line per attempt. Executors on a cluster log to
  their own files at the cluster's level: Spark 4.3's ``spark.executor.syncLogLevel.enabled`` did
  not change it on a standalone cluster (their log4j2 configuration is the cluster's to set).
- ``named_call_site``: the job and its stage show a name, not ``copy_local_properties at threading.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from participant.job_errors import SparkUnavailable, one_line

#: How long ``check_master`` waits for a ``spark://`` master to accept a connection.
MASTER_CONNECT_TIMEOUT_S = 5.0
#: Longest job description shown (the Spark UI's column is narrow; many partitions are cut).
DESCRIPTION_MAX = 1000
#: How long a ``spark://`` master has to register the application (one retry of Spark's 20 s).
STANDALONE_REGISTRATION_S = 30.0

#: The driver JVM's log4j2 configuration: WARN and up; a failed task (reported by the executor and
#: by the scheduler, each with the JVM's stack) in one line each, its stack left out: the driver
#: prints chtxn's own line for the cause. The same for Spark's RPC connections and its standalone
#: client (a ``spark://`` address answered by another server: each attempt a line, not a stack).
LOG4J2 = r"""# chtxn participant job: Spark at WARN; a failed task's report without its JVM stack
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
appender.brief.type = Console
appender.brief.name = brief
appender.brief.target = SYSTEM_ERR
appender.brief.layout.type = PatternLayout
appender.brief.layout.alwaysWriteExceptions = false
appender.brief.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %replace{%m}{(?s)\\s*(SQLSTATE|\\tat |Driver stacktrace).*}{}%notEmpty{ (%replace{%ex{short.message}}{(?s)\\s*SQLSTATE.*}{})}%n
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.additivity = false
logger.executor.appenderRef.brief.ref = brief
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.additivity = false
logger.tasks.appenderRef.brief.ref = brief
logger.listeners.name = org.apache.spark.TaskContextImpl
logger.listeners.additivity = false
logger.listeners.appenderRef.brief.ref = brief
logger.network.name = org.apache.spark.network
logger.network.additivity = false
logger.network.appenderRef.brief.ref = brief
logger.standalone.name = org.apache.spark.deploy.client
logger.standalone.additivity = false
logger.standalone.appenderRef.brief.ref = brief
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


def check_master(master: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """Raise ``SparkUnavailable`` unless some ``host:port`` of a ``spark://`` URL accepts a
    connection (other masters are not checked)."""
    if not master.startswith("spark://"):
        return
    reasons = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host or address, int(port or 7077)), timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            reasons.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    raise SparkUnavailable(
        f"cannot reach the Spark master at {master} within {timeout_s:g} s ({'; '.join(reasons)}): "
        "check --master and that the master is running"
    )


def quiet(conf: Any) -> Any:
    """``conf`` (a SparkConf) with Spark at WARN in the driver (and local executors), unless set."""
    conf.setIfMissing("spark.log.level", "WARN")
    conf.setIfMissing("spark.ui.showConsoleProgress", "false")
    return conf


def start(conf: Any, *, bound_s: float) -> Any:
    """A running SparkContext for ``conf``, or ``SparkUnavailable`` when it is not up within
    ``bound_s`` (a ``spark://`` master: ``STANDALONE_REGISTRATION_S`` at most) or Spark stopped it."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()  # the JVM gateway, whose properties hold spark-submit's --master
    jvm: Any = SparkContext._jvm
    master = conf.get("spark.master") or jvm.java.lang.System.getProperty("spark.master") or ""
    check_master(master)
    if master.startswith("spark://"):
        bound_s = min(bound_s, STANDALONE_REGISTRATION_S)
    box: dict[str, Any] = {}

    def create() -> None:
        try:
            box["sc"] = SparkContext.getOrCreate(conf)
        except BaseException as exc:  # reported by the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=create, name="chtxn-spark-start", daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        raise SparkUnavailable(
            f"the Spark master {master} did not start the application within {bound_s:g} s: check that --master "
            "names a running Spark master (spark://host:7077, not its web UI port) and that it has free workers"
        )
    if "error" in box:
        raise SparkUnavailable(f"Spark could not start the job on {master}: {_first_line(box['error'])}")
    sc = box["sc"]
    if stopped(sc):  # a standalone master gave up on the application
        raise SparkUnavailable(
            f"Spark stopped the job on {master} as it started (all masters unresponsive?): check --master"
        )
    return sc


def stop(sc: Any, *, drain_s: float = 10.0) -> None:
    """Cancel ``sc``'s jobs, wait up to ``drain_s`` for the executors' killed tasks to end, then stop
    it. A task still ending when the context stops fails its completion listeners on blocks already
    removed (``Block broadcast_0 does not exist``), a JVM stack in the job's log."""
    sc.cancelAllJobs()
    deadline = time.monotonic() + drain_s
    while _executors_running_tasks(sc) and time.monotonic() < deadline:
        time.sleep(0.2)  # Spark offers no wait for an executor's tasks to end
    sc.stop()


def _executors_running_tasks(sc: Any) -> int:
    try:
        return sum(info.numRunningTasks() for info in sc._jsc.sc().statusTracker().getExecutorInfos())
    except Exception:  # the context or its JVM is already gone
        return 0


def stopped(sc: Any) -> bool:
    """Whether Spark stopped ``sc`` (or its JVM is gone)."""
    try:
        return bool(sc._jsc.sc().isStopped())
    except Exception:  # the gateway is gone with the JVM
        return True


def job_names(pipeline: str, submission: int, groups: Sequence[Sequence[tuple[str, int]]]) -> tuple[str, str]:
    """The name of a submission's job and stage, and its description: the partitions of each task
    (task i is the Spark partition i of the stage, as the UI lists it)."""
    count = sum(len(g) for g in groups)
    name = f"chtxn {pipeline}: {len(groups)} participant tasks"
    tasks = "; ".join(f"task {i}: " + ", ".join(f"{t}/{p}" for t, p in group) for i, group in enumerate(groups))
    description = f"chtxn {pipeline} participants (submission {submission}): {count} partitions; {tasks}"
    if len(description) > DESCRIPTION_MAX:
        description = description[: DESCRIPTION_MAX - 3] + "..."
    return name, description


@contextmanager
def named_call_site(sc: Any, name: str) -> Iterator[None]:
    """Jobs submitted inside are named ``name`` in the Spark UI (jobs and stages). PySpark names a job
    after the first Spark call on its stack, through its ``SCCallSiteSync``; an outer one set first
    is the one kept."""
    from pyspark.traceback_utils import SCCallSiteSync

    site = SCCallSiteSync(sc)
    site._call_site = name  # what SCCallSiteSync would have read from the stack
    with site:
        yield


def _first_line(error: BaseException) -> str:
    from participant.job_errors import failure_line

    return one_line(failure_line(error))
