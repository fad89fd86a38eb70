"""Scan-ahead on trio: fetch the first block of the files a scan opens next.

At each open the :class:`ScanPlanner` says which files follow; their first
blocks go into the page cache in batches, one crossing to the store per
batch, so a loader opening them finds them cached or in flight. A batch
lands whole, so a file's open waits for the rest of its batch: batches
hold at most ``BATCH_BYTES`` (many small files, or two first blocks of
large ones) and go ``CALLS_AT_ONCE`` at a time, nearest first. With
``--compose-prefetch`` on buckets that can compose, small files are read
through temporary composite objects instead.
"""

from __future__ import annotations

import collections
import errno
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from rapidmount.cache.page_cache import BlockKey
from rapidmount.readahead.fetcher import BlockFetcher, FetchCancelled, FetchOwner
from rapidmount.scanahead.planner import ScanPlanner
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import ObjectMeta
from rapidmount.storage.seam import COMPOSE_MAX_SOURCES, COMPOSE_PREFIX, ObjectStore
from rapidmount.superblock.metadata_cache import MetadataCache
from rapidmount.superblock.names import EntryKind, ListedEntry

log = logging.getLogger("rapidmount.fs")


class ScanSettings(Protocol):
    """The settings scan-ahead reads (the core's settings have them)."""

    @property
    def prefetch_files(self) -> int: ...  # files ahead of a scan whose first block is fetched
    @property
    def prefetch_streams(self) -> int: ...  # files fetched at once
    @property
    def compose_prefetch(self) -> bool: ...  # small files through composed temporary objects


class ScanCounters(Protocol):
    """The counters scan-ahead adds to (the filesystem's statistics)."""

    scan_prefetches: int  # files fetched ahead of a scan
    scan_hits: int  # of those, opened while cached or in flight
    blocks_fetched: int
    bytes_fetched: int


DIRECTORIES_REMEMBERED = 64  # listings whose file names are kept for planning
LISTINGS_WANTED_MAX = 1024  # directories listed once just to learn their order
#: The bytes of one batch: the first blocks of 32 shards in one batch made the
#: open of the nearest wait for all 64 MiB of them.
BATCH_BYTES = 4 << 20
#: Batches fetched at once; the others wait in order, nearest first.
CALLS_AT_ONCE = 2


