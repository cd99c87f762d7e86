"""``python -m tests.soak.armed_cli ARGS``: the ``chtxn`` CLI with ``CHTXN_FAILPOINTS`` armed.

``clients.failpoints`` says the CLI arms the failpoints named in ``CHTXN_FAILPOINTS``, but
``cli.main`` does not call ``arm_from_env``; this wrapper does, then removes the variable so the
points are armed once even when the CLI starts arming them itself.
"""

from __future__ import annotations

import os
import sys

from clients import failpoints
from cli import main

if __name__ == "__main__":
    failpoints.arm_from_env()
    os.environ.pop(failpoints.ENV, None)
    sys.exit(main())
