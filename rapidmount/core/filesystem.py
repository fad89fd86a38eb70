"""The filesystem core: POSIX operations over one bucket, in trio.

:class:`Filesystem` dispatches each operation to the part that owns it and
coordinates them where one operation touches several:

- ``namespace``: names, inodes, the metadata cache, listings, name changes;
- ``writes``: the per-file write state machine (streaming, staged, uploads);
- ``reads``: the chain of readers behind ``read()``;
- ``scan_ahead`` and the metadata ``preload``: fetching before anyone asks.

It knows nothing of FUSE (``rapidmount.fuse.operations`` translates) and reaches
storage only through one :class:`rapidmount.storage.seam.ObjectStore`.
Errors leave as :class:`FSError` carrying the errno FUSE returns.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator

import trio

from rapidmount.cache.page_cache import BlockKey, PageCache
from rapidmount.daemon.config import MountConfig
from rapidmount.core.attributes import AttributeBuilder, Attributes
from rapidmount.core.errors import FSError, RetryRefused, storage_call
from rapidmount.core.handles import CacheModes, HandleTable, IoMode, OpenDir, OpenFile
from rapidmount.core.kernel import BackingFiles, KernelCache
from rapidmount.core.namespace import Namespace
from rapidmount.core.reads import Blocks, Data, KernelPages, ReadPath
from rapidmount.core.stats import FSStats
from rapidmount.core.writes import Follow, WritePath
from rapidmount.listing.preload import MetadataPreload
from rapidmount.localcache.cache import LocalCache, LocalFile
from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner
from rapidmount.readahead.policy import ReadaheadPolicy
from rapidmount.scanahead.files import ScanAhead
from rapidmount.storage.model import MODE_METADATA_KEY, MTIME_METADATA_KEY, ObjectMeta, format_mtime
from rapidmount.storage.seam import ObjectStore, Answer
from rapidmount.superblock.inodes import ROOT_INODE, Inode
from rapidmount.superblock.names import EntryKind, component_from_fuse
from rapidmount.shared.views import Arriving, Gathered

__all__ = ["Filesystem", "FSError"]

log = logging.getLogger("rapidmount.fs")

STATFS = {"f_bsize": 1 << 20, "f_frsize": 4096, "f_blocks": 1 << 40, "f_bfree": 1 << 40,
          "f_bavail": 1 << 40, "f_files": 1 << 32, "f_ffree": 1 << 32, "f_favail": 1 << 32,
          "f_namemax": 255}
#: Handles released at once when unmounting (each may make its last upload).
CLOSE_ALL_AT_ONCE = 64


class Filesystem:
    def __init__(self, config: MountConfig, store: ObjectStore, *, uid: int, gid: int,
                 clock: Callable[[], float] = time.monotonic, local: LocalCache | None = None) -> None:
        self.config = config
        self.store = store
        self.layout = store.layout
        self.stats = FSStats()
        self.cache = PageCache(config.page_cache_budget, config.cache_block_size)
        self.namespace = Namespace(config, store, self.cache, self.stats, clock=clock)
        self.meta = self.namespace.meta
        self.root_prefix = self.namespace.root_prefix
        self.writes = WritePath(config, store, self.namespace, self.stats)
        self.namespace.is_writing = self.writes.knows_better
        self.pages = KernelPages(store, lambda ino: self.writes.pending(ino) is not None)
        self._step_blocks = max(1, config.readahead_step // config.cache_block_size)
        # One event per rename under way, set once its files' handles followed it.
        self._renames: set[trio.Event] = set()
        self.blocks = Blocks(self.cache, self.stats, self.pages, step_blocks=self._step_blocks,
                             renames_done=self._renames_done)
        #: the local cache (--cache-dir), and the kernel's passthrough of its files where the FUSE layer has it
        self.local = local
        self.backing: BackingFiles | None = None
        self.namespace.on_change = self._changed
        self.reads = ReadPath(self.namespace, self.writes, self.blocks, self.stats, local)
        self.handles = HandleTable()
        self.cache_modes = CacheModes(direct_writes=not config.no_direct_writes)
        self.attributes = AttributeBuilder(config, self.meta, uid=uid, gid=gid, mount_time_ns=time.time_ns())
        # The generation whose pages the kernel may still hold, per inode.
        self._kernel_generation: dict[int, int] = {}
        self._nursery: trio.Nursery | None = None
        self.scan_ahead: ScanAhead | None = None
        self.preload: MetadataPreload | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the core the nursery its background fetches run in."""
        self._nursery = nursery
        self.blocks.fetcher = BlockFetcher(self.cache, nursery)
        if self.config.prefetch_files > 0:
            self.scan_ahead = ScanAhead(self.config, self.store, self.meta, self.stats, self.blocks.fetcher,
                                        nursery, self.namespace.listing)
        if self.config.prefetch_metadata:
            self.preload = MetadataPreload(store=self.store, meta=self.meta, hidden=self.namespace.hidden,
                                           root=self.root_prefix, workers=self.config.prefetch_metadata_workers)
            nursery.start_soon(self.preload.run)
        if self.local is not None:
            self.local.attach(nursery)
            if self.scan_ahead is not None:
                self.scan_ahead.skip = self.local.holds

    def _changed(self, path: str) -> None:
        """This mount changed ``path``, or saw another client change it."""
        if self.local is not None:
            self.local.forget(path)
        if self.preload is not None:
            self.preload.note_change(path)

    @property
    def kernel(self) -> KernelCache:
        return self.namespace.kernel

    @kernel.setter
    def kernel(self, kernel: KernelCache) -> None:
        self.namespace.kernel = kernel

    def open_streams(self) -> tuple[int, int]:
        """(read, write) streams open now; safe to call from another thread."""
        reading = sum(1 for h in self.handles.snapshot() if isinstance(h, OpenFile) and h.reader.stream_open)
        writing = sum(1 for w in self.writes.snapshot() if w.appender is not None and w.appender.stream_open)
        return reading, writing

    # -- attributes -------------------------------------------------------------------------------

    def inode(self, ino: int) -> Inode:
        return self.namespace.inode(ino)

    def attributes_of(self, inode: Inode) -> Attributes:
        return self.attributes.of(inode)

    async def lookup(self, parent_ino: int, raw_name: bytes) -> Inode:
        return await self.namespace.lookup(parent_ino, raw_name)

    async def getattr(self, ino: int) -> Inode:
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR:
            if ino == ROOT_INODE:
                await self.namespace.load_root()  # once
            return inode
        state = self.writes.pending(ino)
        if state is not None:
            inode.size = state.size  # our own writes are the truth while they are pending
            return inode
        await self.namespace.refresh(inode)
        return inode

    def access(self, ino: int, mode: int) -> None:
        self.inode(ino)
        if self.config.read_only and mode & os.W_OK:
            raise FSError(errno.EROFS)

    def chown(self, ino: int) -> None:
        """chown succeeds without effect, as in gcsfuse: owners come from --uid/--gid."""
        self.inode(ino)
        self.namespace.check_writable()

    async def _chmod(self, ino: int, mode: int) -> Inode:
        """Without --preserve-mode, as chown. With it, a file's permission bits
        go into its object metadata (``mode``), kept by later uploads too."""
        self.chown(ino)
        inode = self.inode(ino)
        if not self.config.preserve_mode or inode.kind is not EntryKind.FILE:
            return inode
        self._check_not_refused(inode)
        inode.permissions = mode & 0o7777
        if self.writes.keep_mode(ino) or not inode.generation:
            return inode  # stored with the file's next upload or close (see WritePath._metadata)
        return await self._update_metadata(inode, MODE_METADATA_KEY, f"{stat.S_IFREG | inode.permissions:o}")

    async def _update_metadata(self, inode: Inode, key: str, value: str) -> Inode:
        """One custom metadata key of the generation and metageneration this mount showed."""
        meta = await self.namespace.guarded(
            self.inode(inode.parent), inode.name, self.store.update_metadata, inode.path, inode.generation,
            {key: value}, if_metageneration_match=inode.metageneration or None)
        self.namespace.changed(inode.path)
        self.meta.put_object(meta)
        self.namespace.apply(inode, meta)
        return inode

    def link(self) -> None:
        raise FSError(errno.EPERM, "hard links are not supported")

    def forget(self, items: list[tuple[int, int]]) -> None:
        for ino in self.namespace.forget(items):
            self._kernel_generation.pop(ino, None)

    async def readlink(self, ino: int) -> str:
        return await self.namespace.readlink(ino)

    def statfs(self) -> dict[str, int]:
        return dict(STATFS)

    # -- directories ------------------------------------------------------------------------------

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
            yield "..", self.inode(directory.parent or ROOT_INODE), 2
        for index in range(max(start, 2) - 2, len(handle.entries)):
            entry = handle.entries[index]
            yield entry.name, self.namespace.entry_inode(directory, entry), index + 3

    def entry_returned(self, ino: int) -> None:
        self.namespace.inodes.lookup(ino)

    def releasedir(self, fh: int) -> None:
        handle = self.handles.pop(fh)
        if isinstance(handle, OpenDir):
            self.namespace.inodes.closed(handle.inode.ino)

    # -- opening and closing files ----------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> tuple[int, bool, bool]:
        """Open for reading, writing or both; returns (fh, direct_io, keep_cache)."""
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        writable = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if (writable or flags & os.O_TRUNC) and self.config.read_only:
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
        policy = ReadaheadPolicy(self.config.cache_block_size, self.config.readahead_initial,
                                 self.config.readahead_max, stores_ahead=self.pages.enabled and not direct_io,
                                 step_blocks=self._step_blocks,
                                 sequential_slack=self.config.max_request_size)  # at least 1 MiB
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
        if handle.finalized and 0 < handle.size <= self.config.small_file_size:
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

    # -- data -------------------------------------------------------------------------------------

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

    async def _truncate(self, ino: int, size: int) -> Inode:
        self.namespace.check_writable()
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        self._check_not_refused(inode)
        if self.local is not None:
            self.local.forget(inode.path)
        async with self.pages.changing(ino):
            await self.writes.truncate(inode, size)
        return inode

    def _check_not_refused(self, inode: Inode) -> None:
        if inode.parent in self.namespace.inodes:
            self.namespace.check_not_refused((self.inode(inode.parent), inode.name))

    def _stale_on(self, err: FSError, inode: Inode) -> None:
        """A refused fsync or close (ESTALE): another client changed the object.
        The kernel does not retry these, so no retry is refused."""
        if err.errno == errno.ESTALE and inode.parent in self.namespace.inodes:
            self.namespace.stale(self.inode(inode.parent), inode.name, refused=False)

    async def _set_mtime(self, ino: int, mtime_ns: int) -> Inode:
        """Store a file's mtime as gcsfuse does (metadata ``gcsfuse_mtime``); a
        directory's, the same way in its placeholder object."""
        self.namespace.check_writable()
        inode = self.inode(ino)
        self._check_not_refused(inode)
        if inode.kind is EntryKind.DIR:
            await self.namespace.set_directory_mtime(inode, mtime_ns)
            return inode
        if self.writes.keep_mtime(ino, mtime_ns) or not inode.generation:
            inode.mtime_ns = mtime_ns  # open files store it with their last upload
            return inode
        return await self._update_metadata(inode, MTIME_METADATA_KEY, format_mtime(mtime_ns))

    # -- changes by path: Linux retries them once after ESTALE ---------------------------------------

    async def unlink(self, parent_ino: int, raw_name: bytes) -> None:
        with self._refusing((parent_ino, raw_name)):
            await self._unlink(parent_ino, raw_name)

    async def rename(self, old_parent_ino: int, raw_old: bytes, new_parent_ino: int, raw_new: bytes,
                     flags: int = 0) -> None:
        done = trio.Event()
        self._renames.add(done)
        try:
            with self._refusing((old_parent_ino, raw_old), (new_parent_ino, raw_new)):
                await self._rename(old_parent_ino, raw_old, new_parent_ino, raw_new, flags)
        finally:
            self._renames.discard(done)
            done.set()

    async def _renames_done(self) -> None:
        """Until the renames under way now are over. Between the bucket moving
        an object and its answer reaching this mount, a stream opened under
        the old name finds nothing there; the handles go on under the new name
        only once the answer came (:meth:`_follow_move`)."""
        for done in list(self._renames):
            await done.wait()

    async def truncate(self, ino: int, size: int, fh: int | None = None) -> Inode:
        """truncate(2), or ftruncate(2) of the handle ``fh`` (the same: a
        file's pending changes are shared by all its handles)."""
        with self._refusing(self._name_of(ino)):
            return await self._truncate(ino, size)

    async def set_mtime(self, ino: int, mtime_ns: int) -> Inode:
        with self._refusing(self._name_of(ino)):
            return await self._set_mtime(ino, mtime_ns)

    async def chmod(self, ino: int, mode: int) -> Inode:
        with self._refusing(self._name_of(ino)):
            return await self._chmod(ino, mode)

    def _name_of(self, ino: int) -> tuple[int, bytes] | None:
        inode = self.namespace.inodes.get(ino) if ino in self.namespace.inodes else None
        return None if inode is None else (inode.parent, inode.name.encode("utf-8", "surrogateescape"))

    @contextlib.contextmanager
    def _refusing(self, *names: tuple[int, bytes] | None) -> Iterator[None]:
        """ESTALE from a change by path: the kernel will look the names up
        afresh and retry once. Drop them everywhere, and refuse that retry,
        which would otherwise change an object the user never saw."""
        try:
            yield
        except FSError as err:
            if err.errno == errno.ESTALE and not isinstance(err, RetryRefused):
                self._forget_refused(names)
            raise

    def _forget_refused(self, names: tuple[tuple[int, bytes] | None, ...]) -> None:
        for item in names:
            if item is None or item[0] not in self.namespace.inodes:
                continue
            name = component_from_fuse(item[1])
            if name is not None:
                self.namespace.stale(self.inode(item[0]), name)

    # -- names ------------------------------------------------------------------------------------

    async def _unlink(self, parent_ino: int, raw_name: bytes) -> None:
        parent, name, entry = await self.namespace.existing(parent_ino, raw_name)
        if entry.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        async with self.writes.unlinking(self.namespace.inodes.child(parent.ino, name)):
            generation = self.namespace.seen_generation(parent, name, entry)
            await self.namespace.unlink(parent, name, generation)

    async def mkdir(self, parent_ino: int, raw_name: bytes) -> Inode:
        return await self.namespace.mkdir(parent_ino, raw_name)

    async def rmdir(self, parent_ino: int, raw_name: bytes) -> None:
        await self.namespace.rmdir(parent_ino, raw_name)

    async def symlink(self, parent_ino: int, raw_name: bytes, target: bytes) -> Inode:
        return await self.namespace.symlink(parent_ino, raw_name, target)

    async def _rename(self, old_parent_ino: int, raw_old: bytes, new_parent_ino: int, raw_new: bytes,
                      flags: int = 0) -> None:
        ns = self.namespace
        ns.check_writable()
        if flags:
            raise FSError(errno.EINVAL)  # RENAME_NOREPLACE / RENAME_EXCHANGE are not supported
        old_parent, new_parent = ns.directory(old_parent_ino), ns.directory(new_parent_ino)
        old_name, new_name = ns.new_name(raw_old), ns.new_name(raw_new)
        entry = await ns.find(old_parent, old_name)
        if entry is None:
            raise FSError(errno.ENOENT)
        if (old_parent.ino, old_name) == (new_parent.ino, new_name):
            return  # POSIX: renaming a name onto itself changes nothing
        ns.check_not_refused((old_parent, old_name), (new_parent, new_name))
        target = await ns.find(new_parent, new_name)
        source_path, target_path = old_parent.path + old_name, new_parent.path + new_name
        moved_meta = None
        open_below: list[Inode] = []
        if entry.kind is EntryKind.DIR:
            if target is not None:
                if target.kind is not EntryKind.DIR:
                    raise FSError(errno.ENOTDIR)
                if not await ns.directory_is_empty(target_path + "/"):
                    raise FSError(errno.ENOTEMPTY)
            # Files below it being written go first, as a file's own rename does:
            # the folder moves their objects, and every byte must be in them.
            moving: list[Inode | None] = list(self.writes.below(source_path + "/"))
        else:
            if target is not None and target.kind is EntryKind.DIR:
                raise FSError(errno.EISDIR)
            moving = [ns.inodes.child(old_parent.ino, old_name)]  # its pending writes go first
        async with self.writes.moving(moving) as follow:
            if entry.kind is EntryKind.DIR:
                open_below = [handle.inode for handle in self.handles.snapshot()
                              if isinstance(handle, OpenFile) and handle.inode.path.startswith(source_path + "/")]
                await ns.rename_directory(source_path + "/", target_path + "/", target is not None)
            else:
                generation = ns.seen_generation(old_parent, old_name, entry)
                if generation == 0:
                    # This mount's own file whose upload never happened or was
                    # refused: the object under the name, if any, is not it.
                    ns.stale(old_parent, old_name)
                    raise FSError(errno.ESTALE, f"{source_path!r} was never stored; the name is another client's")
                # A replaced file still open for writing loses its name, as by unlink:
                # its handles must not upload over the moved file.
                replaced = ns.inodes.child(new_parent.ino, new_name) if target is not None else None
                async with self.writes.unlinking(replaced):
                    moved_meta = await ns.move_file(old_parent, old_name, new_parent, new_name, generation,
                                                    ns.seen_generation(new_parent, new_name, target))
            moved = ns.renamed(old_parent, old_name, new_parent, new_name, moved_meta)
            if moved is not None and moved_meta is not None:
                await self._follow_move(moved, moved_meta, follow)
            for inode in {inode.ino: inode for inode in open_below}.values():
                # Open files below a moved folder go on under their new names too.
                meta = await storage_call(self.store.get_object, inode.path)
                if meta is not None:
                    await self._follow_move(inode, meta, follow)

    async def _follow_move(self, inode: Inode, moved: ObjectMeta, follow: Follow) -> None:
        """Open handles of a renamed file go on under its new name."""
        await follow(inode, moved)
        for handle in self.handles.files_of(inode.ino):
            self._reopen(handle, moved.generation)
        self._kernel_generation.pop(inode.ino, None)