class ScanAhead:
    """Fetches ahead of directory scans; every task runs in the mount's nursery."""

    def __init__(self, settings: ScanSettings, store: ObjectStore, meta: MetadataCache, stats: ScanCounters,
                 fetcher: BlockFetcher, nursery: trio.Nursery,
                 list_directory: Callable[[str], Awaitable[list[ListedEntry]]]) -> None:
        self.settings = settings
        self.store = store
        self.meta = meta
        self.stats = stats
        self.fetcher = fetcher
        self.block_size = fetcher.cache.block_size
        self.nursery = nursery
        self.list_directory = list_directory
        self.planner = ScanPlanner(settings.prefetch_files)
        self.owner = FetchOwner()
        #: files that need no fetch: (name, generation) held elsewhere (the local cache)
        self.skip: Callable[[str, int], bool] = lambda name, generation: False
        self._names: dict[str, tuple[list[ListedEntry], list[str]]] = {}
        self._fetched: dict[BlockKey, bool] = {}  # insertion-ordered, bounded
        self._listing_wanted: set[str] = set()
        # Batches waiting for a call, in the order planned, and the tasks making them.
        self._batches: collections.deque[Callable[[], Awaitable[None]]] = collections.deque()
        self._callers = 0
        # Composing needs ComposeObject, which zonal (Rapid) buckets refuse.
        self.compose = settings.compose_prefetch and store.layout.compose
        if settings.compose_prefetch and not store.layout.compose:
            log.warning("--compose-prefetch is ignored: zonal buckets do not support ComposeObject")

    def stop(self) -> None:
        self.owner.cancel_all()

    def opened(self, directory: str, name: str, first_block: BlockKey) -> None:
        """A file was opened for reading: count a hit, and plan what follows."""
        if self._fetched.pop(first_block, False) and self.fetcher.is_pending(first_block):
            self.stats.scan_hits += 1
        entries = self.meta.get_listing(directory)
        names = None
        if entries is not None:
            known = self._names.get(directory)
            if known is None or known[0] is not entries:
                known = (entries, [e.name for e in entries if e.kind is EntryKind.FILE])
                self._names[directory] = known
                while len(self._names) > DIRECTORIES_REMEMBERED:
                    self._names.pop(next(iter(self._names)))
            names = known[1]
        elif directory not in self._listing_wanted and len(self._listing_wanted) < LISTINGS_WANTED_MAX:
            # Opens by path without a readdir: list once, so the order is known.
            self._listing_wanted.add(directory)
            self.nursery.start_soon(self._list, directory)
        # A scan of large files (each prefetch a whole block) goes one file at a time.
        opened = self.meta.get(directory + name)
        batch = 1 if isinstance(opened, ObjectMeta) and opened.size > self.block_size else None
        wanted = self.planner.opened(directory, name, names, batch)
        if wanted:
            self._fetch_files(wanted)

    async def _list(self, directory: str) -> None:
        with trio.CancelScope() as scope:
            self.owner.track(scope)
            try:
                await self.list_directory(directory)
            except Exception:  # only a prediction was lost; the listing logged why
                pass
            finally:
                self.owner.untrack(scope)

    def _fetch_files(self, paths: list[str]) -> None:
        """Fetch the first block of each file ahead of its open, in batches."""
        alone: list[tuple[BlockKey, int, int | None]] = []
        composable: list[tuple[BlockKey, int, int | None]] = []
        for path in paths:
            meta = self.meta.get(path)
            if not isinstance(meta, ObjectMeta) or not meta.finalized or meta.size <= 0:
                continue
            key = BlockKey(path, meta.generation, 0)
            if self.fetcher.is_pending(key) or self.skip(path, meta.generation):
                continue
            if self.compose and meta.size <= self.block_size:
                composable.append((key, meta.size, meta.crc32c))
            else:
                alone.append((key, min(meta.size, self.block_size), None))
        for batch in _by_bytes(alone, BATCH_BYTES):
            self._fetch_batch(batch, composed=False)
        if composable:
            # A composite of a few files costs more than it saves: read those alone.
            self._fetch_batch(composable, composed=len(composable) >= COMPOSE_MAX_SOURCES // 4)

    def _fetch_batch(self, candidates: list[tuple[BlockKey, int, int | None]], *, composed: bool) -> None:
        results: dict[BlockKey, bytes | memoryview | StorageError] = {}
        landed = trio.Event()

        def fetch_for(key: BlockKey, length: int) -> Callable[[], Awaitable[bytes | memoryview]]:
            async def fetch() -> bytes | memoryview:
                await landed.wait()
                answer = results.get(key)
                if answer is None:
                    raise FetchCancelled()  # the batch was cancelled
                if isinstance(answer, StorageError):
                    raise answer
                self.stats.blocks_fetched += 1
                self.stats.bytes_fetched += length
                return answer
            return fetch

        # Only what the fetcher took (budget permitting) goes over the network.
        batch = [(key, length, crc) for key, length, crc in candidates
                 if self.fetcher.start(key, fetch_for(key, length), length, owner=self.owner,
                                       prefetch=True) is not None]
        if not batch:
            return
        self.stats.scan_prefetches += len(batch)
        for key, _, _ in batch:
            self._fetched[key] = True
        while len(self._fetched) > 4 * self.settings.prefetch_files + 1024:
            self._fetched.pop(next(iter(self._fetched)))

        async def fetch_batch() -> None:
            with trio.CancelScope() as scope:
                self.owner.track(scope)
                try:
                    answers = await fetch_answers()
                    results.update(zip((key for key, _, _ in batch), answers))
                except Exception as err:  # a prefetch never takes the mount down
                    log.error("prefetch of %d files failed: %r", len(batch), err)
                    failure = StorageError(f"prefetch failed: {err!r}", errno_=errno.EIO)
                    results.update((key, failure) for key, _, _ in batch)
                finally:
                    self.owner.untrack(scope)
                    landed.set()

        async def fetch_answers() -> list[bytes | memoryview | StorageError]:
            if composed:
                return await self.store.read_objects_composed(
                    [(key.object_id, key.generation, length, crc) for key, length, crc in batch],
                    concurrency=max(1, self.settings.prefetch_streams // 4),
                    temporary_name=lambda: f"{COMPOSE_PREFIX}{uuid.uuid4().hex}")
            return await self.store.read_objects_whole(
                [(key.object_id, key.generation, length) for key, length, _ in batch],
                concurrency=self.settings.prefetch_streams)

        self._batches.append(fetch_batch)
        if self._callers < CALLS_AT_ONCE:
            self._callers += 1
            self.nursery.start_soon(self._call_batches)

    async def _call_batches(self) -> None:
        """Make the waiting batches' calls, oldest first, until none waits."""
        try:
            while self._batches:
                await self._batches.popleft()()
        finally:
            self._callers -= 1


def _by_bytes(items: list[tuple[BlockKey, int, int | None]], limit: int) -> list[list[tuple[BlockKey, int, int | None]]]:
    """``items`` (key, length, crc) in order, cut into runs of at most ``limit``
    bytes (a longer item alone)."""
    runs: list[list[tuple[BlockKey, int, int | None]]] = []
    total = limit
    for item in items:
        if total + item[1] > limit:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += item[1]
    return runs
