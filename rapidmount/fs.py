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
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import trio

from rapidmount.bridge import GrpcBridge
from rapidmount.cache.page_cache import BlockKey, PageCache
from rapidmount.storage.counters import StreamEvents
from rapidmount.client.errors import RetryPolicy, StorageError
from rapidmount.client.reader import (
    COMPOSE_MAX_SOURCES, COMPOSE_PREFIX, BidiObjectReader, RangeObjectReader, read_objects_composed,
    read_objects_whole)
from rapidmount.client.storage import StorageClient
from rapidmount.storage.model import BucketLayout
from rapidmount.client.writer import AppendableWriter
from rapidmount.config import MountConfig
from rapidmount.listing.prefetch import MetadataPrefetch
from rapidmount.prefetch.fetcher import BlockFetcher, FetchCancelled, FetchOwner
from rapidmount.prefetch.readahead import ReadaheadPolicy
from rapidmount.prefetch.scan import ScanPlanner
from rapidmount.superblock.inodes import ROOT_INODE, Inode, InodeTable
from rapidmount.storage.model import ObjectMeta
from rapidmount.superblock.metadata_cache import ABSENT, MetadataCache
from rapidmount.superblock.names import (
    EntryKind, HiddenNames, ListedEntry, component_from_fuse, entries_from_listing)

log = logging.getLogger("rapidmount.fs")

SYMLINK_METADATA_KEY = "gcsfuse_symlink_target"


def _log_failure(err: StorageError, context: str = "") -> None:
    """One line per failed storage call, with the object and gRPC code as fields."""
    log.error("%s%s", context, err, extra=err.log_fields())


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
    writable: bool = False
    append_only: bool = False
    whole: bool = False  # the whole object was requested at open: reads come from the cache


