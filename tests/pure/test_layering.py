"""The package layering: roles never import each other, the CLI sits above them all; no import
circles, not even inside one folder; no module longer than ``tools.layout.MAX_LINES``.

Every module's imports (lazy ones inside functions included) are read with ``ast``, without
importing anything (``tools.layout``).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import msgspec

from tools import layout
from tools.layout import imported_packages

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
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks", "tools"}
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


def test_no_import_circles_even_inside_one_folder() -> None:
    assert layout.circles(layout.import_graph(layout.modules(ROOT))) == []


def test_the_circle_finder_sees_a_circle_through_a_relative_and_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from . import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (tmp_path / "pkg" / "c.py").write_text("from pkg import a\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.a\n")  # imports into the circle, is not in it
    known = layout.modules(tmp_path, among=["pkg"])
    assert layout.circles(layout.import_graph(known)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_module_is_longer_than_the_limit() -> None:
    lines = layout.lines_of(layout.modules(ROOT))
    over = {m: n for m, n in lines.items() if n > layout.MAX_LINES}
    assert over == {}, f"over {layout.MAX_LINES} lines: split them by concept"


def test_no_circles_between_the_packages_either() -> None:
    """A package (a folder) imports another only if that one does not import it back, through any path."""
    assert layout.circles(layout.package_graph(layout.modules(ROOT))) == []


def test_each_package_of_the_protocol_and_the_coordinator_says_what_it_owns_and_imports_only_that() -> None:
    known = layout.modules(ROOT, among=["protocol", "coordinator"])
    packages = sorted(m for m, path in known.items() if path.name == "__init__.py")
    assert len(packages) > 2, packages
    for package in packages:
        body = ast.parse(known[package].read_text()).body
        assert len(body) == 1 and ast.get_docstring(ast.Module(body=body, type_ignores=[])), (
            f"{package}/__init__.py: a docstring saying what it owns, and nothing else"
        )
        assert layout.declared_imports(package, layout.modules(ROOT)) is not None, f"{package}: no Imports: line"
    assert layout.undeclared_imports(layout.modules(ROOT)) == {}


def test_the_declared_imports_check_sees_an_import_the_docstring_leaves_out(tmp_path: Path) -> None:
    for folder, doc in [("pkg", "Imports: pkg.a.*"), ("pkg/a", "Imports: nothing"), ("pkg/b", "Imports: pkg.a")]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(f'"""Owns x.\n\n{doc}\n"""\n')
    (tmp_path / "pkg" / "a" / "x.py").write_text("from pkg.b import y\n")  # not declared
    (tmp_path / "pkg" / "b" / "y.py").write_text("from pkg.a import x\n")  # declared
    (tmp_path / "pkg" / "core.py").write_text("from pkg.a import x\n")  # declared with .*
    known = layout.modules(tmp_path, among=["pkg"])
    assert layout.undeclared_imports(known) == {"pkg.a": {"pkg.b"}}
    assert layout.circles(layout.package_graph(known)) == [["pkg.a", "pkg.b"]]
