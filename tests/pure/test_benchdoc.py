"""benchmarks/README.md's result tables match the committed results JSON, and the page says how to run
every benchmark module that can be run.

Reads files only (copies results into a temporary directory for the stale case); starts nothing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tools import benchdoc

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks" / "README.md"


def test_generated_tables_are_current() -> None:
    stale = benchdoc.stale_regions(README.read_text(encoding="utf-8"))
    assert not stale, f"stale tables {stale} in benchmarks/README.md: run python -m tools.benchdoc"
    assert benchdoc.main(["--check"]) == 0


def test_a_changed_figure_makes_the_table_stale(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(benchdoc.RESULTS, results)
    newest = sorted(p for p in results.glob("*.json") if re.fullmatch(r"\d{8}T\d{6}Z\.json", p.name))[-1]
    doc = json.loads(newest.read_text(encoding="utf-8"))
    doc["summary"]["chtxn_rows_per_s"]["median"] = 123_456.0
    newest.write_text(json.dumps(doc), encoding="utf-8")
    readme = tmp_path / "README.md"
    shutil.copy(README, readme)

    assert benchdoc.stale_regions(readme.read_text(encoding="utf-8"), results) == ["bench"]
    assert benchdoc.main(["--check", "--readme", str(readme), "--results", str(results)]) == 1
    assert benchdoc.main(["--readme", str(readme), "--results", str(results)]) == 0
    assert "123,456" in readme.read_text(encoding="utf-8")
    assert benchdoc.main(["--check", "--readme", str(readme), "--results", str(results)]) == 0


def runnable_modules() -> list[str]:
    """The benchmarks modules with a ``__main__`` entry (``if __name__ == "__main__"`` or a ``main``)."""
    names = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name == "__main__.py" or "__main__" in text or re.search(r"^def main\(", text, re.MULTILINE):
            names.append(path.stem)
    return names


def test_readme_says_how_to_run_every_benchmark() -> None:
    text = README.read_text(encoding="utf-8")
    modules = runnable_modules()
    assert "bench" in modules and "tables" in modules
    missing = [m for m in modules if f"python -m benchmarks.{m}" not in text]
    assert not missing, f"benchmarks/README.md has no `python -m benchmarks.X` line for {missing}"
    assert "make bench" in text