@dataclass
class WriteState:
    """The pending changes of one inode, shared by its writing handles.

    ``appender`` streams appends to an appendable object (zonal buckets);
    otherwise bytes are staged in a local file (``staged_fd``) and uploaded
    as a new generation, with a generation precondition, on fsync and close.
    """

    inode: Inode
    size: int
    base_generation: int  # precondition of a staged upload (0: must not exist)
    appender: AppendableWriter | None = None
    staged_fd: int | None = None
    dirty: bool = False
    base_size: int | None = None  # size of the unfinalized object the staged copy was made from
    handles: int = 0
    failure: FSError | None = None  # sticky: e.g. ESTALE once another writer took over

    @property
    def mode(self) -> str | None:
        if self.appender is not None:
            return "append"
        if self.staged_fd is not None:
            return "staged"
        return None


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
    whole_file_fetches: int = 0
    #: files fetched ahead of a scan, and those later opened while cached or in flight
    scan_prefetches: int = 0
    scan_hits: int = 0
    bytes_written: int = 0
    writers_flushed: int = 0  # appends made durable or staged files uploaded


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
        self.stream_events = StreamEvents()
        self.mount_time_ns = time.time_ns()
        self._fetcher: BlockFetcher | None = None
        self._handles: dict[int, OpenFile | OpenDir] = {}
        self._fh_ids = itertools.count(1)
        # The generation whose pages the kernel may still hold, per inode.
        self._kernel_generation: dict[int, int] = {}
        self._writes: dict[int, WriteState] = {}
        self.temp_dir = config.temp_dir or tempfile.gettempdir()
        self._nursery: trio.Nursery | None = None
        # Directory-scan prefetch: which files to fetch before they are opened.
        self.scan = ScanPlanner(config.prefetch_files) if config.prefetch_files > 0 else None
        self._scan_owner = FetchOwner()
        self._scan_names: dict[str, tuple[list[ListedEntry], list[str]]] = {}
        self._scan_fetched: dict[BlockKey, bool] = {}  # insertion-ordered, bounded
        self._scan_listing_wanted: set[str] = set()
        # Composing needs ComposeObject, which zonal (Rapid) buckets refuse.
        self._compose = config.compose_prefetch and not layout.zonal
        if config.compose_prefetch and layout.zonal:
            log.warning("--compose-prefetch is ignored: zonal buckets do not support ComposeObject")
        self.metadata_prefetch: MetadataPrefetch | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """Give the core the nursery its background fetches run in."""
        self._nursery = nursery
        self._fetcher = BlockFetcher(self.cache, nursery)
        if self.config.prefetch_metadata:
            self.metadata_prefetch = MetadataPrefetch(
                bridge=self.bridge, client=self.client, meta=self.meta, hidden=self.hidden,
                root=self.root_prefix, hierarchical=self.layout.hierarchical_namespace,
                workers=self.config.prefetch_metadata_workers,
                is_symlink=lambda meta: SYMLINK_METADATA_KEY in meta.metadata)
            nursery.start_soon(self.metadata_prefetch.run)

    # -- storage calls ----------------------------------------------------------------------------

    async def _call(self, fn, *args, **kwargs):
        try:
            return await self.bridge.call(fn, *args, **kwargs)
        except StorageError as err:
            _log_failure(err)
            raise FSError(err.errno, str(err)) from None

    def open_streams(self) -> tuple[int, int]:
        """(read, write) streams open now; safe to call from another thread."""
        handles = list(self._handles.values())  # one atomic copy; the trio thread may change the dict
        writes = list(self._writes.values())
        reading = sum(1 for h in handles if isinstance(h, OpenFile) and h.reader.stream_open)
        writing = sum(1 for w in writes if w.appender is not None and w.appender.stream_open)
        return reading, writing

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
        if inode.ino in self._writes:
            return  # pending writes know better than any listing or stat
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
        state = self._writes.get(ino)
        if state is not None:
            inode.size = state.size  # our own writes are the truth while they are pending
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

    async def _listing(self, directory: str) -> list[ListedEntry]:
        entries = self.meta.get_listing(directory)
        if entries is not None:
            return entries
        self.stats.listings += 1
        objects, prefixes, _ = await self._call(
            self.client.list_directory, directory,
            folders_as_prefixes=self.layout.hierarchical_namespace)
        entries, hidden = entries_from_listing(
            directory, ((meta.name, meta) for meta in objects), prefixes, self.hidden,
            is_symlink=lambda meta: SYMLINK_METADATA_KEY in meta.metadata)
        for object_name, reason in hidden:
            log.warning("hiding object %r: %s", object_name, reason)
        self.meta.put_listing(directory, entries)
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
            handle.entries = await self._listing(handle.inode.path)
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
        writable = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if (writable or flags & os.O_TRUNC) and self.config.read_only:
            raise FSError(errno.EROFS)
        # Close-to-open consistency: a stale view is refreshed at open.
        if ino not in self._writes:
            await self._refresh(inode)
        direct_io = bool(flags & os.O_DIRECT)
        keep_cache = not direct_io and self._kernel_generation.get(ino) == inode.generation
        if not direct_io:
            self._kernel_generation[ino] = inode.generation
        fh = next(self._fh_ids)
        reader_cls = BidiObjectReader if self.layout.zonal else RangeObjectReader
        kwargs = {"stall_timeout": self.config.stall_timeout} if self.layout.zonal else {}
        reader = reader_cls(self.client, inode.path, inode.generation, retry=self.retry,
                            on_event=self.stream_events.on_read, **kwargs)
        policy = ReadaheadPolicy(self.config.cache_block_size, self.config.readahead_initial,
                                 self.config.readahead_max)
        handle = OpenFile(fh, inode, inode.generation, inode.size, inode.finalized,
                          direct_io, policy, reader, writable=writable,
                          append_only=bool(flags & os.O_APPEND))
        self._handles[fh] = handle
        self.inodes.opened(ino)
        if not writable and not direct_io and ino not in self._writes and self._fetcher is not None:
            self._fetch_ahead_of_reads(handle)
        if writable:
            state = self._write_state(inode)
            state.handles += 1
            if flags & os.O_TRUNC and state.size:
                await self._stage(state, keep=0)
        return fh, direct_io, keep_cache

    # -- small files: whole-object reads and directory-scan prefetch -----------------------------

    def _fetch_ahead_of_reads(self, handle: OpenFile) -> None:
        """At open: start fetching what the reads are about to ask for."""
        inode = handle.inode
        key = BlockKey(inode.path, handle.generation, 0)
        if self._scan_fetched.pop(key, False) and self._fetcher.is_pending(key):
            self.stats.scan_hits += 1
        if handle.finalized and 0 < handle.size <= self.config.small_file_size:
            # The stream opens with a request for the whole object: one round trip.
            self.stats.whole_file_fetches += 1
            handle.whole = True
            for block in range(-(-handle.size // self.cache.block_size)):
                self._start_block(handle, block, handle.size, prefetch=False)
        if self.scan is not None and inode.parent:
            self._plan_scan(inode)

    def _plan_scan(self, inode: Inode) -> None:
        try:
            directory = self.inodes.get(inode.parent).path
        except KeyError:
            return
        entries = self.meta.get_listing(directory)
        names = None
        if entries is not None:
            known = self._scan_names.get(directory)
            if known is None or known[0] is not entries:
                known = (entries, [e.name for e in entries if e.kind is EntryKind.FILE])
                self._scan_names[directory] = known
                while len(self._scan_names) > 64:
                    self._scan_names.pop(next(iter(self._scan_names)))
            names = known[1]
        elif directory not in self._scan_listing_wanted and len(self._scan_listing_wanted) < 1024:
            # Opens by path without a readdir: list once, so the order is known.
            self._scan_listing_wanted.add(directory)
            self._nursery.start_soon(self._list_for_scan, directory)
        wanted = self.scan.opened(directory, inode.name, names)
        if wanted:
            self._prefetch_files(wanted)

    async def _list_for_scan(self, directory: str) -> None:
        with trio.CancelScope() as scope:
            self._scan_owner.track(scope)
            try:
                await self._listing(directory)
            except FSError:
                pass  # only a prediction was lost; _call logged why
            finally:
                self._scan_owner.untrack(scope)

    def _prefetch_files(self, paths: list[str]) -> None:
        """Fetch the first block of each file ahead of its open, in batches."""
        alone: list[tuple[BlockKey, int, int | None]] = []
        composable: list[tuple[BlockKey, int, int | None]] = []
        for path in paths:
            meta = self.meta.get(path)
            if not isinstance(meta, ObjectMeta) or not meta.finalized or meta.size <= 0:
                continue
            key = BlockKey(path, meta.generation, 0)
            if self._fetcher.is_pending(key):
                continue
            if self._compose and meta.size <= self.cache.block_size:
                composable.append((key, meta.size, meta.crc32c))
            else:
                alone.append((key, min(meta.size, self.cache.block_size), None))
        if alone:
            self._prefetch_batch(alone, composed=False)
        if composable:
            # A composite of a few files costs more than it saves: read those alone.
            self._prefetch_batch(composable, composed=len(composable) >= COMPOSE_MAX_SOURCES // 4)

    def _temporary_name(self) -> str:
        return f"{COMPOSE_PREFIX}{uuid.uuid4().hex}"

    def _prefetch_batch(self, candidates: list[tuple[BlockKey, int, int | None]], *, composed: bool) -> None:
        results: dict[BlockKey, bytes | memoryview | StorageError] = {}
        landed = trio.Event()

        def fetch_for(key: BlockKey, length: int):
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
                 if self._fetcher.start(key, fetch_for(key, length), length, owner=self._scan_owner,
                                        prefetch=True) is not None]
        if not batch:
            return
        self.stats.scan_prefetches += len(batch)
        for key, _, _ in batch:
            self._scan_fetched[key] = True
        while len(self._scan_fetched) > 4 * self.config.prefetch_files + 1024:
            self._scan_fetched.pop(next(iter(self._scan_fetched)))

        async def fetch_batch() -> None:
            with trio.CancelScope() as scope:
                self._scan_owner.track(scope)
                try:
                    if composed:
                        answers = await self.bridge.call(
                            read_objects_composed, self.client,
                            [(key.object_id, key.generation, length, crc) for key, length, crc in batch],
                            concurrency=max(1, self.config.prefetch_streams // 4), retry=self.retry,
                            temporary_name=self._temporary_name, on_event=self.stream_events.on_read)
                    else:
                        answers = await self.bridge.call(
                            read_objects_whole, self.client,
                            [(key.object_id, key.generation, length) for key, length, _ in batch],
                            zonal=self.layout.zonal, concurrency=self.config.prefetch_streams, retry=self.retry,
                            stall_timeout=self.config.stall_timeout, on_event=self.stream_events.on_read)
                    results.update(zip((key for key, _, _ in batch), answers))
                except Exception as err:  # a prefetch never takes the mount down
                    log.error("prefetch of %d files failed: %r", len(batch), err)
                    failure = StorageError(f"prefetch failed: {err!r}", errno_=errno.EIO)
                    results.update((key, failure) for key, _, _ in batch)
                finally:
                    self._scan_owner.untrack(scope)
                    landed.set()

        self._nursery.start_soon(fetch_batch)

    def _file(self, fh: int) -> OpenFile:
        handle = self._handles.get(fh)
        if not isinstance(handle, OpenFile):
            raise FSError(errno.EBADF)
        return handle

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        handle = self._file(fh)
        self.stats.reads += 1
        state = self._writes.get(handle.inode.ino)
        if state is not None and state.mode is not None:
            return await self._read_own_writes(handle, state, offset, size)
        file_size = handle.size
        if offset + size > file_size and not handle.finalized and handle.direct_io:
            # Tailing a growing (unfinalized) object: look for new bytes.
            file_size = await self._grown_size(handle)
        if offset >= file_size or size <= 0:
            return b""
        if handle.whole:
            return await self._read_whole(handle, offset, size)
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

    async def _read_whole(self, handle: OpenFile, offset: int, size: int) -> bytes | memoryview:
        """A read of a small object fetched whole at open: blocks from the cache."""
        block_size = self.cache.block_size
        end = min(offset + size, handle.size)
        first, last = offset // block_size, (end - 1) // block_size
        blocks = [await self._block(handle, block, handle.size) for block in range(first, last + 1)]
        data = blocks[0] if len(blocks) == 1 else b"".join(blocks)
        view = memoryview(data)[offset - first * block_size:end - first * block_size]
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
            _log_failure(err)
            raise FSError(err.errno, str(err)) from None
        except FetchCancelled:
            raise FSError(errno.EBADF, "file handle was released") from None

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        if isinstance(handle, OpenFile):
            handle.owner.cancel_all()
            if handle.writable:
                with trio.CancelScope(shield=True):
                    await self._writer_closed(handle.inode)
            self.inodes.closed(handle.inode.ino)
            if handle.reader.idle:
                return  # served from the cache: no stream was ever opened
            with trio.CancelScope(shield=True):
                try:
                    await self.bridge.call(handle.reader.close)
                except Exception as err:  # closing must never fail the release
                    log.debug("closing stream of %r: %r", handle.inode.path, err)

    async def close_all(self) -> None:
        self._scan_owner.cancel_all()
        for fh in list(self._handles):
            handle = self._handles.get(fh)
            if isinstance(handle, OpenFile):
                await self.release(fh)
            else:
                self.releasedir(fh)

    # -- writes -------------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.config.read_only:
            raise FSError(errno.EROFS)

    def _write_state(self, inode: Inode) -> WriteState:
        state = self._writes.get(inode.ino)
        if state is None:
            state = WriteState(inode, size=inode.size, base_generation=inode.generation)
            self._writes[inode.ino] = state
        return state

    def _new_appender(self, path: str) -> AppendableWriter:
        return AppendableWriter(self.client, path, retry=self.retry, buffer_limit=self.config.write_buffer,
                                stall_timeout=self.config.stall_timeout, on_event=self.stream_events.on_write)

    def _changed(self, path: str) -> None:
        """Forget what the caches knew of ``path`` (and its directory's listing)."""
        self.meta.invalidate(path)
        self.meta.invalidate(path + "/")
        if self.metadata_prefetch is not None:
            self.metadata_prefetch.note_change(path)

    async def _writer_call(self, state: WriteState, fn, *args):
        """A call on the appender; a failure sticks to the state (e.g. ESTALE)."""
        try:
            return await self.bridge.call(fn, *args)
        except StorageError as err:
            _log_failure(err)
            state.failure = FSError(err.errno, str(err))
            raise state.failure from None

    async def create(self, parent_ino: int, raw_name: bytes, flags: int) -> tuple[int, Inode]:
        """Create and open a new file; returns (fh, inode)."""
        self._check_writable()
        parent = self._dir(parent_ino)
        name = self._new_name(raw_name)
        path = parent.path + name
        if await self._find(parent, name) is not None:
            raise FSError(errno.EEXIST)
        generation = 0
        appender = None
        if self.layout.zonal:
            appender = self._new_appender(path)
            try:
                meta = await self.bridge.call(appender.create, if_generation_match=0)
            except StorageError as err:
                raise FSError(errno.EEXIST if err.errno == errno.ESTALE else err.errno, str(err)) from None
            generation = meta.generation if meta is not None else appender.generation
        self._changed(path)
        inode = self.inodes.resolve(parent.ino, name, EntryKind.FILE, generation=generation or None)
        now = time.time_ns()
        inode.generation, inode.size, inode.finalized = generation, 0, False
        inode.mtime_ns = inode.ctime_ns = now
        state = self._write_state(inode)
        state.base_generation = generation
        if appender is not None:
            state.appender = appender
        else:
            await self._stage(state, keep=0)  # regional buckets: uploaded on fsync and close
        self.inodes.lookup(inode.ino)
        fh, _, _ = await self.open(inode.ino, flags & ~os.O_TRUNC)
        return fh, inode

    def _new_name(self, raw_name: bytes) -> str:
        name = component_from_fuse(raw_name)
        if name is None:
            raise FSError(errno.ENAMETOOLONG if len(raw_name) > 255 else errno.EINVAL)
        return name

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self._file(fh)
        if not handle.writable:
            raise FSError(errno.EBADF)
        state = self._write_state(handle.inode)
        if state.failure is not None:
            raise state.failure
        if state.mode is None:
            offset = await self._choose_write_mode(state, offset, handle.append_only)
        elif handle.append_only:
            offset = state.size
        if state.appender is not None and offset != state.size:
            await self._stage(state, keep=state.size)  # not an append: stage the whole object
        if state.appender is not None:
            await self._writer_call(state, state.appender.append, bytes(data))
            state.size += len(data)
        else:
            os.pwrite(state.staged_fd, data, offset)
            state.size = max(state.size, offset + len(data))
            state.dirty = True
        self.stats.bytes_written += len(data)
        inode = handle.inode
        inode.size = state.size
        inode.mtime_ns = time.time_ns()
        return len(data)

    async def _choose_write_mode(self, state: WriteState, offset: int, append_only: bool) -> int:
        """The first write decides: append to the object in place, or stage it.

        Returns the offset to write at: for ``O_APPEND`` that is the object's
        end as the bucket reports it now, not as this mount last saw it.
        """
        inode = state.inode
        for attempt in range(2):
            if self.layout.zonal and not inode.finalized and inode.generation and (
                    append_only or offset == state.size):
                appender = self._new_appender(inode.path)
                try:
                    size = await self.bridge.call(appender.takeover, inode.generation)
                except StorageError as err:
                    log.info("cannot take over %r (%s); staging instead", inode.path, err)
                else:
                    if append_only or size == offset:
                        state.appender = appender
                        state.size = inode.size = size
                        return size
                    await self.bridge.call(appender.abort)
            # Our view may be stale (the object grew, or was finalized): refresh
            # it and decide again, once.
            if attempt:
                break
            generation = inode.generation
            self.meta.invalidate(inode.path)
            await self._refresh(inode)
            if generation and inode.generation != generation:
                raise FSError(errno.ESTALE, f"{inode.path!r} was replaced by another client")
            if not append_only and offset != inode.size:
                break
            state.size = inode.size
            offset = state.size if append_only else offset
        await self._stage(state, keep=state.size)
        return state.size if append_only else offset

    async def _stage(self, state: WriteState, *, keep: int) -> None:
        """Make the file staged: a local copy holding its first ``keep`` bytes."""
        if state.staged_fd is not None:
            # Already staged: the local copy is the file; the bucket is not read
            # again, and what the copy was made from (base_*) stays the same.
            os.ftruncate(state.staged_fd, keep)
            state.size = keep
            state.dirty = True
            return
        if state.appender is not None:
            # Appended bytes become part of the object first; then stage it all.
            await self._writer_call(state, state.appender.close)
            state.appender = None
            state.base_generation = state.inode.generation
        fd, path = tempfile.mkstemp(prefix="rapidmount-", dir=self.temp_dir)
        os.unlink(path)  # lives as long as the descriptor
        inode = state.inode
        copied = 0
        try:
            if keep and inode.generation:
                reader_cls = BidiObjectReader if self.layout.zonal else RangeObjectReader
                reader = reader_cls(self.client, inode.path, inode.generation, retry=self.retry)
                try:
                    while copied < keep:
                        chunk = await self._call(reader.read, copied, min(8 << 20, keep - copied))
                        if not chunk:
                            break
                        os.pwrite(fd, chunk, copied)
                        copied += len(chunk)
                finally:
                    await self.bridge.call(reader.close)
            if copied < keep:
                os.ftruncate(fd, keep)
        except BaseException:
            os.close(fd)  # an incomplete copy must never be uploaded
            raise
        state.staged_fd = fd
        # Appends keep the generation, so the precondition alone would not
        # notice another client appending to an unfinalized object meanwhile.
        state.base_size = inode.size if inode.generation and not inode.finalized else None
        state.size = keep
        state.dirty = True

    async def _read_own_writes(self, handle: OpenFile, state: WriteState, offset: int, size: int):
        end = min(offset + size, state.size)
        if offset >= end:
            return b""
        if state.staged_fd is not None:
            return os.pread(state.staged_fd, end - offset, offset)
        # Appending: make the bucket hold every byte, then read it back.
        await self._writer_call(state, state.appender.flush)
        data = await self._call(handle.reader.read, offset, end - offset)
        return data

    async def flush(self, fh: int) -> None:
        """close(2) and fsync(2): every byte written so far becomes durable."""
        handle = self._handles.get(fh)
        if not isinstance(handle, OpenFile) or not handle.writable:
            return
        state = self._writes.get(handle.inode.ino)
        if state is not None:
            await self._persist(state)

    async def _persist(self, state: WriteState) -> None:
        if state.failure is not None:
            raise state.failure
        if state.appender is not None:
            await self._writer_call(state, state.appender.flush)
            self.stats.writers_flushed += 1
            self._changed(state.inode.path)
        elif state.staged_fd is not None and state.dirty:
            await self._upload(state)

    async def _upload(self, state: WriteState) -> None:
        inode = state.inode
        fd, size = state.staged_fd, state.size
        try:
            if state.base_size is not None:
                current = await self.bridge.call(self.client.get_object, inode.path)
                if current is None or current.generation != state.base_generation or \
                        current.size != state.base_size:
                    raise StorageError(f"upload {inode.path!r}: the object changed since it was staged",
                                       errno_=errno.ESTALE)
            if self.layout.zonal:
                appender = self._new_appender(inode.path)
                await self.bridge.call(appender.create, if_generation_match=state.base_generation)
                for offset in range(0, size, 8 << 20):
                    await self.bridge.call(appender.append, os.pread(fd, min(8 << 20, size - offset), offset))
                if self.config.finalize_on_close:
                    meta = await self.bridge.call(appender.finalize)
                else:
                    await self.bridge.call(appender.close)
                    meta = await self.bridge.call(self.client.get_object, inode.path)
            else:
                meta = await self.bridge.call(
                    self.client.write_object, inode.path, lambda off, n: os.pread(fd, n, off), size,
                    if_generation_match=state.base_generation)
        except StorageError as err:
            _log_failure(err)
            failure = FSError(errno.ESTALE if err.errno == errno.ESTALE else err.errno, str(err))
            if err.errno == errno.ESTALE:
                state.failure = failure  # someone else changed the object: never overwrite it
            raise failure from None
        state.dirty = False
        self.stats.writers_flushed += 1
        if meta is not None:
            state.base_generation = meta.generation
            state.base_size = meta.size if not meta.finalized else None
            self._changed(inode.path)
            self.meta.put_object(meta)
            inode.generation, inode.finalized = meta.generation, meta.finalized
        inode.size = size

    async def _writer_closed(self, inode: Inode) -> None:
        state = self._writes.get(inode.ino)
        if state is None:
            return
        state.handles -= 1
        if state.handles > 0:
            return
        del self._writes[inode.ino]
        try:
            if state.failure is None:
                if state.appender is not None:
                    if self.config.finalize_on_close:
                        meta = await self.bridge.call(state.appender.finalize)
                        inode.finalized = True
                        inode.generation = meta.generation
                    else:
                        await self.bridge.call(state.appender.close)
                    self.stats.writers_flushed += 1
                elif state.dirty:
                    await self._upload(state)
        except StorageError as err:
            _log_failure(err, f"closing {inode.path!r}: ")
        except FSError:
            pass  # _upload logged it
        finally:
            if state.appender is not None:
                await self.bridge.call(state.appender.abort)
            if state.staged_fd is not None:
                os.close(state.staged_fd)
            self._changed(inode.path)
            if state.failure is None and not state.dirty:
                inode.size = state.size
            # The next open sees the bucket's view, including its size.
            self._kernel_generation.pop(inode.ino, None)

    async def truncate(self, ino: int, size: int) -> Inode:
        self._check_writable()
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        state = self._write_state(inode)
        if state.failure is not None:
            raise state.failure
        if size == state.size:
            if state.handles == 0 and state.mode is None:
                del self._writes[ino]
            return inode
        await self._stage(state, keep=min(size, state.size))
        os.ftruncate(state.staged_fd, size)
        state.size = inode.size = size
        if state.handles == 0:
            # truncate(2) without an open file: upload now.
            try:
                await self._upload(state)
            finally:
                self._writes.pop(ino, None)
                os.close(state.staged_fd)
        return inode

    async def set_mtime(self, ino: int, mtime_ns: int) -> Inode:
        """Store a file's mtime as gcsfuse does (metadata ``gcsfuse_mtime``)."""
        self._check_writable()
        inode = self.inode(ino)
        if inode.kind is EntryKind.DIR or ino in self._writes or not inode.generation:
            inode.mtime_ns = mtime_ns
            return inode
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mtime_ns // 1_000_000_000))
        stamp += f".{mtime_ns % 1_000_000_000:09d}Z"
        meta = await self._call(self.client.update_metadata, inode.path, inode.generation,
                                {"gcsfuse_mtime": stamp})
        self._changed(inode.path)
        self.meta.put_object(meta)
        self._apply(inode, meta)
        inode.mtime_ns = mtime_ns
        return inode

    # -- namespace changes --------------------------------------------------------------------------

    async def _existing(self, parent_ino: int, raw_name: bytes) -> tuple[Inode, str, ListedEntry]:
        """For a change to an existing name: (its directory, the name, what it is)."""
        self._check_writable()
        parent = self._dir(parent_ino)
        name = self._new_name(raw_name)
        entry = await self._find(parent, name)
        if entry is None:
            raise FSError(errno.ENOENT)
        return parent, name, entry

    async def unlink(self, parent_ino: int, raw_name: bytes) -> None:
        parent, name, entry = await self._existing(parent_ino, raw_name)
        if entry.kind is EntryKind.DIR:
            raise FSError(errno.EISDIR)
        path = parent.path + name
        generation = entry.object.generation if entry.object is not None else None
        await self._call(self.client.delete_object, path, if_generation_match=generation)
        self._changed(path)
        self.meta.put_absent(path)
        child = self.inodes.child(parent.ino, name)
        if child is not None:
            self.inodes.detach(child.ino)

    async def mkdir(self, parent_ino: int, raw_name: bytes) -> Inode:
        self._check_writable()
        parent = self._dir(parent_ino)
        name = self._new_name(raw_name)
        if await self._find(parent, name) is not None:
            raise FSError(errno.EEXIST)
        prefix = parent.path + name + "/"
        if self.layout.hierarchical_namespace:
            await self._call(self.client.create_folder, prefix)
        else:
            await self._call(self.client.write_object, prefix, lambda off, n: b"", 0, if_generation_match=0)
        self._changed(parent.path + name)
        self.meta.put_dir(prefix)
        inode = self.inodes.resolve(parent.ino, name, EntryKind.DIR)
        inode.mtime_ns = inode.ctime_ns = time.time_ns()
        self.inodes.lookup(inode.ino)
        return inode

    async def _directory_is_empty(self, prefix: str) -> bool:
        page = await self._call(self.client.list_page, prefix, page_size=2,
                                folders_as_prefixes=self.layout.hierarchical_namespace)
        return not page.prefixes and all(meta.name == prefix for meta in page.objects)

    async def rmdir(self, parent_ino: int, raw_name: bytes) -> None:
        parent, name, entry = await self._existing(parent_ino, raw_name)
        if entry.kind is not EntryKind.DIR:
            raise FSError(errno.ENOTDIR)
        prefix = parent.path + name + "/"
        if not await self._directory_is_empty(prefix):
            raise FSError(errno.ENOTEMPTY)
        placeholder = await self._call(self.client.get_object, prefix)
        if placeholder is not None:
            await self._call(self.client.delete_object, prefix, if_generation_match=placeholder.generation)
        if self.layout.hierarchical_namespace:
            try:
                await self._call(self.client.delete_folder, prefix)
            except FSError as err:
                if err.errno != errno.ENOENT or placeholder is None:
                    raise
        self._changed(parent.path + name)
        self.meta.invalidate_listing(prefix)
        self.meta.put_absent(prefix)
        child = self.inodes.child(parent.ino, name)
        if child is not None:
            self.inodes.detach(child.ino)

    async def rename(self, old_parent_ino: int, raw_old: bytes, new_parent_ino: int, raw_new: bytes,
                     flags: int = 0) -> None:
        self._check_writable()
        if flags:
            raise FSError(errno.EINVAL)  # RENAME_NOREPLACE / RENAME_EXCHANGE are not supported
        old_parent, new_parent = self._dir(old_parent_ino), self._dir(new_parent_ino)
        old_name, new_name = self._new_name(raw_old), self._new_name(raw_new)
        entry = await self._find(old_parent, old_name)
        if entry is None:
            raise FSError(errno.ENOENT)
        target = await self._find(new_parent, new_name)
        source_path = old_parent.path + old_name
        target_path = new_parent.path + new_name
        if entry.kind is EntryKind.DIR:
            if target is not None:
                if target.kind is not EntryKind.DIR:
                    raise FSError(errno.ENOTDIR)
                if not await self._directory_is_empty(target_path + "/"):
                    raise FSError(errno.ENOTEMPTY)
            await self._rename_directory(source_path + "/", target_path + "/", target is not None)
        else:
            if target is not None and target.kind is EntryKind.DIR:
                raise FSError(errno.EISDIR)
            child = self.inodes.child(old_parent.ino, old_name)
            meta = entry.object
            if child is not None and child.ino in self._writes:
                await self._persist(self._writes[child.ino])  # pending writes go first
                meta = None  # the upload made a new generation
            meta = meta or await self._call(self.client.get_object, source_path)
            if meta is None:
                raise FSError(errno.ENOENT)
            moved_meta = await self._call(self.client.move_object, source_path, target_path,
                                          if_source_generation_match=meta.generation)
        for path in (source_path, target_path):
            self._changed(path)
        self.meta.put_absent(source_path)
        replaced = self.inodes.child(new_parent.ino, new_name)
        if replaced is not None:
            self.inodes.detach(replaced.ino)
        moved = self.inodes.child(old_parent.ino, old_name)
        if moved is not None:
            self.inodes.move(moved.ino, new_parent.ino, new_name)
        if entry.kind is not EntryKind.DIR:
            # The destination is a new generation; the moved inode now names it.
            self.meta.put_object(moved_meta)
            if moved is not None:
                self._apply(moved, moved_meta)

    async def _rename_directory(self, source: str, destination: str, replace: bool) -> None:
        if self.layout.hierarchical_namespace:
            if replace:
                await self._call(self.client.delete_folder, destination)
            await self._call(self.client.rename_folder, source, destination)
            self.meta.invalidate_listing(source)
            return
        limit = self.config.rename_dir_limit
        if not limit:
            raise FSError(errno.ENOTSUP, "renaming directories needs --rename-dir-limit on this bucket")
        objects, _, complete = await self._call(self.client.list_directory, source, folders_as_prefixes=False,
                                                delimiter="", limit=limit + 1)
        if not complete or len(objects) > limit:
            raise FSError(errno.ENOTSUP, f"directory has more than --rename-dir-limit={limit} objects")
        for meta in objects:
            await self._call(self.client.move_object, meta.name, destination + meta.name[len(source):],
                             if_source_generation_match=meta.generation)
        self.meta.invalidate_listing(source)

    async def symlink(self, parent_ino: int, raw_name: bytes, target: bytes) -> Inode:
        self._check_writable()
        parent = self._dir(parent_ino)
        name = self._new_name(raw_name)
        if await self._find(parent, name) is not None:
            raise FSError(errno.EEXIST)
        path = parent.path + name
        meta = await self._call(self.client.write_object, path, lambda off, n: b"", 0, if_generation_match=0,
                                metadata={SYMLINK_METADATA_KEY: target.decode("utf-8", "surrogateescape")})
        self._changed(path)
        self.meta.put_object(meta)
        inode = self.inodes.resolve(parent.ino, name, EntryKind.SYMLINK, generation=meta.generation)
        self._apply(inode, meta)
        self.inodes.lookup(inode.ino)
        return inode
