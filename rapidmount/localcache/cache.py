"""What the filesystem core asks of the local cache, in trio.

:meth:`LocalCache.open` gives a read-only open the copy of its generation:
an entry's file (a hit), or a fill's file as it is written (a miss that
starts or joins a fill), or nothing (read from the bucket). A hit is served
only if its file is the one the index recorded: same size, same inode, same
mtime and ctime, which any write to it moves; its CRC32C was checked at
this daemon's start or written by it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import trio

from rapidmount.localcache.directory import CacheDirectory, is_disk_fault, signature_of
from rapidmount.localcache.fill import FILL_RANGES, Fill, FillState, copy_object
from rapidmount.localcache.index import Entry, EntryKey
from rapidmount.storage.errors import StorageError
from rapidmount.storage.seam import ObjectStore

__all__ = ["LocalCache", "LocalFile", "CacheStats", "MAX_FILLS", "FAULT_PAUSE", "INDEX_SAVE_INTERVAL"]

log = logging.getLogger("rapidmount.localcache")

#: fills under way at once; an open past them reads from the bucket. Each keeps
#: FILL_KEPT ranges in the shared arena besides the FILL_RANGES in flight over all:
#: 4 x 2 x 4 MiB + 6 x 4 MiB stay within the default --transfer-buffer (64 MiB)
MAX_FILLS = 4
#: seconds filling stops after the cache's file system failed a write (ENOSPC, EIO)
FAULT_PAUSE = 60.0
#: seconds between writes of a changed index
INDEX_SAVE_INTERVAL = 1.0
#: seconds between writes of an index whose entries were only used (their order of use)
INDEX_TOUCH_INTERVAL = 30.0


@dataclass
class CacheStats:
    hits: int = 0  # opens given a complete entry
    misses: int = 0  # opens of an object with no complete entry
    served_bytes: int = 0  # bytes the FUSE process answered from cache files
    fills: int = 0  # entries completed
    fill_bytes: int = 0
    fills_failed: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    damaged: int = 0  # entries dropped because their file changed or failed its check
    passthrough_opens: int = 0  # hits the kernel reads itself
    daemon_opens: int = 0  # opens whose reads the FUSE process serves from a cache file
    fill_faults: int = 0  # writes the cache's file system refused

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(eq=False)
class LocalFile:
    """One handle's descriptor of its generation's copy: bytes ``[0, size)``
    may be read from it, those of a running ``fill`` once written."""

    fd: int
    size: int
    #: all of the object the handle sees, complete: the kernel may read it itself
    whole: bool
    identity: tuple[int, int]  # (st_dev, st_ino): passthrough opens of one inode share one file
    fill: Fill | None = None

    def covers(self, offset: int, end: int) -> bool:
        return end <= self.size and (self.fill is None or self.fill.readable(end))

    def read(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` (fewer only at ``size``'s end); None if
        the file has fewer: it changed underneath."""
        want = min(size, self.size - offset)
        if self.fd < 0:
            return None  # closed at the handle's release
        data = os.pread(self.fd, want, offset)
        return data if len(data) == want else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


