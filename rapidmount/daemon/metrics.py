"""Prometheus metrics: ``--prometheus-port`` serves ``/metrics``.

Nothing on the data path talks to prometheus_client. The code keeps plain
counters (``Filesystem.stats``, the page and metadata caches' stats, the
stream events, the client's gRPC error table, :class:`~rapidmount.fuse.stats.OperationStats`), and
:class:`MountCollector` turns them into metric families when Prometheus
scrapes. prometheus_client's HTTP server runs in its own thread, so a scrape
never blocks trio; :class:`MetricsServer` stops it at unmount.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from rapidmount.fuse.stats import READ_REPLIERS, REQUEST_PATHS, OperationStats
from rapidmount.storage.counters import PAGE_STORE_OUTCOMES

if TYPE_CHECKING:
    from rapidmount.core.filesystem import Filesystem
    from rapidmount.localcache.cache import LocalCache


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


_LOCAL_CACHE_COUNTERS = (
    ("rapidmount_local_cache_hits", "hits", "Read-only opens given a complete copy from --cache-dir"),
    ("rapidmount_local_cache_misses", "misses", "Read-only opens of objects with no complete copy in --cache-dir"),
    ("rapidmount_local_cache_served_bytes", "served_bytes",
     "Bytes the FUSE process answered from --cache-dir (passthrough reads never reach it)"),
    ("rapidmount_local_cache_fills", "fills", "Objects copied whole into --cache-dir"),
    ("rapidmount_local_cache_fill_bytes", "fill_bytes", "Bytes of the objects copied into --cache-dir"),
    ("rapidmount_local_cache_fills_failed", "fills_failed", "Copies into --cache-dir that ended without an entry"),
    ("rapidmount_local_cache_evictions", "evictions", "Entries evicted from --cache-dir to stay within --cache-dir-size"),
    ("rapidmount_local_cache_evicted_bytes", "evicted_bytes", "Bytes evicted from --cache-dir"),
    ("rapidmount_local_cache_damaged", "damaged", "Entries dropped because their file changed or failed its CRC32C"),
    ("rapidmount_local_cache_passthrough_opens", "passthrough_opens",
     "Opens the kernel reads from a --cache-dir file itself (FUSE passthrough)"),
    ("rapidmount_local_cache_daemon_opens", "daemon_opens",
     "Opens whose reads the FUSE process answers from a --cache-dir file"),
    ("rapidmount_local_cache_fill_faults", "fill_faults", "Writes the --cache-dir file system refused (ENOSPC, EIO)"),
)


def _local_cache(local: LocalCache) -> Iterator[Metric]:
    counts = local.stats.as_dict()
    for name, key, documentation in _LOCAL_CACHE_COUNTERS:
        yield _counter(name, documentation, counts[key])
    yield _gauge("rapidmount_local_cache_bytes", "Bytes of complete entries in --cache-dir", local.index.used)
    yield _gauge("rapidmount_local_cache_budget_bytes", "--cache-dir-size", local.index.budget)


class MountCollector(Collector):
    """Reads the mount's counters at scrape time (on the HTTP server's thread)."""

    def __init__(self, fs: Filesystem, operations: OperationStats) -> None:
        self.fs = fs
        self.operations = operations

    def collect(self) -> Iterator[Metric]:
        yield from self._fuse_operations()
        fs = self.fs
        stats = fs.stats
        yield _counter("rapidmount_read_bytes", "Bytes the FUSE process returned to READ requests (not those the "
                       "kernel served from pages stored ahead: rapidmount_kernel_page_store_bytes)", stats.bytes_read)
        yield _counter("rapidmount_written_bytes", "Bytes accepted from write() calls", stats.bytes_written)
        yield _counter("rapidmount_fetched_bytes", "Bytes of cache blocks fetched from the bucket",
                       stats.bytes_fetched)
        yield _counter("rapidmount_writers_flushed",
                       "Times pending writes were made durable (fsync, close, unmount)", stats.writers_flushed)
        yield _counter("rapidmount_whole_file_fetches", "Small files fetched whole when opened",
                       stats.whole_file_fetches)
        yield _counter("rapidmount_scan_prefetched_files", "Files fetched ahead of a directory scan",
                       stats.scan_prefetches)
        yield _counter("rapidmount_scan_prefetch_hits", "Opens of files a scan had fetched ahead",
                       stats.scan_hits)
        yield _counter("rapidmount_page_cache_evicted_unread",
                       "Prefetched blocks evicted before anyone read them", fs.cache.stats.evicted_unread)

        if fs.local is not None:
            yield from _local_cache(fs.local)

        cache = fs.cache
        yield _counter("rapidmount_page_cache_hits", "Page-cache block hits", cache.stats.hits)
        yield _counter("rapidmount_page_cache_misses", "Page-cache block misses", cache.stats.misses)
        yield _counter("rapidmount_page_cache_evictions", "Blocks evicted from the page cache",
                       cache.stats.evictions)
        yield _counter("rapidmount_page_cache_prefetch_hits", "First hits on blocks readahead fetched",
                       cache.stats.prefetch_hits)
        yield _gauge("rapidmount_page_cache_bytes", "Bytes cached or reserved in the page cache",
                     cache.bytes_in_use)
        yield _gauge("rapidmount_page_cache_budget_bytes", "The page cache's byte budget (--cache-size less --transfer-buffer)",
                     cache.budget_bytes)

        meta = fs.meta.stats
        yield _counter("rapidmount_metadata_cache_hits", "Metadata and listing cache hits", meta.hits)
        yield _counter("rapidmount_metadata_cache_misses", "Metadata and listing cache misses", meta.misses)
        yield _counter("rapidmount_metadata_cache_evictions", "Metadata cache entries evicted", meta.evictions)
        yield _gauge("rapidmount_metadata_cache_bytes", "Estimated bytes of the metadata cache",
                     meta.bytes_in_use)

        reading, writing = fs.open_streams()
        open_now = GaugeMetricFamily("rapidmount_streams_open", "Bidi streams open now", labels=["direction"])
        open_now.add_metric(["read"], reading)
        open_now.add_metric(["write"], writing)
        yield open_now
        events = fs.store.stream_events
        for event, name, documentation in (
                ("open", "rapidmount_streams_opened", "Bidi streams opened"),
                ("reconnect", "rapidmount_streams_reconnected", "Bidi streams resumed after a break"),
                ("redirect", "rapidmount_streams_redirected", "Bidi stream opens redirected by the service"),
                ("checksum_failure", "rapidmount_checksum_failures", "Chunks whose CRC32C did not match")):
            family = CounterMetricFamily(name, documentation, labels=["direction"])
            family.add_metric(["read"], events.read.get(event, 0))
            family.add_metric(["write"], events.write.get(event, 0))
            yield family

        pool = getattr(fs.store, "pool", None)  # the data-plane workers (not with an in-process store)
        if pool is not None:
            yield _counter("rapidmount_workers_replaced", "Data-plane workers replaced: crashed, hung, or drained "
                           "past --worker-memory-limit", pool.replaced)
            yield _counter("rapidmount_arena_full", "Read or append buffers the shared-memory arena had no room "
                           "for (their bytes crossed the worker socket instead)", pool.arena.failed_allocations)
        stores = getattr(fs.store, "page_stores", None)
        if stores is not None:
            counts = CounterMetricFamily("rapidmount_kernel_page_stores", "Read-ahead blocks the workers stored "
                                         "straight into the kernel's page cache, by outcome", labels=["outcome"])
            sizes = CounterMetricFamily("rapidmount_kernel_page_store_bytes", "Bytes of those stores, by outcome",
                                        labels=["outcome"])
            for outcome in PAGE_STORE_OUTCOMES:
                counts.add_metric([outcome], stores.stores.get(outcome, 0))
                sizes.add_metric([outcome], stores.bytes.get(outcome, 0))
            yield counts
            yield sizes
            yield _counter("rapidmount_kernel_page_store_seconds", "Seconds the workers' store threads spent "
                           "storing (mostly blocked on pages the kernel was reading)", stores.seconds)
            yield _counter("rapidmount_kernel_only_blocks", "Read-ahead blocks whose bytes went only to the "
                           "kernel's page cache: not copied into the shared-memory arena", stores.kernel_only)
            yield _counter("rapidmount_kernel_only_reads", "READs of read-ahead blocks that went only to the "
                           "kernel's page cache, answered from the bytes their worker held for the store",
                           stores.held_copies)
            yield _counter("rapidmount_kernel_only_replies", "Of those, READs the worker answered from the bytes "
                           "where it held them, without copying them into the shared-memory arena", stores.held_replies)
            yield _counter("rapidmount_kernel_only_rereads", "READs of such blocks read again from the bucket "
                           "(their store was made, or dropped, before the READ came, or the arena had no room)", stores.held_misses)

        errors = CounterMetricFamily("rapidmount_grpc_errors", "Failed gRPC calls (every attempt) by method "
                                     "and status code", labels=["method", "code"])
        for (method, code), count in sorted(fs.store.rpc_errors.snapshot().items()):
            errors.add_metric([method, code], count)
        yield errors

    def _fuse_operations(self) -> Iterator[Metric]:
        replies = CounterMetricFamily("rapidmount_read_replies", "READ replies by who wrote them: a data-plane "
                                      "worker from the arena, the worker that read the bytes as they landed, "
                                      "or the FUSE process", labels=["by"])
        for by in READ_REPLIERS:
            replies.add_metric([by], self.operations.read_replies.get(by, 0))
        yield replies
        requests = CounterMetricFamily("rapidmount_fuse_requests", "FUSE requests the mount's own loop received, "
                                       "by path: READs and WRITEs (and those answered with no task), the other "
                                       "opcodes, INTERRUPTs dropped, malformed requests refused (none with "
                                       "--pyfuse3-requests)", labels=["path"])
        for path in REQUEST_PATHS:
            requests.add_metric([path], self.operations.requests.get(path, 0))
        yield requests
        snapshot = self.operations.snapshot()
        counts = CounterMetricFamily("rapidmount_fuse_operations", "FUSE requests served, by operation",
                                     labels=["op"])
        failures = CounterMetricFamily("rapidmount_fuse_operation_errors",
                                       "FUSE requests answered with an error, by operation", labels=["op"])
        latency = HistogramMetricFamily("rapidmount_fuse_operation_seconds",
                                        "Time to answer a FUSE request, by operation", labels=["op"])
        for operation, (count, errors, seconds, buckets) in sorted(snapshot.items()):
            counts.add_metric([operation], count)
            failures.add_metric([operation], errors)
            latency.add_metric([operation], buckets, seconds)
        yield counts
        yield failures
        yield latency


class MetricsServer:
    """``/metrics`` over HTTP in prometheus_client's own thread."""

    def __init__(self, address: str, port: int, fs: Filesystem, operations: OperationStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MountCollector(fs, operations))
        self.registry.register(ProcessCollector(registry=None))
        # Binds now: a port in use raises OSError here, before anything is mounted.
        self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
