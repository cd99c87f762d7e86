"""The package layering: roles never import each other, the CLI sits above them all.

Every module's imports (lazy ones inside functions included) are read with ``ast``, without
importing anything.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[2]

#: First-party package -> the first-party packages it may import (itself included).
SHARED = {"protocol", "clients", "procs"}
ALLOWED: dict[str, set[str]] = {
    "protocol": {"protocol"},
    "procs": {"procs"},  # standard library only: its watchdog must start fast
    "clients": {"protocol", "clients"},
    "coordinator": SHARED | {"coordinator"},
    "participant": SHARED | {"participant"},
    "embedded": SHARED | {"embedded"},
}
ALLOWED["cli"] = set(ALLOWED) | {"cli"}
#: Client libraries the pure contract must not import.
NOT_IN_PROTOCOL = {"confluent_kafka", "clickhouse_connect", "pyspark"}


def imported_packages(source: str, filename: str = "<source>") -> set[str]:
    """The top-level names of every absolute import in ``source``; relative imports are skipped."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def modules_of(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def violations() -> list[str]:
    found = []
    for package, allowed in ALLOWED.items():
        for path in modules_of(package):
            imported = imported_packages(path.read_text(), str(path))
            for name in sorted((imported & set(ALLOWED)) - allowed):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


def test_the_checker_sees_every_kind_of_import() -> None:
    source = "import a.b\nfrom c.d import e\nfrom . import f\ndef g():\n    import h\n    from i import j\n"
    assert imported_packages(source) == {"a", "c", "h", "i"}


def test_every_first_party_package_is_checked() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages == set(ALLOWED)
    assert all(modules_of(package) for package in ALLOWED)


def test_no_role_imports_another_role_or_the_cli() -> None:
    assert violations() == []


def test_the_protocol_imports_no_client_library() -> None:
    imported = set().union(*(imported_packages(p.read_text(), str(p)) for p in modules_of("protocol")))
    assert imported & NOT_IN_PROTOCOL == set()


def test_procs_imports_only_the_standard_library() -> None:
    imported = set().union(*(imported_packages(p.read_text(), str(p)) for p in modules_of("procs")))
    assert imported - set(sys.stdlib_module_names) == {"procs"}


def test_the_installed_command_and_packages_match_the_layout() -> None:
    project = msgspec.toml.decode((ROOT / "pyproject.toml").read_bytes())
    module, _, attr = project["project"]["scripts"]["chtxn"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(include) == sorted(f"{package}*" for package in ALLOWED)
