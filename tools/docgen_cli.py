"""``docs/cli.md`` (``tools.docgen``): every command and subcommand of ``cli.build_parser()`` with
its usage, description, options and the example in its epilog.
"""

from __future__ import annotations

import argparse
import re

from tools.docgen_markdown import banner, md, table

CLI_INTRO = (
    "`chtxn` is the one command of every role: it runs the coordinator and the participant job, "
    "inspects the ledger, checks exactly-once, and starts the embedded stack. Every command takes "
    "`-h`/`--help` and shows an example; commands whose output a script may want take `--json`. "
    "Log lines are JSON objects on stderr (`chtxn --log-level INFO COMMAND ...`).\n\n"
    "Exit codes: `0` success, `1` a failed check or operation (the message says what to do), "
    "`2` bad usage or a bad config. Errors are explained in [troubleshooting.md](troubleshooting.md)."
)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _subcommands(parser: argparse.ArgumentParser) -> tuple[argparse._SubParsersAction | None, list]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return action, [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return None, []


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%" in text:
        text = text % {**vars(action), "prog": parser.prog}
    return text


def _option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    exclusive = {}
    for group in parser._mutually_exclusive_groups:
        for action in group._group_actions:
            exclusive[action] = [a for a in group._group_actions if a is not action]
    rows: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}`"
        if action.nargs == 0:
            argument = ""
        elif action.choices is not None:
            argument = "one of " + ", ".join(f"`{c}`" for c in action.choices)
        elif action.option_strings:
            argument = f"`{action.metavar or action.dest.upper()}`"
        else:
            argument = "positional" + (" (one or more)" if action.nargs == "+" else "")
        if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
            default = "required"
        elif action.nargs == 0:
            default = "off"
        elif action.default is None or action.default == argparse.SUPPRESS:
            default = ""
        elif isinstance(action, argparse._AppendAction):
            default = "none (repeatable)"
        else:
            default = f"`{action.default}`"
        description = _help(action, parser)
        if action in exclusive:
            others = ", ".join(f"`{o.option_strings[0]}`" for o in exclusive[action])
            description += f" (not with {others})"
        rows.append((name, md(argument), default, md(description)))
    return rows


def _example(epilog: str) -> list[str]:
    text = epilog.strip()
    match = re.match(r"^Examples?:\s*", text)
    if not match:
        return [md(text), ""]
    commands = [line.strip() for line in text[match.end() :].splitlines() if line.strip()]
    return ["```console", *[f"$ {c}" for c in commands], "```", ""]


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def _command_section(parser: argparse.ArgumentParser, level: int, help_line: str) -> list[str]:
    out = [f"{'#' * level} `{parser.prog}`", ""]
    if help_line:
        out += [f"*{md(help_line)}*", ""]
    if parser.description:
        out += [md(parser.description), ""]
    out += ["```text", _usage(parser), "```", ""]
    _action, subs = _subcommands(parser)
    if subs:
        out += [
            table(
                ("subcommand", "what it does"), [(f"[`{name}`](#{_anchor(sub.prog)})", md(h)) for name, sub, h in subs]
            ),
            "",
        ]
    rows = _option_rows(parser)
    if rows:
        out += [table(("option", "argument", "default", "description"), rows), ""]
    if parser.epilog:
        out += _example(parser.epilog)
    for _, sub, h in subs:
        out += _command_section(sub, level + 1, h)
    return out


def cli_page() -> str:
    from cli import build_parser

    parser = build_parser()
    _, commands = _subcommands(parser)
    out = [
        banner("cli.build_parser()"),
        "",
        "# Command line reference",
        "",
        CLI_INTRO,
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        table(("option", "argument", "default", "description"), _option_rows(parser)),
        "",
        "## Commands",
        "",
        table(("command", "what it does"), [(f"[`{name}`](#{_anchor(sub.prog)})", md(h)) for name, sub, h in commands]),
        "",
    ]
    if parser.epilog:
        out += _example(parser.epilog)
    for _, sub, h in commands:
        out += _command_section(sub, 2, h)
    return "\n".join(out).rstrip("\n") + "\n"
