"""``chtxn completion bash|zsh``: a shell completion script, written from ``chtxn``'s own parser.

The script is static (``shtab`` writes it from the argparse parser): pressing TAB runs no Python, so
it costs nothing however slow ``chtxn`` is to start. It knows the commands and options of the chtxn
that wrote it: write it again after an upgrade. ``--config`` completes file names, ``--data-dir``
directories.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

SHELLS = ("bash", "zsh")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for bash or zsh on stdout: commands, subcommands, options and "
        "their choices, file names after --config. The script is static and runs no Python on TAB; write it "
        "again after upgrading chtxn, so that it knows the new commands. bash: save it as "
        "~/.local/share/bash-completion/completions/chtxn, where the bash-completion package loads it on first "
        "use (without that package, source the saved file from ~/.bashrc). zsh: save it as _chtxn in a directory "
        "of $fpath, e.g. ~/.zfunc with fpath=(~/.zfunc $fpath) in ~/.zshrc before compinit runs.",
        epilog="Examples:\n  chtxn completion bash > ~/.local/share/bash-completion/completions/chtxn\n"
        "  source <(chtxn completion bash)\n"
        "  mkdir -p ~/.zfunc && chtxn completion zsh > ~/.zfunc/_chtxn",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in: bash or zsh")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(script(args.shell), end="")
    return 0


def script(shell: str) -> str:
    """The completion script of ``chtxn``'s whole parser for ``shell`` (``SHELLS``)."""
    import shtab

    from cli import build_parser

    parser = build_parser()
    for action in _actions(parser):
        if action.metavar == "FILE" or action.dest == "config":
            action.complete = shtab.FILE  # type: ignore[attr-defined]  # shtab reads this attribute
        elif action.dest.endswith("_dir"):
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]  # shtab reads this attribute
    return shtab.complete(parser, shell)


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every action of ``parser`` and of its subcommands, at any depth."""
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share one parser
                yield from _actions(sub)


def subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of ``parser``: ``("dlq",)``, ``("dlq", "list")``, ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from subcommands(sub, (*prefix, name))
