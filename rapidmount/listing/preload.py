"""Metadata preload (``--prefetch-metadata``): list the mount's whole tree in
parallel, then cache it.

The trio driver of :class:`rapidmount.listing.ranges.RangePlan`: a pool of
workers, tasks of the filesystem's nursery, each lists one key range with
ListObjects (no delimiter, ``lexicographic_start``/``lexicographic_end``)
and steals part of a busy range when its own is done. Retries are the
store's, bounded by ``--retry-deadline``; a listing that still fails, or
a tree too large for ``--metadata-cache-size``, ends the prefetch with a
log line, and the directories not cached by then are listed on demand as
without it.

As soon as every key below a directory is listed, its listing goes into
the metadata cache as if readdir had listed it, timed from when the
prefetch began so TTLs run as for any listing. Directories this mount
changed while the prefetch ran are skipped (their listing would be
stale), as are directories a readdir cached meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio
import trio.lowlevel

from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import FolderMeta, ListPage, ObjectMeta, listed_meta
from rapidmount.storage.seam import LIST_PAGE_SIZE, ObjectStore
from rapidmount.listing.ranges import KeyRange, RangePlan, choose_boundaries, prefix_end
from rapidmount.listing.tree import TreeListing
from rapidmount.superblock.metadata_cache import MetadataCache
from rapidmount.superblock.names import HiddenNames, parent_prefix

log = logging.getLogger("rapidmount.listing")

RANGES_PER_WORKER = 4  # initial ranges per worker, before any stealing
SAMPLE_DEPTH = 3  # directory levels the split sample may descend
SAMPLE_FANOUT = 16  # directories listed per level for the sample
PROGRESS_INTERVAL = 2.0
INSTALL_INTERVAL = 0.2  # how often complete directories are cached while listing

_Record = TypeVar("_Record", ObjectMeta, FolderMeta)
#: ``fetch(start, end, token)``: one page of a range, as (names, records, next token)
_PageFetch = Callable[[str, str | None, str], Awaitable[tuple[list[str], list[_Record], str]]]


class MetadataPreload:
    """One prefetch of the tree below ``root``; :meth:`run` it in a nursery."""

    def __init__(self, *, store: ObjectStore, meta: MetadataCache, hidden: HiddenNames, root: str,
                 workers: int) -> None:
        self.store = store
        self.meta = meta
        self.hidden = hidden
        self.root = root
        self.hierarchical = store.layout.folders
        self.workers = workers
        self.running = False
        self.finished = trio.Event()
        self.directories_cached = 0
        self._wake = trio.Event()
        self._failure: str | None = None
        self._dirty_dirs: set[str] = set()
        self._dirty_trees: set[str] = set()
        self._listed_at = 0.0
        self._folder_plan: RangePlan | None = None
        self._tree = TreeListing(root)
        self._workers_left = 0
        self._cache_full = False
        self._installer_scope = trio.CancelScope()

    def note_change(self, path: str) -> None:
        """This mount changed ``path``: the prefetched view of its directory,
        and of everything below it, is stale."""
        if self.running:
            self._dirty_dirs.add(parent_prefix(path))
            self._dirty_trees.add(path.rstrip("/") + "/")

    def _is_dirty(self, prefix: str) -> bool:
        if prefix in self._dirty_dirs:
            return True
        return any(prefix.startswith(tree) for tree in self._dirty_trees)

    async def run(self) -> None:
        where = f"gs://{self.store.bucket}/{self.root}"
        if self.meta.listing_ttl == 0:
            log.warning("metadata prefetch of %s skipped: listings are not cached (--listing-ttl 0)", where)
            self.finished.set()
            return
        try:
            await self._run(where)
        except Exception:  # the mount goes on without the prefetch
            log.exception("metadata prefetch of %s failed; directories are listed on demand", where)

    async def _run(self, where: str) -> None:
        self.running = True
        started = time.monotonic()
        self._listed_at = self.meta.now()
        log.info("metadata prefetch of %s started with %d workers", where, self.workers)
        try:
            tree, plan = await self._list()
            listing_seconds = time.monotonic() - started
            # Whatever is complete goes in, even when the listing stopped early.
            await self._install_complete(plan, tree)
            elapsed = time.monotonic() - started
            if self._failure is not None:
                log.warning("metadata prefetch of %s stopped: %s; %d directories cached, the others are "
                            "listed on demand", where, self._failure, self.directories_cached)
                return
            log.info("metadata prefetch of %s done in %.2f s: %d objects listed in %.2f s "
                     "(%.0f objects/s; %d ranges, %d steals, %d pages), %d of %d directories cached",
                     where, elapsed, tree.objects, listing_seconds, tree.objects / max(listing_seconds, 1e-9),
                     len(plan.ranges), plan.steals, sum(r.pages for r in plan.ranges),
                     self.directories_cached, tree.directories_seen)
        finally:
            self.running = False
            self._dirty_dirs.clear()
            self._dirty_trees.clear()
            self.finished.set()

    # -- listing ------------------------------------------------------------------------------

    async def _list(self) -> tuple[TreeListing, RangePlan]:
        tree = self._tree = TreeListing(self.root)
        plan = RangePlan(self.root)
        wanted = self.workers * RANGES_PER_WORKER
        try:
            keys = await self._sample(wanted)
        except StorageError as err:
            self._failure = str(err)
            return tree, plan
        boundaries = choose_boundaries(keys, wanted)
        plan = RangePlan(self.root, None, boundaries)
        # Folders (hierarchical namespace) are listed in parallel ranges too,
        # by a smaller pool: there are far fewer folders than objects.
        folder_workers = max(1, self.workers // 4) if self.hierarchical else 0
        # One range per folder worker: one page lists a thousand folders, and
        # stealing splits the rest once a page says there are more.
        folder_plan = RangePlan(self.root, None, choose_boundaries(keys, folder_workers - 1)) \
            if self.hierarchical else None
        self._folder_plan = folder_plan
        async with trio.open_nursery() as outer:
            outer.start_soon(self._report_progress, plan)
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._installer_scope = trio.CancelScope()
                nursery.start_soon(self._install_while_listing, plan, tree)
                self._workers_left = self.workers + folder_workers
                for _ in range(self.workers):
                    nursery.start_soon(self._worker, plan, self._object_page, tree.add_objects)
                if folder_plan is not None:
                    for _ in range(folder_workers):
                        nursery.start_soon(self._worker, folder_plan, self._folder_page, tree.add_folders)
            outer.cancel_scope.cancel()
        return tree, plan

    async def _sample(self, wanted: int) -> list[str]:
        """Keys to split at: a first page of the root's entries, descending a
        few levels while they are too few (a tree under one "train/")."""
        keys: list[str] = []
        level = [self.root]
        for _ in range(SAMPLE_DEPTH):
            pages: list[ListPage] = []
            errors: list[StorageError] = []

            async def one_page(prefix: str, pages: list[ListPage], errors: list[StorageError]) -> None:
                try:
                    pages.append(await self.store.list_page(prefix, delimiter="/",
                                                        page_size=LIST_PAGE_SIZE))
                except StorageError as err:
                    errors.append(err)

            async with trio.open_nursery() as nursery:
                for prefix in level[:SAMPLE_FANOUT]:
                    nursery.start_soon(one_page, prefix, pages, errors)
            if errors:
                raise errors[0]
            level = sorted(prefix for page in pages for prefix in page.prefixes)
            keys += level
            keys += (meta.name for page in pages for meta in page.objects)
            if len(keys) >= wanted or not level:
                break
        return keys

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
        self._scope.cancel()

    def _signal(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    async def _worker(self, plan: RangePlan, fetch: _PageFetch[_Record],
                      add: Callable[[list[_Record]], None]) -> None:
        try:
            while not plan.finished:
                key_range = plan.assign()
                if key_range is None:
                    await self._wake.wait()  # until some page moves a plan on
                    continue
                try:
                    await self._list_range(plan, key_range, fetch, add)
                except StorageError as err:
                    self._fail(str(err))
                    return
                finally:
                    self._signal()
        finally:
            self._workers_left -= 1
            if not self._workers_left:
                self._installer_scope.cancel()
            self._signal()

    async def _list_range(self, plan: RangePlan, key_range: KeyRange, fetch: _PageFetch[_Record],
                          add: Callable[[list[_Record]], None]) -> None:
        """Page through one range: ``fetch(start, end, token)`` gives (names,
        records, next token) and ``add`` takes the records the range owns."""
        token = ""
        while (bounds := plan.request(key_range)) is not None:
            names, records, next_token = await fetch(*bounds, token)
            # A page may be empty yet not the last (the server skipped deleted
            # names); only then does the token carry the position.
            token = next_token if not names else ""
            owned = plan.page_done(key_range, names, bool(next_token))
            add(records[:len(owned)])
            if not self.meta.room_for(self._tree.estimated_bytes):
                self._fail(f"the tree needs more than --metadata-cache-size={self.meta.budget_bytes} bytes "
                           f"({plan.listed} listed so far)")
                return
            self._signal()

    async def _object_page(self, start: str, end: str | None, token: str) -> tuple[list[str], list[ObjectMeta], str]:
        page = await self.store.list_page(self.root, delimiter="", page_token=token,
                                      start=start, end=end or "", page_size=LIST_PAGE_SIZE)
        return [meta.name for meta in page.objects], page.objects, page.next_page_token

    async def _folder_page(self, start: str, end: str | None, token: str) -> tuple[list[str], list[FolderMeta], str]:
        folders, next_token = await self.store.list_folders_page(self.root, page_token=token,
                                                     start=start, end=end or "")
        return [folder.name for folder in folders], folders, next_token

    async def _report_progress(self, plan: RangePlan) -> None:
        started = time.monotonic()
        while True:
            await trio.sleep(PROGRESS_INTERVAL)
            listed = plan.listed
            log.info("metadata prefetch: %d objects listed, %d directories cached, %d ranges (%d busy, "
                     "%d steals), %.0f objects/s", listed, self.directories_cached, len(plan.ranges), plan.busy,
                     plan.steals, listed / (time.monotonic() - started))

    # -- filling the cache --------------------------------------------------------------------

    async def _install_while_listing(self, plan: RangePlan, tree: TreeListing) -> None:
        """Cache directories as soon as everything below them is listed, so
        they serve requests before the whole tree is done."""
        with self._installer_scope:  # cancelled by the last worker: the final pass follows
            while True:
                await trio.sleep(INSTALL_INTERVAL)
                before = self.directories_cached
                await self._install_complete(plan, tree)
                if self._cache_full:
                    self._fail(f"--metadata-cache-size={self.meta.budget_bytes} bytes is full")
                    return
                if self.directories_cached > before:
                    log.debug("metadata prefetch: %d complete directories cached while listing",
                              self.directories_cached)

    async def _install_complete(self, plan: RangePlan, tree: TreeListing) -> None:
        """Cache every directory whose keys are all listed, shallow ones first,
        within the budget (never evicting what is cached)."""
        if self._cache_full or (self._folder_plan is not None and not self._folder_plan.finished):
            return  # an empty folder may still show up anywhere
        coverage = plan.coverage()
        complete = [prefix for prefix in tree.directories() if coverage.covers(prefix, prefix_end(prefix))]
        for count, prefix in enumerate(complete):
            if count % 64 == 63:
                await trio.lowlevel.checkpoint()  # let FUSE requests in between
            entries, hidden = tree.take(prefix, self.hidden, is_symlink=lambda record: listed_meta(record).is_symlink)
            for message, args in self.hidden.messages(hidden):
                log.warning(message, *args)
            if self._is_dirty(prefix) or self.meta.get_listing(prefix) is not None:
                continue  # this mount knows better
            if not self.meta.room_for(self.meta.listing_bytes(prefix, entries)):
                log.warning("metadata prefetch: --metadata-cache-size is full after %d directories",
                            self.directories_cached)
                self._cache_full = True
                return
            self.meta.put_listing(prefix, entries, listed_at=self._listed_at)
            self.directories_cached += 1
