"""The embedded ClickHouse endpoint as a process of its own, for the tests that drive it over HTTP."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from embedded.clickhouse_server import wait_ready
from tests.helpers import REPO


@contextmanager
def running_endpoint(data_dir: Path, *extra: str) -> Iterator[int]:
    """Run the endpoint as a subprocess on a free port; yield the port; stop it with SIGTERM and
    check that it exits cleanly."""
    log = open(data_dir.parent / f"{data_dir.name}.stderr", "ab")  # noqa: SIM115 -- closed below
    cmd = [sys.executable, "-m", "embedded.clickhouse_server", "--data-dir", str(data_dir), "--port", "0", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("listening on http://127.0.0.1:"), f"endpoint did not start: {line!r}, see {log.name}"
        port = int(line.rsplit(":", 1)[1])
        wait_ready(f"http://127.0.0.1:{port}", timeout_s=30)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        log.close()
    assert code == 0, f"endpoint exited with {code}, see {log.name}"
