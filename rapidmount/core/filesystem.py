"""The filesystem core: POSIX operations over one bucket, in trio.

:class:`Filesystem` dispatches each operation to the part that owns it and
coordinates them where one operation touches several:

- ``namespace``: names, inodes, the metadata cache, listings, name changes;
- ``writes``: the per-file write state machine (streaming, staged, uploads);
- ``reads``: the chain of readers behind ``read()``;
- ``scan_ahead`` and the metadata ``preload``: fetching before anyone asks.

The entry points of file and directory handles (open, read, write, flush,
fsync, release, readdir) are in ``core/open_files.py``, its base class.

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
from collections.abc import Callable, Iterator

import trio

from rapidmount.cache.page_cache import PageCache
from rapidmount.core.attributes import AttributeBuilder, Attributes
from rapidmount.core.errors import FSError, RetryRefused, storage_call
from rapidmount.core.handles import CacheModes, HandleTable, OpenFile
from rapidmount.core.kernel import BackingFiles, KernelCache
from rapidmount.core.namespace import Namespace
from rapidmount.core.open_files import OpenFiles
from rapidmount.core.reads import Blocks, KernelPages, ReadPath
from rapidmount.core.settings import CoreSettings
from rapidmount.core.stats import FSStats
from rapidmount.core.writes import Follow, WritePath
from rapidmount.listing.preload import MetadataPreload
from rapidmount.localcache.cache import LocalCache
from rapidmount.readahead.fetcher import BlockFetcher
from rapidmount.scanahead.files import ScanAhead
from rapidmount.storage.model import MODE_METADATA_KEY, MTIME_METADATA_KEY, ObjectMeta, format_mtime
from rapidmount.storage.seam import ObjectStore
from rapidmount.superblock.inodes import ROOT_INODE, Inode
from rapidmount.superblock.names import EntryKind, component_from_fuse

__all__ = ["Filesystem", "FSError"]

log = logging.getLogger("rapidmount.fs")

STATFS = {"f_bsize": 1 << 20, "f_frsize": 4096, "f_blocks": 1 << 40, "f_bfree": 1 << 40,
          "f_bavail": 1 << 40, "f_files": 1 << 32, "f_ffree": 1 << 32, "f_favail": 1 << 32,
          "f_namemax": 255}


class Filesystem(OpenFiles):
    """One mount's filesystem: builds its parts, and serves the attribute and
    namespace operations (those of handles: :class:`OpenFiles`)."""

    def __init__(self, settings: CoreSettings, store: ObjectStore, *, uid: int, gid: int,
                 clock: Callable[[], float] = time.monotonic, local: LocalCache | None = None) -> None:
        self.settings = settings
        self.store = store
        self.layout = store.layout
        self.stats = FSStats()
        self.cache = PageCache(settings.page_cache_budget, settings.cache_block_size)
        self.namespace = Namespace(settings, store, self.cache, self.stats, clock=clock)
        self.meta = self.namespace.meta
        self.root_prefix = self.namespace.root_prefix
        self.writes = WritePath(settings, store, self.namespace, self.stats)
        self.namespace.is_writing = self.writes.knows_better
        self.pages = KernelPages(store, lambda ino: self.writes.pending(ino) is not None)
        self._step_blocks = max(1, settings.readahead_step // settings.cache_block_size)
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
        self.cache_modes = CacheModes(direct_writes=not settings.no_direct_writes)
        self.attributes = AttributeBuilder(settings, self.meta, uid=uid, gid=gid, mount_time_ns=time.time_ns())
        # The generation whose pages the kernel may still hold, per inode.
        self._kernel_generation: dict[int, int] = {}
        self._nursery: trio.Nursery | None = None
        self.scan_ahead: ScanAhead | None = None
        self.preload: MetadataPreload | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the core the nursery its background fetches run in."""
        self._nursery = nursery
        self.blocks.fetcher = BlockFetcher(self.cache, nursery)
        if self.settings.prefetch_files > 0:
            self.scan_ahead = ScanAhead(self.settings, self.store, self.meta, self.stats, self.blocks.fetcher,
                                        nursery, self.namespace.listing)
        if self.settings.prefetch_metadata:
            self.preload = MetadataPreload(store=self.store, meta=self.meta, hidden=self.namespace.hidden,
                                           root=self.root_prefix, workers=self.settings.prefetch_metadata_workers)
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

    # -- attributes --------------------------------------------------------------------------------

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
        if self.settings.read_only and mode & os.W_OK:
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
        if not self.settings.preserve_mode or inode.kind is not EntryKind.FILE:
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

    # -- truncation, times and modes ---------------------------------------------------------------

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

    # -- changes by path: Linux retries them once after ESTALE -------------------------------------

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

    # -- names -------------------------------------------------------------------------------------

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
