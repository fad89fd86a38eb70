"""The filesystem core: POSIX operations over one bucket, in trio.

This layer knows inodes, handles, caches and the storage client; it knows
nothing of pyfuse3 (``fuse_adapter.py`` translates). Every storage call
crosses to the gRPC thread once through :class:`rapidmount.bridge.GrpcBridge`.
Errors leave as :class:`FSError` carrying the errno FUSE returns.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import time
from dataclasses import dataclass, field

import trio

from rapidmount.bridge import GrpcBridge
from rapidmount.cache.page_cache import BlockKey, PageCache
from rapidmount.client.errors import RetryPolicy, StorageError
from rapidmount.client.reader import BidiObjectReader, RangeObjectReader
from rapidmount.client.storage import BucketLayout, StorageClient
from rapidmount.config import MountConfig
from rapidmount.prefetch.fetcher import BlockFetcher, FetchCancelled, FetchOwner
from rapidmount.prefetch.readahead import ReadaheadPolicy
from rapidmount.superblock.inodes import ROOT_INODE, Inode, InodeTable
from rapidmount.superblock.metadata_cache import ABSENT, MetadataCache, ObjectMeta
from rapidmount.superblock.names import (
    EntryKind, HiddenNames, ListedEntry, component_from_fuse, entries_from_listing)

log = logging.getLogger("rapidmount.fs")

SYMLINK_METADATA_KEY = "gcsfuse_symlink_target"


class FSError(Exception):
    def __init__(self, errno_: int, message: str = "") -> None:
        super().__init__(message or os.strerror(errno_))
        self.errno = errno_


def kind_of(meta: ObjectMeta) -> EntryKind:
    return EntryKind.SYMLINK if SYMLINK_METADATA_KEY in meta.metadata else EntryKind.FILE


@dataclass
class OpenFile:
    """One open file handle: its pinned generation, stream and readahead state."""

    fh: int
    inode: Inode
    generation: int
    size: int
    finalized: bool
    direct_io: bool
    policy: ReadaheadPolicy
    reader: BidiObjectReader | RangeObjectReader
    owner: FetchOwner = field(default_factory=FetchOwner)


@dataclass
class OpenDir:
    fh: int
    inode: Inode
    entries: list[ListedEntry] | None = None


@dataclass
class FSStats:
    lookups: int = 0
    rpc_lookups: int = 0
    listings: int = 0
    bytes_read: int = 0
    direct_reads: int = 0
    reads: int = 0
    blocks_fetched: int = 0
    bytes_fetched: int = 0


class Filesystem:
    def __init__(self, config: MountConfig, bridge: GrpcBridge, client: StorageClient,
                 layout: BucketLayout, *, uid: int, gid: int) -> None:
        self.config = config
        self.bridge = bridge
        self.client = client
        self.layout = layout
        self.uid = uid
        self.gid = gid
        self.retry = RetryPolicy(deadline=config.retry_deadline)
        self.inodes = InodeTable()
        root_prefix = config.only_dir.strip("/")
        self.root_prefix = root_prefix + "/" if root_prefix else ""
        self.inodes.get(ROOT_INODE).path = self.root_prefix
        self.meta = MetadataCache(
            ttl=config.metadata_ttl, negative_ttl=config.negative_ttl,
            listing_ttl=config.effective_listing_ttl, budget_bytes=config.metadata_cache_size)
        self.cache = PageCache(config.cache_size, config.cache_block_size)
        self.hidden = HiddenNames()
        self.stats = FSStats()
        self.mount_time_ns = time.time_ns()
        self._fetcher: BlockFetcher | None = None
        self._handles: dict[int, OpenFile | OpenDir] = {}
        self._fh_ids = itertools.count(1)
        # The generation whose pages the kernel may still hold, per inode.
        self._kernel_generation: dict[int, int] = {}

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the core the nursery its background fetches run in."""
        self._fetcher = BlockFetcher(self.cache, nursery)

    # -- storage calls ----------------------------------------------------------------------------

    async def _call(self, fn, *args, **kwargs):
        try:
            return await self.bridge.call(fn, *args, **kwargs)
        except StorageError as err:
            log.error("%s", err)
            raise FSError(err.errno, str(err)) from None

    # -- inodes and attributes --------------------------------------------------------------------

    def inode(self, ino: int) -> Inode:
        try:
            return self.inodes.get(ino)
        except KeyError:
            raise FSError(errno.ENOENT) from None

    def _dir(self, ino: int) -> Inode:
        inode = self.inode(ino)
        if inode.kind is not EntryKind.DIR:
            raise FSError(errno.ENOTDIR)
        return inode

    def _apply(self, inode: Inode, meta: ObjectMeta) -> None:
        if inode.generation and meta.generation != inode.generation:
            # A new generation: cached blocks of the old one are useless.
            self.cache.invalidate_object(inode.path, keep_generation=meta.generation)
        inode.generation = meta.generation
        inode.metageneration = meta.metageneration
        inode.size = meta.size
        inode.mtime_ns = meta.mtime_ns
        inode.ctime_ns = meta.ctime_ns
        inode.finalized = meta.finalized
        inode.symlink_target = meta.metadata.get(SYMLINK_METADATA_KEY)

    def _entry_inode(self, parent: Inode, entry: ListedEntry) -> Inode:
        if entry.object is None or entry.kind is EntryKind.DIR:
            return self.inodes.resolve(parent.ino, entry.name, entry.kind)
        # A new generation is a new inode (as in gcsfuse): handles open on the
        # old one keep reading the generation, and the page cache, they had.
        previous = self.inodes.child(parent.ino, entry.name)
        inode = self.inodes.resolve(parent.ino, entry.name, entry.kind, generation=entry.object.generation)
        if previous is not None and previous is not inode and not previous.open_count:
            self.cache.invalidate_object(inode.path, keep_generation=entry.object.generation)
        self._apply(inode, entry.object)
        return inode

    async def _find(self, parent: Inode, name: str) -> ListedEntry | None:
        """What ``name`` is inside ``parent``: from caches when fresh, else one round trip."""
        listed = self.meta.lookup_in_listing(parent.path, name)
        if listed is ABSENT:
            return None
        if listed is not None:
            return listed
        file_path = parent.path + name
        dir_path = file_path + "/"
        as_dir, as_file = self.meta.get(dir_path), self.meta.get(file_path)
        if as_dir is not None and as_dir is not ABSENT:
            return ListedEntry(name, EntryKind.DIR, None)  # the directory wins
        if as_dir is ABSENT and as_file is ABSENT:
            return None
        if as_dir is ABSENT and isinstance(as_file, ObjectMeta):
            return ListedEntry(name, kind_of(as_file), as_file)
        self.stats.rpc_lookups += 1
        meta, is_dir = await self._call(self.client.stat_name, file_path, hns=self.layout.hierarchical_namespace)
        if is_dir:
            self.meta.put_dir(dir_path)
        else:
            self.meta.put_absent(dir_path)
        if meta is None:
            self.meta.put_absent(file_path)
        else:
            self.meta.put_object(meta)
        if is_dir:
            return ListedEntry(name, EntryKind.DIR, None)
        if meta is None:
            return None
        return ListedEntry(name, kind_of(meta), meta)

    async def lookup(self, parent_ino: int, raw_name: bytes) -> Inode:
        self.stats.lookups += 1
        parent = self._dir(parent_ino)
        if raw_name in (b".", b".."):
            inode = parent if raw_name == b"." else self.inode(parent.parent or ROOT_INODE)
            self.inodes.lookup(inode.ino)
            return inode
        name = component_from_fuse(raw_name)
        if name is None:
            raise FSError(errno.ENAMETOOLONG if len(raw_name) > 255 else errno.ENOENT)
        entry = await self._find(parent, name)
        if entry is None:
            raise FSError(errno.ENOENT)
        inode = self._entry_inode(parent, entry)
        self.inodes.lookup(inode.ino)
        return inode

    async def getattr(self, ino: int) -> Inode:
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR:
            return inode
        await self._refresh(inode)
        return inode

    async def _refresh(self, inode: Inode) -> None:
        cached = self.meta.get(inode.path)
        if isinstance(cached, ObjectMeta):
            meta = cached
        else:
            meta = await self._call(self.client.get_object, inode.path)
            if meta is None:
                self.meta.put_absent(inode.path)
                if inode.open_count:
                    return  # keep serving the generation the open handles pinned
                raise FSError(errno.ENOENT)
            self.meta.put_object(meta)
        if inode.generation and meta.generation != inode.generation:
            return  # the name now holds a newer object, which gets its own inode at lookup
        self._apply(inode, meta)

    def forget(self, items: list[tuple[int, int]]) -> None:
        for ino, count in items:
            try:
                self.inodes.forget(ino, count)
            except KeyError:
                pass
            if ino not in self.inodes:
                self._kernel_generation.pop(ino, None)

    async def readlink(self, ino: int) -> str:
        inode = self.inode(ino)
        if inode.kind is not EntryKind.SYMLINK or inode.symlink_target is None:
            raise FSError(errno.EINVAL)
        return inode.symlink_target

    def statfs(self) -> dict:
        huge = 1 << 40
        return {"f_bsize": 1 << 20, "f_frsize": 4096, "f_blocks": huge, "f_bfree": huge,
                "f_bavail": huge, "f_files": 1 << 32, "f_ffree": 1 << 32, "f_favail": 1 << 32,
                "f_namemax": 255}

    # -- directories ------------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        inode = self._dir(ino)
        fh = next(self._fh_ids)
        self._handles[fh] = OpenDir(fh, inode)
        self.inodes.opened(ino)
        return fh

    async def _listing(self, directory: Inode) -> list[ListedEntry]:
        entries = self.meta.get_listing(directory.path)
        if entries is not None:
            return entries
        self.stats.listings += 1
        objects, prefixes, _ = await self._call(
            self.client.list_directory, directory.path,
            folders_as_prefixes=self.layout.hierarchical_namespace)
        entries, hidden = entries_from_listing(
            directory.path, ((meta.name, meta) for meta in objects), prefixes, self.hidden,
            is_symlink=lambda meta: SYMLINK_METADATA_KEY in meta.metadata)
        for object_name, reason in hidden:
            log.warning("hiding object %r: %s", object_name, reason)
        self.meta.put_listing(directory.path, entries)
        return entries

    async def readdir(self, fh: int, start: int):
        """Yield (name, inode, next_offset) from offset ``start`` on.

        The caller must call :meth:`entry_returned` for each entry the kernel
        accepted (it then holds a lookup reference).
        """
        handle = self._handles.get(fh)
        if not isinstance(handle, OpenDir):
            raise FSError(errno.EBADF)
        if handle.entries is None or start == 0:
            handle.entries = await self._listing(handle.inode)
        directory = handle.inode
        # Offsets 0 and 1 are "." and ".."; listing entries follow.
        if start == 0:
            yield ".", directory, 1
        if start <= 1:
            yield "..", self.inode(directory.parent or ROOT_INODE), 2
        for index in range(max(start, 2) - 2, len(handle.entries)):
            entry = handle.entries[index]
            yield entry.name, self._entry_inode(directory, entry), index + 3

    def entry_returned(self, ino: int) -> None:
        self.inodes.lookup(ino)

    def releasedir(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if isinstance(handle, OpenDir):
            self.inodes.closed(handle.inode.ino)

    # -- files --------------------------------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> tuple[int, bool, bool]:
        """Open for reading; returns (fh, direct_io, keep_cache)."""
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FSError(errno.EROFS)
        # Close-to-open consistency: a stale view is refreshed at open.
        await self._refresh(inode)
        direct_io = bool(flags & os.O_DIRECT)
        keep_cache = not direct_io and self._kernel_generation.get(ino) == inode.generation
        if not direct_io:
            self._kernel_generation[ino] = inode.generation
        fh = next(self._fh_ids)
        reader_cls = BidiObjectReader if self.layout.zonal else RangeObjectReader
        kwargs = {"stall_timeout": self.config.stall_timeout} if self.layout.zonal else {}
        reader = reader_cls(self.client, inode.path, inode.generation, retry=self.retry, **kwargs)
        policy = ReadaheadPolicy(self.config.cache_block_size, self.config.readahead_initial,
                                 self.config.readahead_max)
        self._handles[fh] = OpenFile(fh, inode, inode.generation, inode.size, inode.finalized,
                                     direct_io, policy, reader)
        self.inodes.opened(ino)
        return fh, direct_io, keep_cache

    def _file(self, fh: int) -> OpenFile:
        handle = self._handles.get(fh)
        if not isinstance(handle, OpenFile):
            raise FSError(errno.EBADF)
        return handle

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        handle = self._file(fh)
        self.stats.reads += 1
        file_size = handle.size
        if offset + size > file_size and not handle.finalized and handle.direct_io:
            # Tailing a growing (unfinalized) object: look for new bytes.
            file_size = await self._grown_size(handle)
        if offset >= file_size or size <= 0:
            return b""
        plan = handle.policy.plan(offset, size, file_size)
        if plan.direct is not None:
            start, length = plan.direct
            self.stats.direct_reads += 1
            data = await self._call(handle.reader.read, start, length)
            self.stats.bytes_read += len(data)
            return data
        assert self._fetcher is not None, "attach() was not called"
        block_size = self.cache.block_size
        # The last block of a growing (unfinalized) object changes as it
        # grows, so only whole blocks of it are cached.
        cacheable_end = file_size if handle.finalized else file_size - file_size % block_size
        for block in plan.prefetch:
            if block * block_size < cacheable_end:
                self._start_block(handle, block, file_size, prefetch=True)
        blocks = []
        for block in plan.demand:
            start = block * block_size
            if start >= cacheable_end:
                blocks.append(await self._call(handle.reader.read, start, file_size - start))
            else:
                blocks.append(await self._block(handle, block, file_size))
        end = min(offset + size, file_size)
        first = plan.demand.start * block_size
        if len(blocks) == 1:
            view = memoryview(blocks[0])[offset - first:end - first]
        else:
            view = memoryview(b"".join(blocks))[offset - first:end - first]
        self.stats.bytes_read += len(view)
        return view

    async def _grown_size(self, handle: OpenFile) -> int:
        meta = await self._call(self.client.get_object, handle.inode.path, handle.generation)
        if meta is not None and meta.size > handle.size:
            handle.size = meta.size
            handle.finalized = meta.finalized
            self.meta.put_object(meta)
            self._apply(handle.inode, meta)
        return handle.size

    def _block_fetch(self, handle: OpenFile, block: int, file_size: int):
        start = block * self.cache.block_size
        length = min(self.cache.block_size, file_size - start)
        # Keyed by object name, not inode: the kernel forgetting an inode
        # (e.g. under memory pressure) must not throw the cached data away.
        key = BlockKey(handle.inode.path, handle.generation, block)

        async def fetch() -> bytes:
            self.stats.blocks_fetched += 1
            self.stats.bytes_fetched += length
            data = await self.bridge.call(handle.reader.read, start, length)
            if len(data) != length:
                raise StorageError(
                    f"read {handle.inode.path!r}: got {len(data)} bytes at {start}, expected {length}",
                    errno_=errno.EIO)
            return data

        return key, fetch, length

    def _start_block(self, handle: OpenFile, block: int, file_size: int, *, prefetch: bool) -> None:
        key, fetch, length = self._block_fetch(handle, block, file_size)
        self._fetcher.start(key, fetch, length, owner=handle.owner, prefetch=prefetch)

    async def _block(self, handle: OpenFile, block: int, file_size: int) -> bytes:
        key, fetch, length = self._block_fetch(handle, block, file_size)
        try:
            return await self._fetcher.get(key, fetch, length, owner=handle.owner)
        except StorageError as err:
            log.error("%s", err)
            raise FSError(err.errno, str(err)) from None
        except FetchCancelled:
            raise FSError(errno.EBADF, "file handle was released") from None

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        if isinstance(handle, OpenFile):
            handle.owner.cancel_all()
            self.inodes.closed(handle.inode.ino)
            with trio.CancelScope(shield=True):
                try:
                    await self.bridge.call(handle.reader.close)
                except Exception as err:  # closing must never fail the release
                    log.debug("closing stream of %r: %r", handle.inode.path, err)

    async def close_all(self) -> None:
        for fh in list(self._handles):
            handle = self._handles.get(fh)
            if isinstance(handle, OpenFile):
                await self.release(fh)
            else:
                self.releasedir(fh)
