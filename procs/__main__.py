"""``python -m procs OWNER CHILD GRACE_S``: the watchdog started by :func:`procs.start_watchdog`."""

import sys

from procs import watchdog

watchdog(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
