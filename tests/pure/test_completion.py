"""``chtxn completion bash|zsh``: the script is valid bash, and completing each command path in a real bash
offers every subcommand and option under it; the zsh script names them all too."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from cli import build_parser, main
from cli.completion import script, subcommands


def every_path() -> list[tuple[str, ...]]:
    return list(subcommands(build_parser()))


def test_the_parser_has_the_commands_an_operator_needs_to_complete() -> None:
    paths = every_path()
    assert {("status",), ("dlq", "list"), ("dlq", "replay"), ("config", "check"), ("completion",)} <= set(paths)


def test_the_bash_script_is_valid_bash(tmp_path) -> None:
    path = tmp_path / "chtxn.bash"
    path.write_text(script("bash"))
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def complete(path, words: list[str]) -> list[str]:
    """What bash offers for ``chtxn WORDS`` (the last word being typed), by the script at ``path``."""
    line = " ".join(["chtxn", *words])
    program = (
        f"source {shlex.quote(str(path))}\n"
        f"COMP_WORDS=(chtxn {' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words)}\n"
        f"COMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}\n"
        "_shtab_chtxn; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_bash_completes_every_subcommand_under_its_parent_and_the_options(tmp_path) -> None:
    path = tmp_path / "chtxn.bash"
    path.write_text(script("bash"))
    parents = {p[:-1] for p in every_path()}
    offered = {parent: set(complete(path, [*parent, ""])) for parent in parents}
    missing = [p for p in every_path() if p[-1] not in offered[p[:-1]]]
    assert missing == []
    assert {"--config", "--json", "--format", "--timeout"} <= set(complete(path, ["status", "--"]))
    assert complete(path, ["status", "--format", ""]) == ["table", "wide", "tsv", "json"]
    assert complete(path, ["completion", ""]) == ["bash", "zsh"]


def test_config_completes_file_names(tmp_path) -> None:
    path = tmp_path / "chtxn.bash"
    path.write_text(script("bash"))
    (tmp_path / "pipeline-a.toml").write_text("")
    typed = str(tmp_path / "pipeline-")
    assert complete(path, ["status", "--config", typed]) == [f"{typed}a.toml"]


def test_the_zsh_script_is_a_compdef_naming_every_command() -> None:
    text = script("zsh")
    assert text.startswith("#compdef chtxn")
    missing = [p for p in every_path() if p[-1] not in text]
    assert missing == []


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_command_prints_the_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    assert capsys.readouterr().out == script(shell)


def test_an_unknown_shell_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["completion", "fish"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'fish'" in err and "bash" in err and "zsh" in err  # argparse quotes by Python version
