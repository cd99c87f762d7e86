"""What ``chtxn embedded up --user U --password P`` asks of a ClickHouse endpoint that already runs:
that it takes U with P, as one started by that command would. The passwords are never written
down (``state.json`` records the user names only), so the endpoint itself is asked.
"""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from protocol.errors import SetupError


def check_running(url: str, recorded: Sequence[str], users: Mapping[str, str], data_dir: Path, option: str) -> None:
    """Return when the endpoint at ``url`` (started with the users ``recorded``, none: it takes anyone)
    takes each of ``users`` with its password; else raise ``SetupError`` saying how to restart it with
    them. ``option`` is what later commands need to find the stack (`` --data-dir DIR`` or "")."""
    again = (
        f"stop the stack (`chtxn embedded down{option}`; its ClickHouse data is kept) and run "
        f"`chtxn embedded up{option} --user U --password P` again"
    )
    if not recorded:
        raise SetupError(
            f"the ClickHouse endpoint running in {data_dir} accepts any user and password (it was started "
            f"without --user/--password), so it would not check these: to have it check them, {again}"
        )
    for user, password in users.items():
        if not _takes(url, user, password):
            raise SetupError(
                f"the ClickHouse endpoint running in {data_dir} refuses user {user} with that password: it was "
                f"started with other credentials (users: {', '.join(recorded)}); use those, or {again}"
            )


def _takes(url: str, user: str, password: str) -> bool:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, data=b"SELECT 1", headers={"Authorization": f"Basic {token}"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as refused:
        if refused.headers.get("X-ClickHouse-Exception-Code") == "516":
            return False
        raise SetupError(
            f"the ClickHouse endpoint at {url} failed a check of user {user}: HTTP {refused.code}"
        ) from None
    except OSError as exc:
        raise SetupError(f"the ClickHouse endpoint at {url} did not answer a check of user {user}: {exc}") from None
