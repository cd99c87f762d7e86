"""``chtxn participant``: run the participant Spark job through pyspark's own ``spark-submit``.

Packages ``protocol/``, ``participant/`` and ``clients/`` into a zip for ``--py-files`` (so
executors on other machines can import them), makes the driver and executors use this Python
(``PYSPARK_PYTHON``), and runs ``spark-submit participant/job.py --config F`` in a process group
of its own. SIGTERM and Ctrl-C are passed to that group; the exit code is spark-submit's.

The job dies with the launcher: when the launcher dies, however it dies (SIGKILL included), a
watchdog process (:mod:`procs`) terminates spark-submit's group (the JVM and the Python driver),
SIGKILL after ``OWNER_GONE_GRACE_S``; PySpark's daemon and its workers exit when the JVM does. So
a supervisor that restarts the launcher never runs two copies of the participants for longer
than that grace.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from procs import signal_group, start_watchdog
from protocol.config import PipelineConfig, load_config
from protocol.errors import SetupError

#: Packages the executors import.
SHIPPED_PACKAGES = ("protocol", "participant", "clients")
#: Attempts per task in local mode (``local[N,F]``): a failed participant task is retried.
LOCAL_TASK_ATTEMPTS = 4
#: After the launcher died: how long spark-submit's group has between SIGTERM and SIGKILL.
OWNER_GONE_GRACE_S = 5.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "participant",
        help="run the participant Spark job (spark-submit participant/job.py)",
        description="Run the participants of a pipeline as a Spark job: one long-running task per group of "
        "source partitions, every task running at once. Without --master, runs Spark in local mode with one "
        "slot per partition (at most 2 per core) and task retries.",
        epilog="Example: chtxn participant --config pipeline.toml --master spark://host:7077",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="pipeline TOML file")
    parser.add_argument("--master", default=None, help="Spark master URL (default: local[<tasks>,4])")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark property (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the spark-submit command instead of running it")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    master = args.master or default_master(cfg)
    command = spark_submit_command(cfg, config_path=args.config, master=master, extra_conf=args.conf,
                                   log_level=getattr(args, "log_level", "WARNING"))
    if args.dry_run:
        print(shlex.join(command))
        return 0
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    process = subprocess.Popen(command, env=env, start_new_session=True)
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


def default_master(cfg: PipelineConfig) -> str:
    """``local[N,4]``: N slots for N tasks, one per partition, at most two per core."""
    from clients.kafka import admin, partitions_of

    if cfg.participant.task_slots:
        tasks = cfg.participant.task_slots
    else:
        partitions = partitions_of(admin(cfg), cfg.pipeline.topics, bootstrap=cfg.kafka.bootstrap_servers)
        tasks = max(1, min(len(partitions), 2 * (os.cpu_count() or 1)))
    return f"local[{tasks},{LOCAL_TASK_ATTEMPTS}]"


def spark_submit_command(
    cfg: PipelineConfig, *, config_path: str, master: str, extra_conf: Sequence[str] = (), log_level: str = "WARNING",
) -> list[str]:
    """The spark-submit command line that runs ``participant/job.py`` for ``cfg``."""
    import participant.job

    command = [
        str(spark_submit()), "--master", master, "--name", f"chtxn-participant-{cfg.name}",
        "--py-files", str(py_files_zip()),
        "--conf", "spark.speculation=false",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", f"spark.pyspark.python={sys.executable}",
    ]
    for item in extra_conf:
        if "=" not in item:
            raise SetupError(f"--conf {item!r}: expected KEY=VALUE, e.g. --conf spark.executor.memory=2g")
        command += ["--conf", item]
    return command + [str(Path(participant.job.__file__).resolve()), "--config", str(Path(config_path).resolve()),
                      "--log-level", log_level]


def spark_submit() -> Path:
    """pyspark's own ``bin/spark-submit``."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    if not path.is_file():
        raise SetupError(f"pyspark has no spark-submit at {path}: reinstall pyspark (pip install 'pyspark>=4.0')")
    return path


def py_files_zip() -> Path:
    """A zip of the shipped packages, named by content hash so repeated runs reuse it."""
    import clients
    import participant
    import protocol

    roots = [Path(m.__file__).parent for m in (protocol, participant, clients)]  # type: ignore[arg-type]
    files = {  # name in the zip -> file
        str(f.relative_to(root.parent)): f for root in roots for f in sorted(root.rglob("*.py")) if "__pycache__" not in f.parts
    }
    digest = hashlib.sha256()
    for name, f in files.items():
        digest.update(name.encode() + b"\0" + f.read_bytes())
    target = Path(tempfile.gettempdir()) / f"chtxn-pyfiles-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, f in files.items():
                archive.write(f, name)
        partial.replace(target)
    return target
