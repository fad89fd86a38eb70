"""Waiting for what another thread or process does: poll the observable
condition until it holds, and fail at a deadline rather than hang. (Within
one trio run, wait on an event or ``trio.testing.wait_all_tasks_blocked``.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Between two looks at the condition: short, it only paces the polling.
POLL_INTERVAL = 0.01


def until(condition: Callable[[], T], timeout: float = 30.0, what: str = "the condition") -> T:
    """``condition()``'s first true result, polled until ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g}s"
        time.sleep(POLL_INTERVAL)
    return result


def within(condition: Callable[[], T], timeout: float) -> T | None:
    """``condition()``'s first true result within ``timeout`` seconds, or None:
    for a case a test may or may not reach, which it then counts."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_INTERVAL)
    return result


def io_bytes(pid: int, field: str) -> int:
    """A process's ``/proc/PID/io`` counter (``rchar``: bytes it read; ``wchar``:
    written); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/io") as io:
            for line in io:
                name, _, value = line.partition(":")
                if name == field:
                    return int(value)
    except OSError:
        pass
    return 0


async def until_async(condition: Callable[[], T], timeout: float = 30.0, what: str = "the condition") -> T:
    """:func:`until` inside an asyncio loop, which keeps running meanwhile."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g}s"
        await asyncio.sleep(POLL_INTERVAL)
    return result
