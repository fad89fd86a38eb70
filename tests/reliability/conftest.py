"""Reliability checks: the same code at two sizes.

``make test`` runs each check at its short size, so a regression is caught
on every run; ``make soak`` sets ``RAPIDMOUNT_SOAK=1`` and runs the long
size. Each check reports one line (what it tried, what was lost) with the
``report`` fixture; the lines are printed together at the end of the run.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import SOAK


def size(short: int, long: int, *, env: str | None = None) -> int:
    """The count of a check: ``env`` if set, else the long one under soak, else the short one."""
    if env and os.environ.get(env):
        return int(os.environ[env])
    return long if SOAK else short


def retry_eacces(action, timeout: float = 30.0):
    """``action()``'s result (or error) once it stops failing with EACCES: a
    mount whose credentials were refused recovers by itself."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except PermissionError:
            assert time.monotonic() < deadline, f"still EACCES after {timeout:.0f} s"
            time.sleep(0.05)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/reliability/" in str(item.path):
            item.add_marker(pytest.mark.mount)