class LocalCache:
    def __init__(self, directory: CacheDirectory, store: ObjectStore, *, bucket: str, fill_size: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.index = directory.index
        self.store = store
        self.bucket = bucket
        self.fill_size = fill_size
        self.clock = clock
        self.stats = CacheStats()
        self._fills: dict[EntryKey, Fill] = {}
        self._forgotten: set[Fill] = set()  # fills whose name this mount changed: never published
        self._checks: dict[EntryKey, trio.Event] = {}
        self._ranges = trio.Semaphore(FILL_RANGES)
        self._faulted_until = float("-inf")
        self._dirty = False  # entries changed: the index is written within INDEX_SAVE_INTERVAL
        self._touched = False  # only the order of use changed: written within INDEX_TOUCH_INTERVAL
        self._save_failed = False
        self._nursery: trio.Nursery | None = None

    @property
    def filling(self) -> bool:
        return self.clock() >= self._faulted_until

    def attach(self, nursery: trio.Nursery) -> None:
        """Start checking the entries an earlier run left, and saving the index."""
        self._nursery = nursery
        nursery.start_soon(self._check_all)
        nursery.start_soon(self._save_index_every, INDEX_SAVE_INTERVAL)

    async def close(self) -> None:
        """Stop (fills under way are dropped), save the index and let the directory go."""
        for fill in list(self._fills.values()):
            self._forgotten.add(fill)
        with contextlib.suppress(OSError):
            if self._dirty or self._touched:
                self.directory.save_index()
        self.directory.close()

    # -- opens ------------------------------------------------------------------------------------

    def holds(self, name: str, generation: int) -> bool:
        """An entry (complete, perhaps not yet checked) holds this generation."""
        entry = self.index.get(self.bucket, name)
        return entry is not None and entry.key.generation == generation

    async def open(self, name: str, generation: int, size: int, crc32c: int | None) -> LocalFile | None:
        """The copy a read-only open of this generation (of ``size`` bytes, as
        the metadata has it) reads, or None: read from the bucket."""
        if size <= 0:
            return None
        key = EntryKey(self.bucket, name, generation)
        entry = self.index.get(self.bucket, name)
        if entry is not None and entry.key != key:
            if entry.key.generation < generation:
                self._drop(entry, "a newer generation replaced it", damaged=False)
            entry = None
        if entry is not None:
            local = await self._open_entry(entry, size)
            if local is not None:
                self.stats.hits += 1
                self.index.touch(entry)
                self._touched = True
                if entry.size < size:  # an unfinalized object grew: copy it again, read the rest meanwhile
                    self._start_fill(key, size, crc32c)
                return local
        self.stats.misses += 1
        fill = self._fills.get(key) or self._start_fill(key, size, crc32c)
        if fill is None or fill.size < size:  # a fill of the object before it grew: the bucket, meanwhile
            return None
        try:
            fd = os.open(fill.path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
        except OSError:
            return None
        return LocalFile(fd, min(size, fill.size), False, (st.st_dev, st.st_ino), fill)

    async def _open_entry(self, entry: Entry, size: int) -> LocalFile | None:
        if not entry.verified and not await self._check(entry):
            return None
        if self.index.get(self.bucket, entry.key.name) is not entry:
            return None  # dropped or replaced while it was checked
        try:
            fd = os.open(self.directory.path_of(entry), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._drop(entry, "its file is gone")
            return None
        st = os.fstat(fd)
        if st.st_size != entry.size or signature_of(st) != entry.signature:
            os.close(fd)
            self._drop(entry, "its file changed underneath")
            return None
        return LocalFile(fd, min(entry.size, size), entry.size == size, (st.st_dev, st.st_ino))

    def damaged(self, local: LocalFile, name: str) -> None:
        """A read of ``local`` came short: its file changed underneath."""
        entry = self.index.get(self.bucket, name)
        if entry is not None and local.fill is None and entry.signature[0] == local.identity[1]:
            self._drop(entry, "its file came short")  # that entry's file, not a newer copy's

    def forget(self, name: str) -> None:
        """This mount changes ``name`` (a write, truncation, rename, unlink):
        no copy of it is served or published again."""
        entry = self.index.remove(self.bucket, name)
        if entry is not None:
            self.directory.delete(entry)
            self._dirty = True
        for key, fill in self._fills.items():
            if key.name == name:
                self._forgotten.add(fill)

    def _drop(self, entry: Entry, why: str, *, damaged: bool = True) -> None:
        if self.index.get(self.bucket, entry.key.name) is entry:
            self.index.remove(self.bucket, entry.key.name)
            self._dirty = True
        self.directory.delete(entry)
        if damaged:
            self.stats.damaged += 1
            log.warning("local cache: dropped %s#%d: %s; it is read from the bucket", entry.key.name,
                        entry.key.generation, why)

    # -- checks -----------------------------------------------------------------------------------

    async def _check(self, entry: Entry) -> bool:
        """Read the entry's file whole and compare its CRC32C (once per run)."""
        running = self._checks.get(entry.key)
        if running is not None:
            await running.wait()
            return entry.verified
        done = self._checks[entry.key] = trio.Event()
        try:
            ok = await trio.to_thread.run_sync(self.directory.check, entry)
        finally:
            del self._checks[entry.key]
            done.set()
        if not ok:
            self._drop(entry, "its size or CRC32C does not match the index")
        else:
            self._dirty = True  # its signature may have moved (a copied directory)
        return ok

    async def _check_all(self) -> None:
        for entry in self.index:
            if not entry.verified and self.index.get(self.bucket, entry.key.name) is entry:
                await self._check(entry)

    async def _save_index_every(self, interval: float) -> None:
        since = 0.0
        while True:
            await trio.sleep(interval)
            since += interval
            if self._dirty or (self._touched and since >= INDEX_TOUCH_INTERVAL):
                self._dirty = self._touched = False
                since = 0.0
                document = self.directory.encode_index()
                try:
                    await trio.to_thread.run_sync(self.directory.write_index, document)
                    self._save_failed = False
                except OSError as err:
                    self._dirty = True
                    if not self._save_failed:
                        log.warning("local cache: cannot write its index in %s: %s", self.directory.root,
                                    err.strerror or err)
                    self._save_failed = True

    # -- fills ------------------------------------------------------------------------------------

    def _start_fill(self, key: EntryKey, size: int, crc32c: int | None) -> Fill | None:
        if (self._nursery is None or size > self.fill_size or not self.filling or len(self._fills) >= MAX_FILLS
                or key in self._fills):
            return None
        evicted = self.index.reserve(size)
        if evicted is None:
            return None
        for entry in evicted:
            self.directory.delete(entry)
            self.stats.evictions += 1
            self.stats.evicted_bytes += entry.size
            self._dirty = True
        path = str(self.directory.partial / key.file_name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as err:
            self.index.release(size)
            self._fault(err)
            return None
        try:
            os.posix_fallocate(fd, 0, size)  # the space now, or ENOSPC now
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # else the writes find out
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                self.index.release(size)
                self._fault(err)
                return None
        for other in self._fills.values():
            if other.key.name == key.name and other.key.generation < key.generation:
                self._forgotten.add(other)  # an older generation's copy would replace this one
        fill = self._fills[key] = Fill(key, size, path)
        self._nursery.start_soon(self._run_fill, fill, fd, crc32c)
        return fill

    def _fault(self, err: OSError) -> None:
        if not is_disk_fault(err):
            log.warning("local cache: cannot write in %s: %s", self.directory.root, err.strerror or err)
            return
        self.stats.fill_faults += 1
        if self.filling:
            log.warning("local cache: %s in %s: no object is copied there for %d s; reads go on from the bucket",
                        err.strerror or err, self.directory.root, FAULT_PAUSE)
        self._faulted_until = self.clock() + FAULT_PAUSE

    async def _run_fill(self, fill: Fill, fd: int, crc32c: int | None) -> None:
        key = fill.key
        reader = self.store.open_reader(key.name, key.generation)
        published = False
        try:
            crc = await copy_object(reader, fd, fill, self._ranges)
            if crc32c is not None and crc != crc32c:
                log.warning("local cache: %s#%d: the bytes read have CRC32C %08x, the object %08x; not cached",
                            key.name, key.generation, crc, crc32c)
            elif fill not in self._forgotten:
                self._publish(fill, fd, crc)
                published = True
        except (StorageError, EOFError) as err:
            log.info("local cache: %s#%d not cached: %s", key.name, key.generation, err)
        except OSError as err:
            self._fault(err)
        except Exception:
            log.exception("local cache: copying %s#%d failed", key.name, key.generation)
        finally:
            os.close(fd)
            del self._fills[key]
            self._forgotten.discard(fill)
            if not published:
                self.index.release(fill.size)
                with contextlib.suppress(OSError):
                    os.unlink(fill.path)
                self.stats.fills_failed += 1
                fill.end(FillState.FAILED)
            with trio.CancelScope(shield=True):
                await reader.close()

    def _publish(self, fill: Fill, fd: int, crc: int) -> None:
        """The complete, checked copy becomes an entry (its file renamed into
        ``objects/`` first, so the index never names a partial file)."""
        key = fill.key
        path = self.directory.objects / key.file_name
        os.rename(fill.path, path)
        fill.path = str(path)
        entry = Entry(key, fill.size, crc, signature_of(os.fstat(fd)), verified=True)
        old = self.index.add(entry, reserved=fill.size)
        if old is not None and old.key != key:
            self.directory.delete(old)
        self._dirty = True
        self.stats.fills += 1
        self.stats.fill_bytes += fill.size
        fill.end(FillState.DONE)
