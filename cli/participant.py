"""``chtxn participant``: run the participant Spark job through pyspark's own ``spark-submit``.

What the executors run, by master:

- ``local[N]`` (the default): Spark runs in this process tree, so the executors use this Python,
  with the project packages zipped for ``--py-files``.
- any other master (``spark://``, ``yarn``, ``k8s://``, ``local-cluster``): executors on other
  machines have nothing of chtxn installed. The launcher ships a packed virtualenv with the project
  and its runtime dependencies (:mod:`cli.packaging`, built once and cached by content) as
  ``--archives <pack>.tar.gz#environment``, and the executors run ``./environment/bin/python``.
  The driver runs here (client mode) with this Python, unless ``spark.submit.deployMode=cluster``.

Before spark-submit, the launcher runs the job's checks (``participant.preflight``): a setup
error, an outage past ``participant.outage_timeout_s`` or an unreachable master ends it within
seconds, with the exit code the job itself would give (``participant.job_errors.ExitCode``).

Everything is in the command line (``--dry-run`` prints it): no ``PYSPARK_*`` variable is set.
The driver's JVM gets chtxn's log4j2 configuration (Spark at WARN, a failed task in one line).
spark-submit runs in a process group of its own; SIGTERM and Ctrl-C are passed to that group; the
exit code is spark-submit's.

The job dies with the launcher: when the launcher dies, however it dies (SIGKILL included), a
watchdog process (:mod:`procs`) terminates spark-submit's group (the JVM and the Python driver),
SIGKILL after ``OWNER_GONE_GRACE_S``; PySpark's daemon and its workers exit when the JVM does. So
a supervisor that restarts the launcher never runs two copies of the participants for longer
than that grace.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import zipfile
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import KafkaException

from cli.config_option import add_config_option
from cli.packaging import ARCHIVE_ALIAS, EXECUTOR_PYTHON, default_cache_dir, ensure_archive, project_sources
from participant.job_errors import describe, exit_code
from participant.leaving import driver_pid
from participant.spark_context import LOG4J2, check_master
from procs import signal_group, start_watchdog
from protocol import secrets
from protocol.config.parse import PipelineConfig, load_config
from protocol.errors import ChtxnError, ConfigError, SetupError
from protocol.messages import TopicPartition

#: Attempts per task in local mode (``local[N,F]``): a failed participant task is retried.
LOCAL_TASK_ATTEMPTS = 4
#: After the launcher died: how long spark-submit's group has between SIGTERM and SIGKILL.
OWNER_GONE_GRACE_S = 5.0

EXIT_CODES = (
    "Exit codes (the launcher's checks and the job give the same): 0 stopped (SIGTERM, Ctrl-C); 1 internal "
    "error, or Spark failed the job for a reason chtxn does not know; 2 config error (the pipeline file, a CHTXN_* "
    "variable, [kafka.properties]); 3 setup error: a topic or table missing or wrong (control topic partitions, "
    "target table); 4 ClickHouse or the Kafka broker unreachable for longer than participant.outage_timeout_s "
    "(retried with back-off meanwhile, one log line per attempt); 5 Spark: the master cannot be reached, or the job "
    "cannot get a slot for every task. Each ends with one line 'chtxn: <what is wrong and what to do>' on stderr."
)

#: Seconds a stopped job's tasks get beyond the WRITE-STATUS timeout to leave before the group is stopped.
LEAVE_GRACE_S = 15.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "participant",
        help="run the participant Spark job (spark-submit participant/job.py)",
        description="Run the participants of a pipeline as a Spark job: one long-running task per group of "
        "source partitions, every task running at once. Without --master, runs Spark in local mode with one "
        "slot per core (at most one per partition) and task retries, the executors using this Python. With a "
        "cluster master (spark://, yarn, k8s://) the executors need nothing of chtxn installed: the project and "
        "its runtime dependencies go to them as a packed virtualenv (--archives <pack>.tar.gz#environment), "
        "built on first use and cached by content in --cache-dir. --dry-run prints the spark-submit command "
        "(building the archive if needed) without running it.\n\n" + EXIT_CODES,
        epilog="Example: chtxn participant --config pipeline.toml --master spark://host:7077 --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument("--master", default=None, help="Spark master URL (default: local[<tasks>,4])")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark property (repeatable)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the spark-submit command instead of running it")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the dry run as JSON: command, master, archive, executor_python (implies --dry-run)",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="where executor archives are built and kept (default: $CHTXN_CACHE_DIR, else "
        "$XDG_CACHE_HOME/chtxn or ~/.cache/chtxn)",
    )
    parser.add_argument(
        "--executor-python",
        default=None,
        metavar="PATH",
        help="the CPython the executors run, a path on the cluster nodes, of this Python's minor "
        "version (default: the interpreter this Python's venv is based on)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail when not every task is running this long after a submission (default: 120)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check, then run spark-submit; an error that ends the job is one line and its exit code."""
    try:
        return _run(args)
    except (ChtxnError, KafkaException) as exc:
        code = exit_code(exc)
        if getattr(args, "debug", False):
            traceback.print_exc()
        kind = "config error: " if isinstance(exc, ConfigError) else ""
        print(f"chtxn: {secrets.redact(kind + describe(exc))}", file=sys.stderr, flush=True)
        return int(code)


