"""The page-store thread's outcomes, summed and sent to the FUSE process's
metrics as one notice at most every :data:`STORE_REPORT_S`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from rapidmount.shared.messages import NOTICE, Message

#: Page-store outcomes go to the FUSE process at most this often, as one
#: notice: a notice per block stored woke that process for a counter.
STORE_REPORT_S = 0.05


class StoreReports:
    """The store thread's outcomes (``add``), summed per outcome and sent as one
    ``page_stores`` notice of ``(outcome, stores, bytes, seconds)`` at most
    every STORE_REPORT_S."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[Message], None]) -> None:
        self._loop = loop
        self._send = send
        self._lock = threading.Lock()
        self._sums: dict[str, list[float]] = {}
        self._due = False  # a flush is planned

    def add(self, outcome: str, size: int, seconds: float) -> None:
        """From any thread."""
        with self._lock:
            sums = self._sums.setdefault(outcome, [0, 0, 0.0])
            sums[0] += 1
            sums[1] += size
            sums[2] += seconds
            if self._due:
                return
            self._due = True
        try:
            self._loop.call_soon_threadsafe(self._loop.call_later, STORE_REPORT_S, self.flush)
        except RuntimeError:  # the loop closed: the worker is ending, its reports with it
            pass

    def flush(self) -> None:
        """On the event loop: send what was added since the last flush."""
        with self._lock:
            sums, self._sums, self._due = self._sums, {}, False
        if sums:
            self._send((NOTICE, "page_stores", [(outcome, int(count), int(size), seconds)
                                                 for outcome, (count, size, seconds) in sums.items()]))
