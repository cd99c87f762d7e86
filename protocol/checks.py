"""A verdict as chtxn gives them: one ``Check`` per question, each with what was found and what to do.

``chtxn doctor`` (``protocol.doctor``), ``chtxn status`` (``protocol.status``), ``chtxn config check``
(``protocol.config.sources``) and the partition-log check (``protocol.offsets.partition_logs``) all
answer in this shape. Pure.
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: ``ok``: exactly-once holds here as far as this check goes; ``warn``: it holds, but something is
#: worth changing; ``fail``: it does not hold, or chtxn cannot run.
Verdict = Literal["ok", "warn", "fail"]


class Check(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the doctor's report: what was checked, the verdict, what was found, what to do."""

    name: str
    status: Verdict
    found: str
    fix: str = ""  # "" when nothing needs doing
