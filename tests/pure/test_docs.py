"""The documentation says what the code does: generated pages match the code, every test, failpoint,
abort kind and error message the docs name exists, diagrams are well-formed, links stay inside
the repository.

Reads files and imports modules only; starts nothing.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import os
import re
from pathlib import Path

import msgspec
import pytest

from tools import docgen, docgen_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Pages this repository's docs consist of and that must link only inside it.
OWN_PAGES = (
    "README.md",
    "docs/architecture.md",
    "docs/configuration.md",
    "docs/cli.md",
    "docs/operations.md",
    "docs/troubleshooting.md",
    "benchmarks/README.md",
)
#: Notes kept outside the repository, which its users never see (joined at run time, so that a grep of the
#: repository for the names finds nothing, this file included).
OUTSIDE_NOTES = ("".join(("DESIGN", ".md")), "/".join(("..", "shared")))
#: Packages whose strings are the messages users see.
PRODUCT_PACKAGES = ("protocol", "coordinator", "participant", "clients", "cli", "embedded", "procs")


def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under the first heading starting with ``heading``, up to the next heading of its level."""
    match = re.search(rf"^(#+) {re.escape(heading)}.*$", text, re.MULTILINE)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


# ---- generated pages ------------------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(docgen.PAGES))
def test_a_generated_page_matches_the_code(page: str) -> None:
    committed = read(page) if (ROOT / page).is_file() else ""
    generated = docgen.PAGES[page]()
    if committed != generated:
        diff = "\n".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(), generated.splitlines(), "committed", "generated", lineterm=""
                )
            )[:40]
        )
        pytest.fail(f"{page} is stale: run `{docgen.REGENERATE}` and commit the result\n{diff}")


def test_every_config_field_carries_its_description() -> None:
    undescribed = sorted(
        f"{s}.{name}"
        for s, cls in docgen_config.config_sections().items()
        for name, (description, _) in docgen_config.field_docs(cls).items()
        if not description
    )
    assert not undescribed, (
        f"config fields without a description: {undescribed}; give each an "
        "Annotated[type, msgspec.Meta(description=...)] in protocol/config/sections.py"
    )


def test_the_documented_environment_variables_are_the_ones_the_config_reads() -> None:
    from protocol.config.env import is_array, overrides

    for section_name, cls in docgen_config.config_sections().items():
        for field in msgspec.structs.fields(cls):
            if docgen_config.is_table(field):
                continue
            var = docgen_config.env_var(section_name, field.name)
            assert overrides({var: "x"}) == {section_name: {field.name: ["x"] if is_array(field.type) else "x"}}, var


def test_the_complete_example_is_a_valid_config_with_the_defaults() -> None:
    from protocol.config.parse import PipelineConfig, parse_config

    *routes, example = fenced_blocks(read("docs/configuration.md"), "toml")  # the complete example is the last
    config = parse_config(example, {}, source="docs/configuration.md")
    for block in routes:  # the [[route]] example, in a config of its own
        routed = parse_config('[pipeline]\nname = "orders"\n' + block, {}, source="docs/configuration.md")
        assert routed.tables == ("orders", "clicks")
    expected = msgspec.convert(
        {"pipeline": {"name": "orders", "topics": ["orders"]}, "clickhouse": {"target_table": "orders"}}, PipelineConfig
    )
    assert config == expected


# ---- diagrams -------------------------------------------------------------------------------

MERMAID_TYPES = {
    "sequenceDiagram",
    "stateDiagram-v2",
    "stateDiagram",
    "flowchart",
    "graph",
    "classDiagram",
    "erDiagram",
    "gantt",
    "pie",
    "journey",
    "gitGraph",
    "mindmap",
    "timeline",
}
#: Arrows whose characters would read as unbalanced brackets.
_ARROWS = re.compile(r"<<?-{1,2}>>?|-{1,2}>>|-{1,2}\)|-{1,2}x\b|-{1,2}>|==>|-\.->")


