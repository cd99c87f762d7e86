"""Checkers for the files in deploy/ and docker-compose.yml, from Debian's packages: ``promtool``
(package ``prometheus``) and ``docker-compose`` (Compose 1.29, Python). Only the tests use them.

``make install`` runs ``python -m tools.debian_tools install .venv/debian-tools``: ``apt-get download``
fetches :data:`PACKAGES` (about 20 MB) into ``debs/``, ``dpkg-deb -x`` unpacks them into a staging
directory, and what the checks need is kept: ``bin/promtool`` (a Go binary, about 48 MB; the
Prometheus server and its web assets are dropped) and ``compose/`` (``docker-compose`` and the
Python packages it imports, about 5 MB) with ``bin/docker-compose``, which runs it on Debian's
Python with its packages on the path, so it runs as it is. Nothing is installed on the system and no root is needed:
when the system's package lists cannot serve the download, it is retried once with package lists
of our own under ``apt/``, as ``embedded.keeper_jars`` does for ZooKeeper.

``docker-compose config`` parses, validates and resolves a compose file without a Docker engine.
It runs on Debian's ``/usr/bin/python3``, the interpreter its packages are built for.

Guarantees: :func:`promtool` and :func:`docker_compose` return a command that exists, else raise
:class:`~protocol.errors.SetupError` saying how to get it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from embedded import debian_packages
from protocol.errors import SetupError

#: ``prometheus`` for promtool; ``docker-compose`` and the Python packages it imports, less those
#: of Python's own standard library (Debian 12).
PACKAGES = (
    "prometheus",
    "docker-compose",
    "python3-docker",
    "python3-dockerpty",
    "python3-docopt",
    "python3-dotenv",
    "python3-jsonschema",
    "python3-attr",
    "python3-pyrsistent",
    "python3-texttable",
    "python3-websocket",
    "python3-requests",
    "python3-urllib3",
    "python3-idna",
    "python3-certifi",
    "python3-chardet",
    "python3-charset-normalizer",
    "python3-cached-property",
    "python3-distro",
    "python3-packaging",
    "python3-six",
    "python3-yaml",
)
DEBIAN_PYTHON = Path("/usr/bin/python3")
_BY_HAND = "or install them on the system (Debian: apt-get install prometheus docker-compose)"


def default_dir() -> Path:
    """``<venv>/debian-tools``, where ``make install`` puts them."""
    return Path(sys.prefix) / "debian-tools"


def promtool(directory: Path | None = None) -> Path:
    """``directory/bin/promtool`` (default :func:`default_dir`), else ``promtool`` on PATH."""
    binary = (default_dir() if directory is None else directory) / "bin" / "promtool"
    found = binary if binary.is_file() else shutil.which("promtool")
    if found is None:
        raise SetupError(f"promtool is not in {binary.parent} nor on PATH: run `make install`, {_BY_HAND}")
    return Path(found)


def docker_compose(directory: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv prefix and environment that run ``docker-compose``: the venv's copy
    (``bin/docker-compose``, which runs it on Debian's Python), else ``docker-compose`` on PATH."""
    tools = default_dir() if directory is None else directory
    script = tools / "compose" / "usr" / "bin" / "docker-compose"
    wrapper = tools / "bin" / "docker-compose"
    if wrapper.is_file() and script.is_file() and DEBIAN_PYTHON.is_file():
        return [str(wrapper)], dict(os.environ)
    on_path = shutil.which("docker-compose")
    if on_path is not None:
        return [on_path], dict(os.environ)
    raise SetupError(
        f"docker-compose is not in {script.parent} (run on {DEBIAN_PYTHON}) nor on PATH: run `make install`, {_BY_HAND}"
    )


def install(directory: Path) -> None:
    """Download :data:`PACKAGES` and keep promtool in ``directory/bin``, Compose in ``directory/compose``."""
    staging = debian_packages.fetch(PACKAGES, directory, what="promtool and docker-compose", hint=_BY_HAND)
    binary = staging / "usr" / "bin" / "promtool"
    if not binary.is_file():
        raise SetupError(f"Debian's prometheus package holds no usr/bin/promtool; {_BY_HAND}")
    (directory / "bin").mkdir(exist_ok=True)
    binary.replace(directory / "bin" / "promtool")
    (staging / "usr" / "bin" / "prometheus").unlink(missing_ok=True)
    shutil.rmtree(staging / "usr" / "share", ignore_errors=True)  # docs and the server's web assets
    shutil.rmtree(directory / "compose", ignore_errors=True)
    staging.rename(directory / "compose")
    shutil.rmtree(directory / "debs")
    wrapper = directory / "bin" / "docker-compose"
    wrapper.write_text(COMPOSE_WRAPPER)
    wrapper.chmod(0o755)


#: ``bin/docker-compose``: Compose from ``compose/`` on Debian's Python, runnable as it is.
COMPOSE_WRAPPER = f"""#!/bin/sh
# docker-compose 1.29 from Debian's package, on Debian's Python (tools/debian_tools.py)
here="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$here/compose/usr/lib/python3/dist-packages${{PYTHONPATH:+:$PYTHONPATH}}" \\
  exec {DEBIAN_PYTHON} "$here/compose/usr/bin/docker-compose" "$@"
"""


def _first_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    return (result.stdout or result.stderr).strip().split("\n")[0] or f"exit code {result.returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.debian_tools", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_cmd = commands.add_parser("install", help="download the packages and keep the tools in DIR")
    install_cmd.add_argument("dir", type=Path, nargs="?", default=None, help="default: <venv>/debian-tools")
    commands.add_parser("which", help="print the promtool and docker-compose in use, with their versions")
    args = parser.parse_args(argv)
    try:
        directory = (args.dir or default_dir()).resolve() if args.command == "install" else None
        if directory is not None:
            install(directory)
        compose, env = docker_compose(directory)
        print(f"{promtool(directory)}: {_first_line([str(promtool(directory)), '--version'])}")
        print(f"{' '.join(compose)}: {_first_line([*compose, 'version', '--short'], env)}")
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
