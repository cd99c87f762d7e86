"""The KeeperMap probe of ``chtxn doctor``: does a strict-mode KeeperMap insert work on this server, as
the keeper commit point (``protocol.ledger.claims``) needs?

Probe steps, on a table and a Keeper path of the probe's own (``chtxn_doctor_<random>`` in
``clickhouse.database``, at ``<ledger.keeper_path>/doctor-<random>``), never the claims table:

1. Create the KeeperMap table.
2. Insert one key in strict mode (``ledger_claims.CLAIM_SETTINGS``: no Keeper retries, so a dead
   Keeper fails the insert at once instead of after minutes of back-off).
3. Insert the same key again in strict mode: Keeper must refuse it.
4. Read the key back: it must hold the first insert's value. ClickHouse reports "the key exists"
   and "Keeper is unreachable" with one code (999, KEEPER_EXCEPTION), so this read, not the
   error of step 3, says which it was.
5. Drop the table (``SYNC``, so its Keeper nodes go with it), whatever happened before.

Rows are written with ``INSERT ... VALUES`` through ``client.command``: the embedded endpoint reports
an error raised during a streaming insert (``client.insert``) as a success.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from clients.clickhouse import error_code, is_clickhouse_failure
from protocol.config.parse import PipelineConfig
from protocol.doctor.facts import KeeperOutcome, KeeperProbe
from protocol.ledger import claims as ledger_claims
from protocol.tables.shape import ident

#: What step 1's error code says of the server: KeeperMap is off (no ``keeper_map_path_prefix``:
#: BAD_ARGUMENTS; no ``<zookeeper>``: NO_ZOOKEEPER), or Keeper did not answer (KEEPER_EXCEPTION).
_CREATE_FAILURES: dict[int, KeeperOutcome] = {36: "disabled", 225: "disabled", 999: "unreachable"}
#: Seconds each probe step may take: a server whose Keeper is down answers a KeeperMap statement
#: only after its Keeper client gives up (about 30 s on ClickHouse 26.9); a step that takes them all
#: says Keeper does not answer, at once.
STEP_TIMEOUT_S = 4.0
#: The longest server message kept in the report.
_DETAIL_CHARS = 300


class _Stop(Exception):
    """Ends the probe early with its outcome."""

    def __init__(self, outcome: KeeperOutcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome, self.detail = outcome, detail


def probe(client: Any, cfg: PipelineConfig) -> KeeperProbe:
    """Run the probe steps on ``client`` (a clickhouse-connect client); never raises for a ClickHouse error."""
    token = uuid.uuid4().hex[:10]
    table = f"{ident(cfg.clickhouse.database)}.{ident(f'chtxn_doctor_{token}')}"
    path = f"{cfg.keeper_path}/doctor-{token}"
    started = time.monotonic()
    outcome: KeeperOutcome = "ok"
    detail = leftover = ""
    try:
        _steps(client, table, path)
    except _Stop as stop:
        outcome, detail = stop.outcome, stop.detail
    finally:
        if not _drop(client, table):  # probe step 5: drop the table
            leftover = table
    return KeeperProbe(
        outcome=outcome, path=path, detail=detail, seconds=round(time.monotonic() - started, 2), leftover=leftover
    )


def _steps(client: Any, table: str, path: str) -> None:
    """Probe steps 1 to 4; raises ``_Stop`` with the outcome of the first that fails."""
    # Probe step 1: a KeeperMap table on a path of its own
    create = f"CREATE TABLE {table} (key String, v String) ENGINE = KeeperMap('{path}') PRIMARY KEY key"
    failure = _run(client, create, ledger_claims.READ_SETTINGS)
    if failure is not None:
        raise _Stop(_CREATE_FAILURES.get(error_code(failure), "failed"), _line(failure))
    # Probe step 2: a strict-mode insert of one key
    failure = _run(client, f"INSERT INTO {table} VALUES ('probe', 'first')", ledger_claims.CLAIM_SETTINGS)
    if failure is not None:
        raise _Stop("unreachable" if error_code(failure) == 999 else "failed", _line(failure))
    # Probe step 3: a second strict-mode insert of the same key
    refused = _run(client, f"INSERT INTO {table} VALUES ('probe', 'second')", ledger_claims.CLAIM_SETTINGS)
    # Probe step 4: the key read back tells a refusal ("Node exists") from a Keeper that went away
    try:
        rows = client.query(
            f"SELECT v FROM {table} WHERE key = 'probe'", settings=ledger_claims.READ_SETTINGS
        ).result_rows
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        raise _Stop("unreachable", _line(exc)) from None
    held = [row[0] for row in rows]
    if refused is None or held != ["first"]:
        raise _Stop("not-strict", f"the key holds {held}")


def _run(client: Any, sql: str, settings: dict[str, int]) -> BaseException | None:
    """Run ``sql``; the ClickHouse failure it raised, or None. A failure after ``STEP_TIMEOUT_S``
    (the client gave up waiting) ends the probe: Keeper does not answer."""
    started = time.monotonic()
    try:
        client.command(sql, settings=settings)
    except Exception as exc:
        if not is_clickhouse_failure(exc):
            raise
        if time.monotonic() - started >= STEP_TIMEOUT_S * 0.9 and not sql.startswith("DROP"):
            statement = sql.split(" (", 1)[0].split(" VALUES", 1)[0]
            raise _Stop("unreachable", f"no answer within {STEP_TIMEOUT_S:g} s to {statement}: {_line(exc)}") from None
        return exc
    return None


def _drop(client: Any, table: str) -> bool:
    return _run(client, f"DROP TABLE IF EXISTS {table} SYNC", ledger_claims.READ_SETTINGS) is None


def _line(exc: BaseException) -> str:
    """The server's message of ``exc``: its first line, without the client's preamble, cut short."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.split("DB::Exception: ", 1)[-1]
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."
