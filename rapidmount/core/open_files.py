"""Open files: the handle side of the filesystem core.

Opening and creating files, reading and writing through a handle, flush,
fsync and release, and the bookkeeping of each handle (its generation and
stream, its cache mode, the local cache's copy, the kernel's view of its
pages); directory handles and the listings read through them too.
:class:`OpenFiles` is the base of
:class:`rapidmount.core.filesystem.Filesystem`, which builds the parts named
below and adds the attribute and namespace entry points.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import AsyncIterator

import trio

from rapidmount.cache.page_cache import BlockKey, PageCache
from rapidmount.core.errors import FSError
from rapidmount.core.handles import CacheModes, HandleTable, IoMode, OpenDir, OpenFile
from rapidmount.core.kernel import BackingFiles
from rapidmount.core.namespace import Namespace
from rapidmount.core.reads import Blocks, Data, KernelPages, ReadPath
from rapidmount.core.settings import CoreSettings
from rapidmount.core.stats import FSStats
from rapidmount.core.writes import WritePath
from rapidmount.localcache.cache import LocalCache, LocalFile
from rapidmount.readahead.fetcher import FetchOwner
from rapidmount.readahead.policy import ReadaheadPolicy
from rapidmount.scanahead.files import ScanAhead
from rapidmount.storage.model import ObjectMeta
from rapidmount.storage.seam import Answer, ObjectStore
from rapidmount.superblock.inodes import ROOT_INODE, Inode
from rapidmount.superblock.metadata_cache import MetadataCache
from rapidmount.superblock.names import EntryKind
from rapidmount.shared.views import Arriving, Gathered

log = logging.getLogger("rapidmount.fs")

#: Handles released at once when unmounting (each may make its last upload).
CLOSE_ALL_AT_ONCE = 64


class OpenFiles:
    """The entry points of open files; the parts they use are built by
    :class:`~rapidmount.core.filesystem.Filesystem`."""

    settings: CoreSettings
    store: ObjectStore
    stats: FSStats
    cache: PageCache
    namespace: Namespace
    meta: MetadataCache
    writes: WritePath
    pages: KernelPages
    blocks: Blocks
    reads: ReadPath
    handles: HandleTable
    cache_modes: CacheModes
    local: LocalCache | None  # the local cache (--cache-dir)
    backing: BackingFiles | None  # the kernel's passthrough of its files, where the FUSE layer has it
    scan_ahead: ScanAhead | None
    _step_blocks: int  # blocks per readahead call
    _kernel_generation: dict[int, int]  # the generation whose pages the kernel may still hold, per inode
    _nursery: trio.Nursery | None

    # -- opening and closing files -----------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> tuple[int, bool, bool]:
        """Open for reading, writing or both; returns (fh, direct_io, keep_cache)."""
        inode = self.namespace.inode(ino)
        if inode.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        writable = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if (writable or flags & os.O_TRUNC) and self.settings.read_only:
            raise FSError(errno.EROFS)
        # Close-to-open consistency: a stale view is refreshed at open. The
        # last release of a writer may still be uploading (the kernel sends it
        # after close() returned; a truncation alone is uploaded there): wait
        # for it, so the refresh finds the file's new generation.
        if await self.writes.settle(ino) is None:
            await self.namespace.refresh(inode)
        local = await self._local_copy(inode, flags) if not writable else None
        fh = self.handles.next_fh()
        mode = self.cache_modes.mode(fh, ino, flags, local_copy=local is not None and local.whole
                                     and self.backing is not None)
        backing_id = None
        if mode is IoMode.PASSTHROUGH:
            assert local is not None and self.backing is not None
            backing_id = self.backing.open(ino, local.fd, local.identity)
            if backing_id is None:
                mode = self.cache_modes.refused(fh)
        direct_io = mode is IoMode.DIRECT
        keep_cache = mode is IoMode.CACHED and self._kernel_generation.get(ino) == inode.generation
        if mode is IoMode.CACHED:
            self._kernel_generation[ino] = inode.generation
        if self.local is not None and local is not None:
            if backing_id is not None:
                self.local.stats.passthrough_opens += 1
            else:
                self.local.stats.daemon_opens += 1
        policy = ReadaheadPolicy(self.settings.cache_block_size, self.settings.readahead_initial,
                                 self.settings.readahead_max, stores_ahead=self.pages.enabled and not direct_io,
                                 step_blocks=self._step_blocks,
                                 sequential_slack=self.settings.max_request_size)  # at least 1 MiB
        handle = OpenFile(fh, inode, inode.generation, inode.size, inode.finalized, direct_io, policy,
                          self.store.open_reader(inode.path, inode.generation), writable=writable,
                          append_only=bool(flags & os.O_APPEND))
        handle.local, handle.backing_id = local, backing_id
        self.handles.add(handle)
        self.namespace.inodes.opened(ino)
        if (not writable and not direct_io and local is None and self.writes.pending(ino) is None
                and self.blocks.fetcher is not None):
            self._fetch_ahead_of_reads(handle)
        if writable:
            if self.local is not None and flags & os.O_TRUNC:
                self.local.forget(inode.path)
            try:
                async with self.pages.changing(ino):
                    await self.writes.opened(inode, truncate=bool(flags & os.O_TRUNC))
            except BaseException:
                # The kernel never gets this handle, so no release comes for it.
                self.handles.pop(fh)
                self.cache_modes.closed(fh)
                self.namespace.inodes.closed(ino)
                if self._nursery is not None:
                    self._nursery.start_soon(handle.reader.close)  # nothing waits on it
                raise
        return fh, direct_io, keep_cache

    async def _local_copy(self, inode: Inode, flags: int) -> LocalFile | None:
        """A read-only open's copy of its generation in the local cache, if any."""
        if self.local is None or flags & os.O_TRUNC or self.writes.pending(inode.ino) is not None:
            return None
        meta = self.meta.get(inode.path)
        crc32c = meta.crc32c if isinstance(meta, ObjectMeta) and meta.generation == inode.generation else None
        try:
            return await self.local.open(inode.path, inode.generation, inode.size, crc32c)
        except OSError as err:  # the cache's file system: the bucket serves this open
            log.warning("local cache: cannot open the copy of %s: %s", inode.path, err.strerror or err)
            return None

    def backing_of(self, fh: int) -> int | None:
        """The backing id the kernel reads handle ``fh`` through (passthrough), if any."""
        handle = self.handles.get(fh)
        return handle.backing_id if isinstance(handle, OpenFile) else None

    def _fetch_ahead_of_reads(self, handle: OpenFile) -> None:
        """At open: start fetching what the reads are about to ask for."""
        inode = handle.inode
        if handle.finalized and 0 < handle.size <= self.settings.small_file_size:
            # The stream opens with a request for the whole object: one round trip.
            self.stats.whole_file_fetches += 1
            handle.whole = True
            self.blocks.start(handle, range(-(-handle.size // self.cache.block_size)), handle.size, prefetch=False)
        if self.scan_ahead is not None and inode.parent:
            try:
                directory = self.namespace.inodes.get(inode.parent).path
            except KeyError:
                return
            self.scan_ahead.opened(directory, inode.name, BlockKey(inode.path, handle.generation, 0))

    async def create(self, parent_ino: int, raw_name: bytes, flags: int) -> tuple[int, Inode]:
        """Create and open a new file; returns (fh, inode)."""
        parent, name = await self.namespace.free_name(parent_ino, raw_name)
        inode = await self.writes.create(parent, name)
        fh, _, _ = await self.open(inode.ino, flags & ~os.O_TRUNC)
        return fh, inode

    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        if not isinstance(handle, OpenFile):
            return
        handle.owner.cancel_all()
        self.cache_modes.closed(fh)
        if handle.writable:
            with trio.CancelScope(shield=True):
                ended = await self.writes.closed(handle.inode)
                if ended is not None:
                    # The next open sees the bucket's view, including its size.
                    self._kernel_generation.pop(handle.inode.ino, None)
                    if ended.failure is not None:
                        # An upload refused here (a truncation alone is uploaded
                        # at the release): the next lookup finds the other object.
                        self._stale_on(ended.failure, handle.inode)
        self.namespace.inodes.closed(handle.inode.ino)
        if handle.local is not None:
            if handle.backing_id is not None and self.backing is not None:
                self.backing.close(handle.inode.ino)
            handle.local.close()
        # Even an idle reader: a fetch that was on its way when the handle was
        # released must find it closed, not open a stream nobody would close.
        retired, handle.retired = handle.retired, []
        for owner, _ in retired:
            owner.cancel_all()
        with trio.CancelScope(shield=True):
            await handle.reader.close()
            for _, reader in retired:
                await reader.close()

    async def close_all(self) -> None:
        """Release every open handle (unmounting). The files' last uploads run
        side by side: a service that fails them costs one --retry-deadline in
        all, not one per open file."""
        if self.scan_ahead is not None:
            self.scan_ahead.stop()
        limiter = trio.CapacityLimiter(CLOSE_ALL_AT_ONCE)

        async def release(fh: int) -> None:
            async with limiter:
                await self.release(fh)

        async with trio.open_nursery() as nursery:
            for handle in self.handles.snapshot():
                if isinstance(handle, OpenFile):
                    nursery.start_soon(release, handle.fh)
                else:
                    self.releasedir(handle.fh)

    # -- data --------------------------------------------------------------------------------------

    async def read(self, fh: int, offset: int, size: int, gather: bool = False,
                   reply: Answer | None = None) -> Data | Gathered:
        """The bytes; with ``gather``, a read over several cached blocks comes
        as a :class:`Gathered` of their views instead of one joined copy;
        ``reply.sent`` once the storage answered that READ itself."""
        handle = self._current(self.handles.file(fh))
        handle.reads += 1
        try:
            return await self.reads.read(handle, offset, size, gather, reply)
        finally:
            handle.reads -= 1
            if handle.retired:
                self._close_retired(handle)

    def read_now(self, fh: int, offset: int, size: int) -> Data | None:
        """``read``, done at once when it needs no wait (within one cached
        block); None otherwise, or for anything ``read`` would refuse."""
        handle = self.handles.get(fh)
        if not isinstance(handle, OpenFile):
            return None
        return self.reads.read_now(self._current(handle), offset, size)

    def _current(self, handle: OpenFile) -> OpenFile:
        """The handle, brought up to what the mount knows of its file.

        * Its generation grew (an appendable object, by this mount's appends
          or seen in a stat): it reads up to the new size, which the kernel
          may already ask for; a READ answered short there would leave the
          kernel's pages zero-filled.
        * This mount's own writes made a new generation, and are done: the
          handle moves on to it. While they were pending every handle read
          them, and the kernel keeps one page cache per inode for all its
          handles: a handle still on the old generation would put old bytes
          there for the others. (Another client's generation is a new inode,
          whose handles stay pinned.) Reads and fetches already on their way
          finish on the old stream, which is closed once they are done.
        """
        inode = handle.inode
        if handle.generation == inode.generation:
            if not handle.finalized and inode.size > handle.size:
                handle.size, handle.finalized = inode.size, inode.finalized
        elif inode.generation and not inode.detached and self.writes.pending(inode.ino) is None:
            self._reopen(handle, inode.generation)
            handle.finalized = inode.finalized
            handle.size = handle.kernel_size = inode.size  # this mount's writes told the kernel
        return handle

    def _reopen(self, handle: OpenFile, generation: int) -> None:
        """Read on from a new stream of ``generation`` under the inode's name.
        The old stream and its fetches are retired, not cancelled: a read
        waiting on one gets its bytes."""
        handle.retired.append((handle.owner, handle.reader))
        handle.owner = FetchOwner()
        handle.reader = self.store.open_reader(handle.inode.path, generation)
        handle.generation = generation
        self._close_retired(handle)

    def _close_retired(self, handle: OpenFile) -> None:
        """Close the streams of generations the handle left that nothing uses now."""
        if handle.reads or self._nursery is None:
            return
        unused = [(owner, reader) for owner, reader in handle.retired if not owner.active]
        handle.retired = [(owner, reader) for owner, reader in handle.retired if owner.active]
        for _, reader in unused:
            self._nursery.start_soon(reader.close)  # nothing waits on it

    async def write(self, fh: int, offset: int, data: bytes | memoryview | Arriving) -> int:
        handle = self.handles.file(fh)
        if not handle.writable:
            raise FSError(errno.EBADF)
        self._wrote(handle)
        return await self.writes.write(handle.inode, offset, data, handle.append_only)

    def write_now(self, fh: int, offset: int, data: bytes | memoryview | Arriving) -> int | None:
        """``write``, done at once when it needs no wait (a streaming append);
        None otherwise, or for anything ``write`` would refuse."""
        handle = self.handles.get(fh)
        if not isinstance(handle, OpenFile) or not handle.writable:
            return None
        self._wrote(handle)
        return self.writes.write_now(handle.inode, offset, data, handle.append_only)

    def _wrote(self, handle: OpenFile) -> None:
        self.cache_modes.wrote(handle.fh)
        if self.local is not None:
            self.local.forget(handle.inode.path)  # a copy of the file before this write is never served

    def writes_from_page_cache(self, fh: int) -> bool:
        """Whether the kernel takes the bytes of ``fh``'s WRITEs from the page
        cache (not a direct handle: ``O_DIRECT``, or made direct by ``CacheModes``)."""
        handle = self.handles.get(fh)
        return isinstance(handle, OpenFile) and not handle.direct_io

    async def flush(self, fh: int) -> None:
        """close(2) of a descriptor: every byte written so far becomes durable.

        A change that is only a truncation (``O_TRUNC``, ``ftruncate``, no
        byte written since) is not uploaded here but by the next flush after
        a write, an fsync, or the last release: ``echo x > existing`` closes
        a duplicate of its descriptor between the ``O_TRUNC`` and the write,
        and must make one generation, not an empty one and then another.
        """
        self.cache_modes.flushed(fh)
        await self._persist(fh, closing=True)

    async def fsync(self, fh: int) -> None:
        """fsync(2) and fdatasync(2): everything pending becomes durable, a truncation too."""
        await self._persist(fh, closing=False)

    async def _persist(self, fh: int, *, closing: bool) -> None:
        handle = self.handles.get(fh)
        if not isinstance(handle, OpenFile) or not handle.writable:
            return
        state = self.writes.pending(handle.inode.ino)
        if state is not None:
            try:
                await self.writes.persist(state, closing=closing)
            except FSError as err:
                self._stale_on(err, handle.inode)
                raise

    def _stale_on(self, err: FSError, inode: Inode) -> None:
        """A refused fsync or close (ESTALE): another client changed the object.
        The kernel does not retry these, so no retry is refused."""
        if err.errno == errno.ESTALE and inode.parent in self.namespace.inodes:
            self.namespace.stale(self.namespace.inode(inode.parent), inode.name, refused=False)

    # -- open directories --------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        inode = self.namespace.directory(ino)
        fh = self.handles.next_fh()
        self.handles.add(OpenDir(fh, inode))
        self.namespace.inodes.opened(ino)
        return fh

    async def readdir(self, fh: int, start: int) -> AsyncIterator[tuple[str, Inode, int]]:
        """Yield (name, inode, next_offset) from offset ``start`` on.

        The caller must call :meth:`entry_returned` for each entry the kernel
        accepted (it then holds a lookup reference).
        """
        handle = self.handles.directory(fh)
        if handle.entries is None or start == 0:
            handle.entries = await self.namespace.listing(handle.inode.path)
        directory = handle.inode
        # Offsets 0 and 1 are "." and ".."; listing entries follow.
        if start == 0:
            yield ".", directory, 1
        if start <= 1:
            yield "..", self.namespace.inode(directory.parent or ROOT_INODE), 2
        for index in range(max(start, 2) - 2, len(handle.entries)):
            entry = handle.entries[index]
            yield entry.name, self.namespace.entry_inode(directory, entry), index + 3

    def entry_returned(self, ino: int) -> None:
        self.namespace.inodes.lookup(ino)

    def releasedir(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        if isinstance(handle, OpenDir):
            self.namespace.inodes.closed(handle.inode.ino)
