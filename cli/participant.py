"""``chtxn participant``: run the participant Spark job through pyspark's own ``spark-submit``.

What the executors run, by master:

- ``local[N]`` (the default): Spark runs in this process tree, so the executors use this Python,
  with the project packages zipped for ``--py-files``.
- any other master (``spark://``, ``yarn``, ``k8s://``, ``local-cluster``): executors on other
  machines have nothing of chtxn installed. The launcher ships a packed virtualenv with the project
  and its runtime dependencies (:mod:`cli.packaging`, built once and cached by content) as
  ``--archives <pack>.tar.gz#environment``, and the executors run ``./environment/bin/python``.
  The driver runs here (client mode) with this Python, unless ``spark.submit.deployMode=cluster``.

Everything is in the command line (``--dry-run`` prints it): no ``PYSPARK_*`` variable is set.
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
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from cli.config_option import add_config_option
from cli.packaging import ARCHIVE_ALIAS, EXECUTOR_PYTHON, default_cache_dir, ensure_archive, project_sources
from procs import signal_group, start_watchdog
from protocol.config import PipelineConfig, load_config
from protocol.errors import SetupError

#: Attempts per task in local mode (``local[N,F]``): a failed participant task is retried.
LOCAL_TASK_ATTEMPTS = 4
#: After the launcher died: how long spark-submit's group has between SIGTERM and SIGKILL.
OWNER_GONE_GRACE_S = 5.0
#: How long ``check_spark_master`` waits for a ``spark://`` master to accept a connection.
MASTER_CONNECT_TIMEOUT_S = 5.0


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
        "(building the archive if needed) without running it.",
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
    cfg = load_config(args.config, os.environ)
    master = args.master or default_master(cfg)
    archive, built = None, False
    if master.startswith("spark://") and not (args.dry_run or args.json):  # a dry run may name any master
        check_spark_master(master)
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

    def forward(signum: int, _frame: object) -> None:
        signal_group(process.pid, signal.SIGTERM)

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


def check_spark_master(master: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """Raise ``SetupError`` unless some ``host:port`` of the ``spark://`` URL accepts a connection,
    so that a wrong ``--master`` is one line here rather than the Spark driver's traceback."""
    reasons = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host or address, int(port or 7077)), timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            reasons.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    raise SetupError(
        f"cannot reach the Spark master at {master} within {timeout_s:g} s ({'; '.join(reasons)}): "
        "check --master and that the master is running"
    )


def _progress(line: str) -> None:
    print(f"chtxn participant: {line}", file=sys.stderr, flush=True)


def default_master(cfg: PipelineConfig) -> str:
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
        partitions = partitions_of(admin(cfg), cfg.pipeline.topics, bootstrap=cfg.kafka.bootstrap_servers)
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