def mermaid_problems(block: str) -> list[str]:
    lines = block.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    problems = []
    if first.split(" ")[0] not in MERMAID_TYPES:
        problems.append(f"first line {first!r} is not a known diagram type")
    if "\t" in block:
        problems.append("a tab (indent with spaces)")
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for n, line in enumerate(lines, 1):
        if line.count('"') % 2:
            problems.append(f"line {n}: unbalanced double quotes: {line.strip()}")
            continue
        outside = "".join(re.split(r'"[^"]*"', line))  # quoted labels may hold anything but a list
        if re.search(r'"\s*\d+\.\s', line):
            problems.append(f"line {n}: a label starting '1. ' renders as 'Unsupported markdown: list': {line.strip()}")
        if re.search(r"</?[A-Za-z]", outside):
            problems.append(f"line {n}: HTML is not valid GitHub mermaid: {line.strip()}")
        if ";" in outside or "#" in outside:
            problems.append(f"line {n}: ';' ends a statement and '#' starts an entity code: {line.strip()}")
        for ch in _ARROWS.sub(" ", outside):
            if ch in "([{":
                stack.append((ch, n))
            elif ch in ")]}":
                if not stack or stack[-1][0] != pairs[ch]:
                    problems.append(f"line {n}: unbalanced {ch!r}: {line.strip()}")
                    stack = []
                else:
                    stack.pop()
    problems += [f"line {n}: {ch!r} never closed" for ch, n in stack]
    return problems


def mermaid_blocks() -> list[tuple[str, str]]:
    pages = [*sorted(p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md")), "README.md"]
    return [(page, block) for page in pages for block in fenced_blocks(read(page), "mermaid")]


def test_the_checker_finds_bad_mermaid() -> None:
    assert mermaid_problems("sequenceDiagram\n    A->>B: hello (world)\n    A-)B: async\n") == []
    assert mermaid_problems("stateDiagram-v2\n    [*] --> A : go\n") == []
    assert mermaid_problems('flowchart TD\n    a["x (y"] -->|"z"| b{"ok?"}\n') == []
    assert mermaid_problems("sequenceDiagramm\n")
    assert mermaid_problems('flowchart TD\n    a["x] --> b\n')
    assert mermaid_problems("flowchart TD\n    a[x --> b\n")
    assert mermaid_problems("sequenceDiagram\n\tA->>B: hi\n")
    assert mermaid_problems("sequenceDiagram\n    A->>B: a<br/>b\n")
    assert mermaid_problems("sequenceDiagram\n    A->>B: a; b\n")
    assert mermaid_problems('flowchart TD\n    a["1. first"] --> b\n')


def test_every_mermaid_block_is_well_formed() -> None:
    blocks = mermaid_blocks()
    kinds = [block.split()[0] for _, block in blocks]
    assert "sequenceDiagram" in kinds and kinds.count("stateDiagram-v2") >= 2, kinds
    problems = [
        f"{page}, diagram {i}: {p}" for i, (page, block) in enumerate(blocks, 1) for p in mermaid_problems(block)
    ]
    assert not problems, "\n".join(problems)


def test_the_state_diagrams_name_every_coordinator_phase_and_participant_status() -> None:
    from protocol.coordinator.events import Phase
    from protocol.participant.state import Status

    diagrams = [block for _, block in mermaid_blocks() if block.startswith("stateDiagram")]
    for enum in (Phase, Status):
        names = {m.name for m in enum}
        best = max(diagrams, key=lambda d: len(names & set(re.findall(r"\w+", d))))
        missing = names - set(re.findall(r"\w+", best))
        assert not missing, f"no state diagram shows every {enum.__name__}; missing {sorted(missing)}"


# ---- what the docs name exists --------------------------------------------------------------

TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        names |= {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


test_functions.__test__ = False  # a helper, despite its name


def test_every_row_of_the_fault_table_names_tests_that_exist() -> None:
    faults = section(read("docs/architecture.md"), "13. Faults")
    rows = [line for line in faults.splitlines() if line.startswith("| ") and not line.startswith("| fault")]
    assert len(rows) >= 13, "the fault table lost rows"
    missing = []
    for row in rows:
        refs = TEST_REF.findall(row)
        if not refs:
            missing.append(f"no test named for: {row[:80]}")
        for path, name in refs:
            file = ROOT / path
            if not file.is_file():
                missing.append(f"{path} does not exist")
            elif name not in test_functions(file):
                missing.append(f"{path} has no test {name}")
    assert not missing, "\n".join(missing)


HANDLER_REF = re.compile(r"`([\w.]+):([\w.]+)`")


def fault_rows() -> list[dict[str, str]]:
    """The rows of the fault table of docs/architecture.md, as {column: cell}."""
    faults = section(read("docs/architecture.md"), "13. Faults")
    lines = [line for line in faults.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split(" | ")))) for line in lines[1:]]


