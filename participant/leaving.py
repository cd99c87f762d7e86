"""The participant job's clean stop: its driver tells its tasks to leave (participant step 6).

On SIGTERM the driver (``participant.job``) sends ``Leave(job)`` on the control topic. Each task
of the job reads it there, heartbeats ``leaving`` (so the leader ends the open txn at once and
names it in no START), finishes its part of the txns it is in (stages what it read, sends
WRITE-STATUS) and returns. The driver waits for its tasks at most
``transaction.write_status_timeout_s`` (the leader gives an ended txn no longer), then cancels
the job anyway. So with no leader, or with one that never ends the txn, the tasks are killed as
before a LEAVE existed: the txn aborts, or is an orphan of the next leader's take-over.

The driver alone must get the signal: SIGTERM to spark-submit's whole process group kills the JVM
and the tasks' Python workers at once. ``driver_pid`` finds the driver under spark-submit, for a
launcher that wants to stop the job cleanly (signal it, wait, then the group).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

from clients.kafka import KafkaClientFactory
from protocol import codec
from protocol.config.parse import PipelineConfig
from protocol.messages import Leave

log = logging.getLogger("chtxn.participant.job")

#: How long the driver waits for the broker to take the LEAVE.
SEND_TIMEOUT_S = 10.0


def job_id() -> str:
    """This driver's id, given to its tasks: ``<host>-<pid>-<start time>``, unique per driver run."""
    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"


def leave(cfg: PipelineConfig, job: str, tasks_done: threading.Event) -> bool:
    """Tell the tasks of ``job`` to leave and wait until ``tasks_done`` is set, at most
    ``transaction.write_status_timeout_s``. True when they are gone (nothing to cancel); False
    when the caller must cancel them (the LEAVE could not be sent, or they did not finish in time)."""
    if tasks_done.is_set():
        return True  # the job ended first (a failure, or Spark stopped with it): nobody to tell
    message = Leave(pipeline=cfg.name, epoch=0, txn="", sender=job, job=job)
    try:
        producer = KafkaClientFactory(cfg).producer(**{"client.id": f"chtxn-participant-job-{job}", "linger.ms": 0})
        producer.produce(cfg.control_topic, key=cfg.name.encode(), value=codec.encode(message))
        undelivered = producer.flush(SEND_TIMEOUT_S)
    except Exception as exc:  # the broker away, a bad property: the tasks are cancelled as before
        log.warning("cannot tell the participant tasks to leave (%s); cancelling them", exc)
        return False
    if undelivered:
        log.warning(
            "cannot tell the participant tasks to leave: control topic %s did not take the message within %g s; "
            "cancelling them",
            cfg.control_topic,
            SEND_TIMEOUT_S,
        )
        return False
    wait_s = cfg.transaction.write_status_timeout_s
    log.warning("stopping: the participant tasks finish their part of the open txn (at most %g s)", wait_s)
    if tasks_done.wait(wait_s):
        log.warning("the participant tasks are done")
        return True
    log.warning(
        "the participant tasks did not finish within %g s (no leader ending their txn?); cancelling them", wait_s
    )
    return False


def driver_pid(spark_submit: int) -> int | None:
    """The pid of the job's Python driver (running ``participant/job.py``) among the descendants of
    ``spark_submit``, or None while it is not running. Local and client deploy modes only: in
    cluster mode the driver runs elsewhere."""
    table = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=False)
    children: dict[int, list[tuple[int, str]]] = {}
    for line in table.stdout.splitlines():
        pid, ppid, *command = line.split(None, 2)
        children.setdefault(int(ppid), []).append((int(pid), command[0] if command else ""))
    todo = [spark_submit]
    while todo:
        for child, args in children.get(todo.pop(), []):
            if "participant/job.py" in args and Path(args.split()[0]).name.startswith("python"):
                return child
            todo.append(child)
    return None
