"""A coordinator that SIGKILLs itself at a chosen step: ``python -m tests.integration.crashing_coordinator CONFIG STEP``.

STEP is ``after-commit`` (the COMMITTED row is in the ledger, nothing published yet).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from coordinator.leader import Leader
from coordinator.logs import setup_logging
from coordinator.service import CoordinatorService
from protocol.config.parse import load_config
from protocol.coordinator.events import Commit, CommitResult


class CrashAfterCommit(Leader):
    def _commit(self, action: Commit) -> CommitResult:
        result = super()._commit(action)
        if result.won:
            print(f"crashing after commit of {action.txn.id}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return result


STEPS = {"after-commit": CrashAfterCommit}

if __name__ == "__main__":
    setup_logging("WARNING")
    config, step = sys.argv[1], sys.argv[2]
    CoordinatorService(load_config(config, os.environ), leader_class=STEPS[step]).run(threading.Event())