def resolve(module: str, qualname: str) -> object:
    """The object ``module:qualname`` names (``ImportError`` or ``AttributeError`` if there is none)."""
    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def test_every_row_of_the_fault_table_names_code_that_handles_it_and_imports() -> None:
    rows = fault_rows()
    assert len(rows) >= 13 and all("handled in" in row for row in rows), "the fault table lost its handled-in column"
    problems = []
    for row in rows:
        refs = HANDLER_REF.findall(row["handled in"])
        if not refs:
            problems.append(f"{row['fault']!r}: names no handler as `module:qualname`")
        for module, qualname in refs:
            try:
                resolve(module, qualname)
            except (ImportError, AttributeError) as exc:
                problems.append(f"{row['fault']!r}: `{module}:{qualname}` does not resolve ({exc})")
    assert not problems, "docs/architecture.md section 13, handled in:\n" + "\n".join(problems)


def test_every_test_named_in_any_page_exists() -> None:
    missing = [
        f"{page}: {path}::{name}"
        for page in OWN_PAGES
        for path, name in TEST_REF.findall(read(page))
        if not (ROOT / path).is_file() or name not in test_functions(ROOT / path)
    ]
    assert not missing, missing


def test_the_failpoint_table_lists_exactly_the_failpoints() -> None:
    from clients.failpoints import POINTS

    table = section(read("docs/architecture.md"), "14. Failpoints")
    documented = set(re.findall(r"^\| `([\w.-]+)` \|", table, re.MULTILINE))
    assert documented == set(POINTS), (sorted(set(POINTS) - documented), sorted(documented - set(POINTS)))


def test_every_abort_kind_is_explained() -> None:
    from protocol.coordinator.events import ABORT_KINDS

    table = section(read("docs/troubleshooting.md"), "Transactions abort")
    explained = set(re.findall(r"^\| `([\w-]+)` \|", table, re.MULTILINE))
    assert explained == set(ABORT_KINDS), (sorted(set(ABORT_KINDS) - explained), sorted(explained - set(ABORT_KINDS)))


def message_corpus() -> str:
    """Every string the product code can show, placeholders as NUL (and once more without them)."""
    found: set[str] = {read("Makefile")}
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.JoinedStr):
                    parts = [v.value if isinstance(v, ast.Constant) else "\0" for v in node.values]
                    found |= {"".join(parts), "".join(p for p in parts if p != "\0")}
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return "\1".join(found)


def _as_words(piece: str, corpus: str) -> bool:
    """``piece`` is in ``corpus`` and does not start or end inside a word of it."""
    pattern = (
        (r"(?<![A-Za-z0-9_])" if piece[0].isalnum() else "")
        + re.escape(piece)
        + (r"(?![A-Za-z0-9_])" if piece[-1].isalnum() else "")
    )
    return re.search(pattern, corpus) is not None


def uncovered(fragment: str, corpus: str, piece: int = 6) -> str:
    """The part of ``fragment`` not made of whole-word pieces (``piece`` characters or more) of
    ``corpus``; "" if none.

    Messages are often composed (a prefix, a template, a reason from elsewhere), so a fragment may
    span several strings of the code, joined by punctuation; each piece must still be found verbatim.
    """
    i = 0
    while sum(c.isalnum() for c in fragment[i:]) >= 4:
        lo, hi = i, len(fragment)
        while lo < hi:  # the longest fragment[i:j] in the corpus (containment shrinks monotonically)
            mid = (lo + hi + 1) // 2
            if fragment[i:mid] in corpus:
                lo = mid
            else:
                hi = mid - 1
        while lo - i >= piece:  # then the longest that is whole words, here and in the corpus
            if not (lo < len(fragment) and fragment[lo - 1].isalnum() and fragment[lo].isalnum()) and _as_words(
                fragment[i:lo], corpus
            ):
                break
            lo -= 1
        if lo - i >= piece:
            i = lo
        elif not fragment[i].isalnum():
            i += 1  # glue between composed parts, or the quotes of a repr: skipped
        else:
            return fragment[i:]
    return ""


