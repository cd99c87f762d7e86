"""The executors' Python environment: a packed virtualenv for ``--archives <pack>.tar.gz#environment``.

PySpark's documented way to ship Python dependencies to a cluster: spark-submit gets
``--archives <pack>.tar.gz#environment`` and ``spark.pyspark.python=./environment/bin/python``, and
every executor unpacks the archive into its working directory and runs its Python workers with it.
So cluster nodes need Spark and a CPython of the launcher's minor version, and nothing of chtxn.

What goes in: the participants' runtime dependencies (:data:`EXECUTOR_REQUIREMENTS` and what they
require, at the versions installed next to the launcher) and the project packages the executors
import (:data:`SHIPPED_PACKAGES`). Not pyspark (Spark puts its own ``pyspark.zip`` on the workers'
path), not chDB, not the test dependencies.

How it is built, offline: a bare ``venv`` (no pip), the installed files of each distribution copied
from the launcher's environment as their ``RECORD`` lists them (bytecode left out), the project
sources copied beside them, then ``venv-pack`` writes the tar.gz. No package index is contacted,
and the executors run exactly the versions the launcher runs. The archive is for the launcher's
platform (its wheels hold compiled extensions): build it on the OS and architecture of the nodes.

The environment's ``bin/python`` is a symlink to an interpreter outside the archive, as in every
venv: the launcher's base interpreter by default, or ``python`` given to :func:`ensure_archive`
(``chtxn participant --executor-python``) when the nodes keep theirs elsewhere. The link is set
here, before packing, not by venv-pack's ``python_prefix``: venv-pack 0.2.0 rewrites a venv's
``python3.11`` link into ``<prefix>/bin/python3.113.11``.

Archives are cached by content: the name holds a hash of the shipped sources, the distribution
set (names, versions and the RECORD of their files), the interpreter path and :data:`FORMAT`, so
an unchanged project reuses its archive and a change of any of those builds a new one. Builds
write to a temporary name and rename, so concurrent launchers never see half an archive. Old
archives are never deleted: they are about 15 MB each.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
import venv
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import SetupError

#: The distributions the participants import on executors; what they require comes along.
EXECUTOR_REQUIREMENTS = ("confluent-kafka", "clickhouse-connect", "msgspec", "tenacity", "lz4", "zstandard")
#: The project's packages the executors import.
SHIPPED_PACKAGES = ("protocol", "participant", "clients")
#: The directory each executor unpacks the archive into (the ``#environment`` of ``--archives``).
ARCHIVE_ALIAS = "environment"
#: The executors' interpreter, relative to their working directory.
EXECUTOR_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
#: Bump when what a build puts in the archive changes, so cached archives are rebuilt.
FORMAT = 1

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EnvironmentSpec:
    """Everything an archive is built from; :meth:`digest` names it in the cache."""

    distributions: tuple[tuple[str, str, str], ...]  # (name, version, hash of its RECORD), sorted
    sources: tuple[tuple[str, Path], ...]  # (path inside site-packages, file), sorted
    python: str  # the interpreter bin/python links to on the executors

    def digest(self) -> str:
        h = hashlib.sha256(f"chtxn-executor-env {FORMAT}\n{self.python}\n{_python_tag()}\n".encode())
        for name, version, record in self.distributions:
            h.update(f"dist {name}=={version} {record}\n".encode())
        for name, path in self.sources:
            h.update(f"src {name}\n".encode() + path.read_bytes() + b"\0")
        return h.hexdigest()[:16]


def project_sources() -> tuple[tuple[str, Path], ...]:
    """The ``.py`` files of :data:`SHIPPED_PACKAGES`, as (path relative to the package root, file)."""
    root = Path(__file__).resolve().parents[1]  # the checkout or site-packages holding the packages
    found = []
    for package in SHIPPED_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found.append((path.relative_to(root).as_posix(), path))
    return tuple(found)


def distribution_closure(requirements: Iterable[str] = EXECUTOR_REQUIREMENTS) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``requirements`` name and, recursively, those they require
    (environment markers evaluated for this interpreter, extras not followed), sorted by name."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    pending = list(requirements)
    while pending:
        name = pending.pop()
        key = _normalize(name)
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise SetupError(
                f"{name} is not installed next to the launcher ({sys.executable}), so it cannot be shipped to the "
                "executors: install chtxn with its dependencies (pip install -e .) and try again"
            ) from None
        found[key] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)
    return [found[k] for k in sorted(found)]


def executor_spec(python: str | None = None) -> EnvironmentSpec:
    """The spec for this launcher; ``python`` is the executors' interpreter (default: ours, resolved)."""
    dists = tuple((_normalize(d.metadata["Name"]), d.version, _record_hash(d)) for d in distribution_closure())
    return EnvironmentSpec(distributions=dists, sources=project_sources(), python=python or base_python())


