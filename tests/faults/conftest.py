"""Fixtures of the fault tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clients import failpoints


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    """Every fault test ends with no failpoint armed and no caller left paused at one."""
    yield
    failpoints.disarm()