def troubleshooting_messages() -> list[str]:
    text = read("docs/troubleshooting.md")
    lines = [line for block in fenced_blocks(text, "text") for line in block.splitlines() if line.strip()]
    aborts = section(text, "Transactions abort")
    lines += re.findall(r"^\| `[\w-]+` \| `([^`]+)` \|", aborts, re.MULTILINE)
    return lines


def test_the_message_checker_refuses_invented_text() -> None:
    corpus = "\1".join(["control topic \0 has \0 partitions; chtxn needs exactly 1", "chtxn: \0"])
    assert uncovered("chtxn: control topic ", corpus) == ""
    assert uncovered(" partitions; chtxn needs exactly 1", corpus) == ""
    assert uncovered(" partitions; chtxn needs exactly 2 or more", corpus) == "2 or more"
    assert uncovered("control topic \0 has \0 partitions; chtxn needs exact 1", corpus) == "exact 1"


def test_every_troubleshooting_message_is_one_the_code_shows() -> None:
    corpus = message_corpus()
    messages = troubleshooting_messages()
    assert len(messages) >= 30, "the troubleshooting page lost its messages"
    wrong = []
    for message in messages:
        for fragment in re.split(r"\{[^{}]*\}", message):
            rest = uncovered(fragment, corpus)
            if rest:
                wrong.append(f"{message}\n    not in the code: {rest!r}")
    assert not wrong, "messages in docs/troubleshooting.md that the code does not show:\n" + "\n".join(wrong)


# ---- links ----------------------------------------------------------------------------------

#: Directories of the working tree that are not the repository's own text.
NOT_OURS = {
    ".git",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".chtxn",
    "results",
    "node_modules",
}


def own_text_files() -> list[Path]:
    """Every ``.py`` and ``.md`` file of the repository (environments, caches and results skipped)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_OURS and not d.endswith(".egg-info")]
        found += [Path(folder) / f for f in files if f.endswith((".py", ".md"))]
    return found


def test_no_file_cites_notes_outside_the_repository() -> None:
    files = own_text_files()
    assert ROOT / "protocol" / "config" / "parse.py" in files and ROOT / "README.md" in files
    citing = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(note in line for note in OUTSIDE_NOTES)
    ]
    assert not citing, (
        "cite docs/architecture.md (its section numbers) instead of notes users never see:\n" + "\n".join(citing)
    )


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub makes for the headings of ``text`` (fenced code skipped)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    anchors: set[str] = set()
    for title in re.findall(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def prose(text: str) -> str:
    """``text`` without fenced code and code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("page", OWN_PAGES)
def test_links_stay_inside_the_repository_and_resolve(page: str) -> None:
    text = read(page)
    body = prose(text)
    problems = []
    assert not any(note in text for note in OUTSIDE_NOTES) and "shared/" not in text, (
        f"{page} refers to notes users never see"
    )
    for url in re.findall(r"(?:https?:|mailto:|ftp:)//?\S+|www\.\S+", body):
        problems.append(f"a link that leaves the repository: {url}")
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"^[a-z]+:", target) or target.startswith("//"):
            problems.append(f"a link that leaves the repository: {target}")
            continue
        path, _, anchor = target.partition("#")
        file = ((ROOT / page).parent / path).resolve() if path else (ROOT / page)
        if ROOT.resolve() not in file.parents and file != ROOT.resolve():
            problems.append(f"{target} points outside the repository")
        elif not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    assert not problems, f"{page}:\n" + "\n".join(problems)
