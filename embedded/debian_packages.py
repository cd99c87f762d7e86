"""Debian packages fetched without root: ``apt-get download`` into a directory, then ``dpkg-deb -x``.

What ``make install`` uses for the embedded keeper's ZooKeeper (``embedded.keeper_jars``) and for the
test tools promtool and docker-compose (``tools.debian_tools``). Nothing is installed system-wide.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from protocol.errors import SetupError


def fetch(packages: Sequence[str], directory: Path, *, what: str, hint: str = "") -> Path:
    """Download ``packages`` into ``directory/debs`` and unpack them into a fresh ``directory/root.tmp``;
    returns that directory. ``what`` names them in errors (``the Debian packages of ...``), ``hint``
    is appended to them. Raises SetupError when apt-get or dpkg-deb is missing or fails."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise SetupError(f"`{tool}` is missing: {what} come from Debian's packages" + (f"; {hint}" if hint else ""))
    debs = directory / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    _download(packages, debs, directory / "apt", what=what, hint=hint)
    staging = directory / "root.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    for deb in sorted(debs.glob("*.deb")):
        run(["dpkg-deb", "-x", str(deb), str(staging)], f"dpkg-deb could not unpack {deb.name}")
    return staging


def _download(packages: Sequence[str], debs: Path, apt_dir: Path, *, what: str, hint: str) -> None:
    """``apt-get download`` with the system's package lists, else with lists of our own."""
    first = subprocess.run(["apt-get", "-q", "download", *packages], cwd=debs, capture_output=True, text=True)
    if first.returncode == 0:
        return
    print("apt-get download failed with the system's package lists; retrying with lists of our own", file=sys.stderr)
    lists, cache = apt_dir / "lists", apt_dir / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    own = ["-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}"]
    why = f"apt-get update into {apt_dir} failed"
    second = subprocess.run(["apt-get", "-q", *own, "update"], capture_output=True, text=True)
    if second.returncode == 0:
        why = "apt-get download failed again"
        second = subprocess.run(
            ["apt-get", "-q", *own, "download", *packages], cwd=debs, capture_output=True, text=True
        )
        if second.returncode == 0:
            return
    raise SetupError(
        f"cannot download the Debian packages of {what}: apt-get download failed with the system's package "
        f"lists:\n{tail(first)}\nthen, with lists of our own, {why}:\n{tail(second)}" + (f"\n{hint}" if hint else "")
    )


def run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise SetupError(f"{what}:\n{tail(result)}")


def tail(result: subprocess.CompletedProcess[str], lines: int = 6) -> str:
    text = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.returncode}").splitlines()
    return "\n".join("  " + line for line in text[-lines:])