def _run(args: argparse.Namespace) -> int:
    from clients.logs import quiet_libraries
    from participant.preflight import preflight

    cfg = load_config(args.config, os.environ)
    dry_run = args.dry_run or args.json
    partitions = None
    if not dry_run:  # Participant job step 1, here too: within seconds, before a JVM starts
        quiet_libraries(getattr(args, "log_level", "WARNING"))
        if args.master:
            check_master(args.master)  # a wrong --master is named first: the cheapest check
        checked = preflight(cfg)
        partitions = checked[1] if checked else None
    master = args.master or default_master(cfg, partitions)
    archive, built = None, False
    if not dry_run and not args.master:  # a dry run may name any master
        check_master(master)
    if not is_local(master):
        cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir(os.environ)
        archive, built = ensure_archive(cache_dir, python=args.executor_python, progress=_progress)
    command = spark_submit_command(
        cfg,
        config_path=args.config,
        master=master,
        extra_conf=args.conf,
        log_level=getattr(args, "log_level", "WARNING"),
        archive=archive,
        startup_timeout_s=args.startup_timeout,
    )
    if args.dry_run or args.json:
        if args.json:
            print(
                json.dumps(
                    {
                        "command": command,
                        "master": master,
                        "archive": str(archive) if archive else None,
                        "archive_built": built,
                        "executor_python": EXECUTOR_PYTHON if archive else sys.executable,
                    },
                    indent=2,
                )
            )
        else:
            print(shlex.join(command))
        return 0
    process = subprocess.Popen(command, start_new_session=True)
    watchdog = start_watchdog(process.pid, OWNER_GONE_GRACE_S)

    asked = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        """The first SIGTERM or Ctrl-C goes to the job's Python driver alone, whose tasks then leave
        cleanly (``participant.leaving``: their open txn commits); the whole process group gets it
        after ``transaction.write_status_timeout_s`` and a grace, at a second signal, or at once when
        no driver is found (cluster deploy mode, or a driver not started yet)."""
        driver = None if asked.is_set() else driver_pid(process.pid)
        asked.set()
        if driver is None:
            signal_group(process.pid, signal.SIGTERM)
            return
        os.kill(driver, signal.SIGTERM)
        stop_all = threading.Timer(
            cfg.transaction.write_status_timeout_s + LEAVE_GRACE_S, signal_group, (process.pid, signal.SIGTERM)
        )
        stop_all.daemon = True
        stop_all.start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    try:
        return process.wait()
    finally:
        signal_group(process.pid, signal.SIGKILL)  # stragglers of the group once spark-submit is gone
        watchdog.kill()
        watchdog.wait()


def is_local(master: str) -> bool:
    """``local`` and ``local[...]`` run executors in the driver's JVM; ``local-cluster[...]`` does not."""
    return master == "local" or master.startswith("local[")


def _progress(line: str) -> None:
    print(f"chtxn participant: {line}", file=sys.stderr, flush=True)


