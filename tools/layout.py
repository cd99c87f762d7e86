"""The project's layout, drawn from its own imports: packages, import circles, largest modules.

    python -m tools.layout            # packages, circles (none expected), the largest modules
    python -m tools.layout --json     # the same, for a script

Imports are read with ``ast``, without importing anything; lazy imports inside functions and
imports only for type checking count too (a circle through either is still a circle). A module is
a file; ``from package import name`` counts as importing ``package.name`` when that is a module.
A package is a folder; its ``__init__.py`` docstring may say what it may import (an ``Imports:``
line), and the survey lists what each package imports beyond that, and circles between packages.
``tests/pure/test_layering.py`` asserts on what this finds.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The house rule for a module's length (``tests/pure/test_layering.py``).
MAX_LINES = 350


def packages(root: Path = ROOT) -> list[str]:
    """The first-party top-level packages: folders with an ``__init__.py``, tests aside."""
    return sorted(p.parent.name for p in root.glob("*/__init__.py") if p.parent.name != "tests")


def modules(root: Path = ROOT, among: Iterable[str] | None = None) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages ``among`` (all by default)."""
    found = {}
    for package in among if among is not None else packages(root):
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_packages(source: str, filename: str = "<source>") -> set[str]:
    """The top-level names of every absolute import in ``source``; relative imports are skipped."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def imported_modules(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports, relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def import_graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Each module of ``known`` -> the modules of ``known`` it imports."""
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles: each set of modules that import one another, round and back (sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's strongly connected components, without recursion
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while (member := stack.pop()) != node:
                        component.append(member)
                    if component:
                        found.append(sorted([*component, node]))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def package_of(name: str, known: Mapping[str, Path]) -> str:
    """The package module ``name`` belongs to: itself for a package's ``__init__``, else its folder's."""
    return name if known[name].name == "__init__.py" else name.rsplit(".", 1)[0]


def package_graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Each package (a folder, sub-packages apart) -> the other packages its modules import. Importing
    a package's ``__init__`` alone does not count: ``from pkg import module`` names it on the way."""
    graph: dict[str, set[str]] = {package_of(name, known): set() for name in known}
    for name, imported in import_graph(known).items():
        for target in imported:
            if known[target].name != "__init__.py" and package_of(target, known) != package_of(name, known):
                graph[package_of(name, known)].add(package_of(target, known))
    return graph


def declared_imports(package: str, known: Mapping[str, Path]) -> set[str] | None:
    """What ``package``'s docstring says it may import (its ``Imports:`` line: packages, ``p.*`` for
    ``p`` and every package inside it), or None when it says nothing."""
    doc = ast.get_docstring(ast.parse(known[package].read_text())) or ""
    line = next((ln for ln in doc.splitlines() if ln.startswith("Imports:")), None)
    if line is None:
        return None
    return set(re.findall(r"[a-z_]+(?:\.[a-z_]+)*(?:\.\*)?", line.removeprefix("Imports:").split("(")[0]))


def undeclared_imports(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Each package whose docstring says what it may import -> the packages it imports beyond that."""
    found = {}
    for package, targets in package_graph(known).items():
        allowed = declared_imports(package, known)
        if allowed is None:
            continue
        beyond = {
            t
            for t in targets
            if t not in allowed and not any(a.endswith(".*") and (t + ".").startswith(a[:-1]) for a in allowed)
        }
        if beyond:
            found[package] = beyond
    return found


def lines_of(known: Mapping[str, Path]) -> dict[str, int]:
    """Each module's length in lines."""
    return {name: len(path.read_text().splitlines()) for name, path in known.items()}


def survey(root: Path = ROOT) -> dict:
    """Packages with their modules and lines, the import circles, and the modules over ``MAX_LINES``."""
    known = modules(root)
    lines = lines_of(known)
    by_package = {
        package: {
            "modules": sum(1 for m in known if m.split(".")[0] == package),
            "lines": sum(n for m, n in lines.items() if m.split(".")[0] == package),
        }
        for package in packages(root)
    }
    largest = max(lines, key=lambda m: lines[m])
    graph = package_graph(known)
    return {
        "packages": by_package,
        "sub_packages": {
            package: {
                "modules": sum(1 for m in known if package_of(m, known) == package and m != package),
                "imports": sorted(graph[package]),
            }
            for package in sorted(graph)
            if "." in package
        },
        "circles": circles(import_graph(known)),
        "package_circles": circles(graph),
        "undeclared_imports": {p: sorted(t) for p, t in sorted(undeclared_imports(known).items())},
        "largest": {"module": largest, "lines": lines[largest]},
        "over_limit": {m: n for m, n in sorted(lines.items(), key=lambda item: -item[1]) if n > MAX_LINES},
        "max_lines": MAX_LINES,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.layout",
        description="The project's packages, import circles and largest modules, from its own imports.",
        epilog="example: python -m tools.layout --json | jq .circles",
    )
    parser.add_argument("--json", action="store_true", help="print the survey as JSON")
    args = parser.parse_args(argv)
    found = survey()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print("package       modules  lines")
    for package, figures in found["packages"].items():
        print(f"{package:<12} {figures['modules']:>8} {figures['lines']:>6}")
    print("sub-package                 modules  imports (packages)")
    for package, figures in found["sub_packages"].items():
        print(f"{package:<28} {figures['modules']:>6}  {', '.join(figures['imports'])}")
    print(f"import circles: {len(found['circles'])}")
    for circle in found["circles"]:
        print("  " + " -> ".join([*circle, circle[0]]))
    print(f"circles between packages: {len(found['package_circles'])}")
    for circle in found["package_circles"]:
        print("  " + " -> ".join([*circle, circle[0]]))
    print(f"imports a package's docstring does not declare: {len(found['undeclared_imports'])}")
    for package, targets in found["undeclared_imports"].items():
        print(f"  {package} imports {', '.join(targets)}")
    print(f"largest module: {found['largest']['module']} ({found['largest']['lines']} lines)")
    print(f"modules over {MAX_LINES} lines: {len(found['over_limit'])}")
    for module, lines in found["over_limit"].items():
        print(f"  {module} ({lines} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
