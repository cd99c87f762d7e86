"""The embedded keeper's ZooKeeper: Debian's packages, unpacked under the venv, and its classpath.

``make install`` runs ``python -m embedded.keeper_jars install .venv/keeper``: ``apt-get download``
fetches :data:`PACKAGES` from Debian's archive into ``.venv/keeper/debs`` and ``dpkg-deb -x`` unpacks
them into ``.venv/keeper/root``. Nothing is installed on the system and no root is needed: when the
system's package lists cannot serve the download (missing or stale, and refreshing them needs root),
it is retried once with package lists of its own under ``.venv/keeper/apt`` (``apt-get update``
into that directory needs no root either).

Guarantees: :func:`find` returns a classpath only when every jar in :data:`JARS` exists; otherwise
it raises :class:`~protocol.errors.SetupError` saying how to install them. A system install
(``apt-get install libzookeeper-java libsnappy-jni``, jars in ``/usr/share/java``) is used when the
venv holds none.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from embedded import debian_packages
from protocol.errors import SetupError

#: What the standalone server needs from Debian 12 (bookworm). The server also runs without the
#: other dependencies ``apt-cache depends libzookeeper-java`` lists: netty (only for
#: ``serverCnxnFactory=NettyServerCnxnFactory``), jetty and jackson (the admin server, turned off),
#: log4j and logback (slf4j-simple logs instead), guava, junit.
PACKAGES = (
    "libzookeeper-java",
    "libslf4j-java",
    "libcommons-io-java",
    "libcommons-cli-java",
    "libdropwizard-metrics-java",
    "libsnappy-java",
    "libsnappy-jni",
)

#: The classpath, in order. Without metrics-core the server exits at start (NoClassDefFoundError);
#: without snappy-java it cannot take its first snapshot and stops serving.
JARS = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "metrics-core.jar",
    "snappy-java.jar",
    "commons-cli.jar",
    "commons-io.jar",
    "slf4j-api.jar",
    "slf4j-simple.jar",
)

SYSTEM_ROOT = Path("/")
_JAVA_DIR = Path("usr/share/java")
_INSTALL_BY_HAND = (
    "install them by hand with `sudo apt-get install libzookeeper-java libsnappy-jni` "
    "(the embedded keeper then uses /usr/share/java)"
)


@dataclass(frozen=True)
class KeeperJars:
    """Where the jars are: ``classpath`` for ``java -cp``, ``library_path`` for the JNI library
    snappy-java loads when snapshot compression is turned on (None when there is none)."""

    classpath: tuple[Path, ...]
    library_path: Path | None

    @property
    def version(self) -> str:
        """ZooKeeper's version from its versioned jar beside ``zookeeper.jar`` ("3.8.0"), or ""."""
        found = sorted(self.classpath[0].parent.glob("zookeeper-[0-9]*.jar"))
        return found[0].name.removeprefix("zookeeper-").removesuffix(".jar") if found else ""


def default_dir() -> Path:
    """``<venv>/keeper``, where ``make install`` unpacks the packages."""
    return Path(sys.prefix) / "keeper"


def find(directory: Path | None = None) -> KeeperJars:
    """The jars unpacked in ``directory`` (default :func:`default_dir`), else the system's. Raises
    SetupError when neither holds all of :data:`JARS`."""
    directory = default_dir() if directory is None else directory
    for root in (directory / "root", SYSTEM_ROOT):
        jars = _jars_under(root)
        if jars is not None:
            return jars
    missing = [jar for jar in JARS if not (directory / "root" / _JAVA_DIR / jar).exists()]
    raise SetupError(
        f"the embedded keeper needs ZooKeeper's jars, and {directory / 'root' / _JAVA_DIR} lacks "
        f"{', '.join(missing)}: run `make install` (it unpacks Debian's packages there), or {_INSTALL_BY_HAND}"
    )


def _jars_under(root: Path) -> KeeperJars | None:
    java = root / _JAVA_DIR
    if not all((java / jar).exists() for jar in JARS):
        return None
    jni = sorted((root / "usr" / "lib").glob("*/jni/libsnappyjava.so"))
    return KeeperJars(tuple(java / jar for jar in JARS), jni[0].parent if jni else None)


def install(directory: Path) -> KeeperJars:
    """Download :data:`PACKAGES` into ``directory/debs`` and unpack them into ``directory/root``
    (replacing what an earlier install unpacked). When the download fails and the system holds the
    jars, uses those; otherwise raises SetupError saying what to install by hand."""
    try:
        staging = debian_packages.fetch(PACKAGES, directory, what="the embedded keeper's ZooKeeper jars")
    except SetupError as exc:
        system = _jars_under(SYSTEM_ROOT)
        if system is None:
            raise SetupError(f"{exc}\nTo fix it, {_INSTALL_BY_HAND}; or fix apt and run `make install` again") from None
        print(f"{exc}\nUsing the system's ZooKeeper in /usr/share/java instead", file=sys.stderr)
        return system
    shutil.rmtree(directory / "root", ignore_errors=True)
    staging.rename(directory / "root")
    return find(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedded.keeper_jars", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_cmd = commands.add_parser("install", help="download and unpack the packages into DIR")
    install_cmd.add_argument("dir", type=Path, nargs="?", default=None, help="default: <venv>/keeper")
    commands.add_parser("classpath", help="print the classpath in use")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            directory = (args.dir or default_dir()).resolve()
            jars = install(directory)
            print(
                f"ZooKeeper {jars.version or '(unknown version)'} for the embedded keeper, from Debian's packages, "
                f"unpacked in {directory / 'root'}"
            )
        else:
            print(":".join(str(jar) for jar in find().classpath))
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
