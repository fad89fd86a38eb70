"""Counts, failures and a latency histogram per FUSE operation, kept by the request loops.

Plain counters (no prometheus_client): ``rapidmount.daemon.metrics`` turns
them into metric families when Prometheus scrapes.
"""

from __future__ import annotations

import bisect
import collections

#: Who writes READ replies (``rapidmount_read_replies``).
READ_REPLIERS = ("worker", "landed", "fuse")
#: FUSE requests the mount's own loop received (``rapidmount_fuse_requests``), by path:
#: READs and WRITEs (and those answered with no task), every other request
#: (and those answered before the loop received the next one),
#: INTERRUPTs dropped, and requests refused as malformed.
REQUEST_PATHS = ("read", "read_at_once", "write", "write_at_once", "write_by_worker", "other", "other_at_once",
                 "interrupt", "refused")
#: Upper bounds (seconds) of the FUSE latency histogram's buckets.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _OperationCounters:
    __slots__ = ("count", "errors", "total_ns", "buckets")

    def __init__(self, bucket_count: int) -> None:
        self.count = 0
        self.errors = 0
        self.total_ns = 0
        self.buckets = [0] * bucket_count  # the last one is +Inf


class OperationStats:
    """Count, failures and a latency histogram per FUSE operation (sans-I/O).

    :meth:`record` runs once per FUSE request on the trio thread: a dict
    lookup, a bisect and three increments, no lock.
    """

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bucket_bounds = tuple(buckets)
        self._bounds_ns = [round(bound * 1e9) for bound in buckets]
        self._operations: dict[str, _OperationCounters] = {}
        #: READ replies by who wrote them: a worker from the arena, a worker
        #: where the bytes landed, or this process.
        self.read_replies: collections.Counter[str] = collections.Counter()
        #: Requests received by the mount's own loop, by path (REQUEST_PATHS).
        self.requests: collections.Counter[str] = collections.Counter()

    def record(self, operation: str, elapsed_ns: int, failed: bool) -> None:
        counters = self._operations.get(operation)
        if counters is None:
            counters = self._operations[operation] = _OperationCounters(len(self._bounds_ns) + 1)
        counters.count += 1
        counters.total_ns += elapsed_ns
        counters.buckets[bisect.bisect_left(self._bounds_ns, elapsed_ns)] += 1
        if failed:
            counters.errors += 1

    def snapshot(self) -> dict[str, tuple[int, int, float, list[tuple[str, int]]]]:
        """operation → (count, errors, seconds in total, cumulative (le, count) buckets)."""
        result = {}
        for operation, counters in list(self._operations.items()):
            cumulative, running = [], 0
            for bound, count in zip((*self.bucket_bounds, float("inf")), list(counters.buckets)):
                running += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            result[operation] = (counters.count, counters.errors, counters.total_ns / 1e9, cumulative)
        return result
