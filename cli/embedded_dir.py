"""Which embedded stack a ``chtxn embedded`` command means.

``--data-dir`` when given, else ``$CHTXN_EMBEDDED_DIR``, else one directory per user
(``$XDG_STATE_HOME/chtxn/embedded`` or ``~/.local/state/chtxn/embedded``), so every command finds
the same stack from any working directory. Only with neither: when that directory runs nothing and
a stack an older chtxn started in ``./.chtxn/embedded`` of the working directory still runs, that
stack is the one meant, with a note saying where it is (no second stack is started beside it).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from embedded import daemon
from protocol.errors import SetupError

DEFAULT_HELP = "$CHTXN_EMBEDDED_DIR, else $XDG_STATE_HOME/chtxn/embedded, else ~/.local/state/chtxn/embedded"


@dataclass(frozen=True)
class Where:
    data_dir: Path  # resolved
    explicit: bool  # named by --data-dir or $CHTXN_EMBEDDED_DIR
    note: str = ""  # set when the stack meant is an older chtxn's in ./.chtxn/embedded

    def option(self) -> str:
        """`` --data-dir DIR`` when a later command needs it to find this stack, else ``""``."""
        return "" if self.data_dir == daemon.default_data_dir().resolve() else f" --data-dir {self.data_dir}"


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where the stack keeps its data, logs and state (default {DEFAULT_HELP})",
    )


def resolve(args: argparse.Namespace) -> Where:
    if args.data_dir is not None:
        return Where(Path(args.data_dir).resolve(), explicit=True)
    chosen = daemon.default_data_dir().resolve()
    if os.environ.get(daemon.DIR_ENV):
        return Where(chosen, explicit=True)
    legacy = None if daemon.runs(chosen) else daemon.legacy_stack(chosen)
    if legacy is None:
        return Where(chosen, explicit=False)
    note = (
        f"using the embedded stack running in {legacy}, where chtxn kept it before it moved to {chosen}; "
        f"to move it: chtxn embedded down --data-dir {legacy} && chtxn embedded up"
    )
    return Where(legacy, explicit=False, note=note)


def running_state(where: Where) -> daemon.StackState:
    """The state of the stack ``where`` names; SetupError (exit 1) unless its broker and endpoint run."""
    state = daemon.read_state(where.data_dir)
    alive = {s.name for s in daemon.status(where.data_dir) if s.running}
    if state is None or not set(daemon.REQUIRED) <= alive:
        raise SetupError(
            f"no embedded stack runs in {where.data_dir}: start it with `chtxn embedded up{where.option()}`"
        )
    return state