def base_python() -> str:
    """The interpreter this launcher's venv (if any) is based on, symlinks resolved."""
    return str(Path(getattr(sys, "_base_executable", None) or sys.executable).resolve())


def default_cache_dir(environ: dict[str, str] | os._Environ[str]) -> Path:
    """``$CHTXN_CACHE_DIR``, else ``$XDG_CACHE_HOME/chtxn``, else ``~/.cache/chtxn``."""
    if environ.get("CHTXN_CACHE_DIR"):
        return Path(environ["CHTXN_CACHE_DIR"])
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "chtxn"


def archive_path(spec: EnvironmentSpec, cache_dir: Path) -> Path:
    return cache_dir / f"chtxn-executor-env-{spec.digest()}.tar.gz"


def ensure_archive(
    cache_dir: Path, *, python: str | None = None, progress: Progress | None = None
) -> tuple[Path, bool]:
    """The archive for this launcher in ``cache_dir``, built when missing: ``(path, built now)``."""
    spec = executor_spec(python)
    target = archive_path(spec, cache_dir)
    if target.is_file():
        return target, False
    build(spec, target, progress or (lambda _: None))
    return target, True


def build(spec: EnvironmentSpec, target: Path, progress: Progress) -> None:
    """Build the archive of ``spec`` at ``target`` (atomically: a temporary name, then a rename)."""
    import venv_pack

    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(
        f"building the executors' Python environment ({len(spec.distributions)} distributions, "
        f"{len(spec.sources)} project files) into {target}"
    )
    with tempfile.TemporaryDirectory(prefix="chtxn-env-", dir=target.parent) as scratch:
        prefix = Path(scratch) / "env"
        venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
        _link_python(prefix, spec.python)
        site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        for i, (name, version, _) in enumerate(spec.distributions, 1):
            copied = _copy_distribution(importlib.metadata.distribution(name), site)
            progress(f"  [{i}/{len(spec.distributions)}] {name} {version}: {copied / 1e6:.1f} MB")
        for name, path in spec.sources:
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, site / name)
        progress(f"  project packages: {', '.join(SHIPPED_PACKAGES)}; packing with venv-pack")
        partial = Path(scratch) / target.name
        verbose = sys.stderr.isatty()  # venv-pack's progress bar, on stderr: stdout may be --json
        with contextlib.redirect_stdout(sys.stderr):
            venv_pack.pack(prefix=str(prefix), output=str(partial), format="tar.gz", verbose=verbose, force=True)
        partial.chmod(0o644)
        partial.replace(target)
    progress(f"built {target.name}: {target.stat().st_size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")


def _link_python(prefix: Path, python: str) -> None:
    """Point the venv's interpreter symlink and ``pyvenv.cfg`` at ``python``, the executors' interpreter."""
    versioned = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    versioned.unlink(missing_ok=True)
    versioned.symlink_to(python)
    for alias in ("python", "python3"):
        link = prefix / "bin" / alias
        link.unlink(missing_ok=True)
        link.symlink_to(versioned.name)
    cfg = prefix / "pyvenv.cfg"
    lines = [line for line in cfg.read_text().splitlines() if not re.match(r"(home|executable|command)\s*=", line)]
    cfg.write_text("\n".join([f"home = {Path(python).parent}", *lines, f"executable = {python}"]) + "\n")


def _copy_distribution(dist: importlib.metadata.Distribution, site: Path) -> int:
    """Copy the installed files of ``dist`` that live in site-packages, bytecode left out; bytes copied."""
    if dist.files is None:
        raise SetupError(
            f"{dist.metadata['Name']} has no RECORD of its files, so it cannot be shipped to the "
            "executors: reinstall it with pip"
        )
    copied = 0
    for file in dist.files:
        if file.parts[0] == ".." or "__pycache__" in file.parts or file.suffix == ".pyc":
            continue  # scripts in bin/, and bytecode the executors compile themselves
        source = Path(dist.locate_file(file))  # type: ignore[arg-type]  # a Path here; typeshed says SimplePath
        if not source.is_file():
            continue
        destination = site / file
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
        copied += destination.stat().st_size
    return copied


def _record_hash(dist: importlib.metadata.Distribution) -> str:
    """A hash of the distribution's RECORD (every installed file with its sha256): a reinstall that
    changed a file of the same version changes it."""
    return hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest()[:16]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _python_tag() -> str:
    return f"{sys.implementation.cache_tag} {sysconfig.get_platform()}"