def default_master(cfg: PipelineConfig, partitions: list[TopicPartition] | None = None) -> str:
    """``local[N,4]``: N slots for N tasks, one per core, at most one per partition.

    A participant task is never idle (it reads while its own threads stage), so a second task per
    core adds no work done, only clients, heartbeats and control-topic fetches: on 2 cores, 4
    partitions in 2 tasks moved 232k-237k rows/s against 188k-233k in 4 tasks, with 20-25% less
    CPU in the tasks and the broker (``python -m benchmarks.pipeline``, 2026-11-23).
    """
    from clients.kafka import admin, partitions_of

    if cfg.participant.task_slots:
        tasks = cfg.participant.task_slots
    else:
        if partitions is None:
            partitions = partitions_of(admin(cfg), cfg.source_topics, bootstrap=cfg.kafka.bootstrap_servers)
        tasks = max(1, min(len(partitions), os.cpu_count() or 1))
    return f"local[{tasks},{LOCAL_TASK_ATTEMPTS}]"


def spark_submit_command(
    cfg: PipelineConfig,
    *,
    config_path: str,
    master: str,
    extra_conf: Sequence[str] = (),
    log_level: str = "WARNING",
    archive: Path | None = None,
    startup_timeout_s: float | None = None,
) -> list[str]:
    """The spark-submit command line that runs ``participant/job.py`` for ``cfg``.

    A local master gets this Python and ``--py-files``; any other needs ``archive``, the packed
    executor environment, which its executors unpack as ``./environment``.
    """
    import participant.job

    conf = dict(_key_value(item) for item in extra_conf)
    command = [str(spark_submit()), "--master", master, "--name", f"chtxn-participant-{cfg.name}"]
    if is_local(master):
        command += [
            "--py-files",
            str(py_files_zip()),
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "--conf",
            f"spark.pyspark.driver.python={sys.executable}",
        ]
    else:
        if archive is None:
            raise SetupError(f"master {master} runs executors elsewhere: they need the packed environment (archive)")
        command += ["--archives", f"{archive}#{ARCHIVE_ALIAS}", "--conf", f"spark.pyspark.python={EXECUTOR_PYTHON}"]
        if conf.get("spark.submit.deployMode", "client") == "client":  # the driver runs here, with this Python
            command += ["--conf", f"spark.pyspark.driver.python={sys.executable}"]
    command += ["--conf", "spark.speculation=false", "--conf", "spark.ui.showConsoleProgress=false"]
    java_options = conf.pop("spark.driver.extraJavaOptions", "")
    if "log4j" not in java_options and conf.get("spark.submit.deployMode", "client") == "client":
        java_options = f"-Dlog4j2.configurationFile={log4j2_file().as_uri()} {java_options}".strip()
    if java_options:  # the user's options after chtxn's: a property they set again wins
        command += ["--conf", f"spark.driver.extraJavaOptions={java_options}"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [
        str(Path(participant.job.__file__).resolve()),
        "--config",
        str(Path(config_path).resolve()),
        "--log-level",
        log_level,
    ]
    if startup_timeout_s is not None:
        command += ["--startup-timeout", f"{startup_timeout_s:g}"]
    return command


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SetupError(f"--conf {item!r}: expected KEY=VALUE, e.g. --conf spark.executor.memory=2g")
    return key, value


def spark_submit() -> Path:
    """pyspark's own ``bin/spark-submit``."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    if not path.is_file():
        raise SetupError(f"pyspark has no spark-submit at {path}: reinstall pyspark (pip install 'pyspark>=4.0')")
    return path


def log4j2_file() -> Path:
    """The driver JVM's log4j2 configuration (``participant.spark_context.LOG4J2``), written once
    per content to the temporary directory."""
    digest = hashlib.sha256(LOG4J2.encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"chtxn-log4j2-{digest}.properties"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(LOG4J2)
        partial.replace(target)
    return target


def py_files_zip() -> Path:
    """A zip of the shipped packages, named by content hash so repeated runs reuse it."""
    files = project_sources()
    digest = hashlib.sha256()
    for name, f in files:
        digest.update(name.encode() + b"\0" + f.read_bytes())
    target = Path(tempfile.gettempdir()) / f"chtxn-pyfiles-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, f in files:
                archive.write(f, name)
        partial.replace(target)
    return target
