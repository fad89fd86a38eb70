"""Plain counters a storage implementation keeps for metrics.

They are bumped on the FUSE process's trio thread (from the workers'
notices, or by the in-memory store) and read, as snapshots, by the metrics
endpoint's thread at scrape time. Stream events are single increments of
ints (no lock: one writer thread); errors are rare, so their table takes a
lock to be copied safely while it grows.
"""

from __future__ import annotations

import threading
from collections import Counter

STREAM_EVENTS = ("open", "reconnect", "redirect", "checksum_failure")


class StreamEvents:
    """How often read and write streams opened, reconnected, were redirected."""

    def __init__(self) -> None:
        self.read = dict.fromkeys(STREAM_EVENTS, 0)
        self.write = dict.fromkeys(STREAM_EVENTS, 0)

    def on_read(self, event: str) -> None:
        self.read[event] = self.read.get(event, 0) + 1

    def on_write(self, event: str) -> None:
        self.write[event] = self.write.get(event, 0) + 1


class RpcErrorCounts:
    """Failed gRPC calls (each attempt, retried or not) by method and status code."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, method: str, code: object) -> None:
        name = getattr(code, "name", None) or str(code)
        with self._lock:
            self._counts[(method, name)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


#: What became of a page-cache store: written, refused because the kernel had
#: forgotten the node, failed otherwise, or never made (the worker had no
#: descriptor yet, its queue was full, the file changed meanwhile, or a READ
#: of the block reached the FUSE process first and was answered from the arena).
PAGE_STORE_OUTCOMES = ("stored", "forgotten", "failed", "unready", "full", "stale", "raced")


class PageStoreCounts:
    """Stores into the kernel's page cache: how many, how many bytes, by
    outcome, and the seconds the workers' store threads spent in them
    (blocked on pages the kernel was reading, most of it)."""

    def __init__(self) -> None:
        self.stores = dict.fromkeys(PAGE_STORE_OUTCOMES, 0)
        self.bytes = dict.fromkeys(PAGE_STORE_OUTCOMES, 0)
        self.seconds = 0.0
        #: blocks read ahead that went only to the kernel's page cache
        self.kernel_only = 0
        #: READs of blocks that went only to the kernel's page cache: answered
        #: from the bytes their worker held for the store, or read again
        self.held_copies = 0
        self.held_misses = 0
        #: of ``held_copies``, READs the worker answered from where the bytes are held (no copy)
        self.held_replies = 0

    def add(self, outcome: str, size: int, seconds: float, count: int = 1) -> None:
        """``count`` stores of ``size`` bytes in all with ``outcome``."""
        self.stores[outcome] = self.stores.get(outcome, 0) + count
        self.bytes[outcome] = self.bytes.get(outcome, 0) + size
        self.seconds += seconds
