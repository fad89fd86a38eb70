"""The write path: one explicit state machine per file open for writing.

A file's pending changes are shared by all its writing handles::

    CLEAN ──first write at the end of an appendable object──▶ STREAMING
      │                                                          │ random write, O_TRUNC, truncate
      └──any other first write, O_TRUNC, truncate──▶ STAGED ◀────┘
                                                     │   ▲
                                      fsync / close  ▼   │ done
                                                  UPLOADING
    any state ──another writer won (ESTALE), no room to stage (ENOSPC), …──▶ FAILED(errno)
    last handle released ──▶ CLOSED

STREAMING appends go to the object over one stream (zonal buckets). STAGED
keeps the whole file in a local copy under ``--temp-dir``, uploaded as a new
generation with a generation precondition on fsync and close. FAILED is
sticky: every later write, fsync and close returns its errno.

Every close (FLUSH) uploads what changed since the last upload, a
truncation alone included, and returns 0 only once the bucket holds it:
close-to-open consistency. A close with nothing new uploads nothing. On
buckets with appendable objects, a file emptied by a close's upload keeps
that upload's stream: ``echo x > existing`` closes a duplicate of its
descriptor between the ``O_TRUNC`` and the write, and the write then streams
into the generation that close made, so the command makes one generation.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field

import trio

from rapidmount.config import MountConfig
from rapidmount.core.errors import FSError, fs_error, local_error, log_failure, storage_call
from rapidmount.core.namespace import Namespace
from rapidmount.core.stats import FSStats
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import MODE_METADATA_KEY, MTIME_METADATA_KEY, ObjectMeta, format_mtime
from rapidmount.storage.seam import ObjectAppender, ObjectReader, ObjectStore
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.names import EntryKind

log = logging.getLogger("rapidmount.fs")

COPY_CHUNK = 8 << 20  # bytes per read or append when copying a whole object


def reserve(fd: int, offset: int, length: int) -> None:
    """Allocate room for ``length`` bytes at ``offset`` of a staged copy (ENOSPC if there is none)."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # Not supported here: a short write still ends in ENOSPC.


def write_staged(fd: int, data, offset: int) -> None:
    """Write all of ``data`` to a staged copy, or nothing: the room is reserved
    first, so a full ``--temp-dir`` refuses the write (ENOSPC) rather than
    keeping part of it."""
    if not data:
        return
    size = os.fstat(fd).st_size
    try:
        reserve(fd, offset, len(data))
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            if not written:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view, offset = view[written:], offset + written
    except OSError:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)  # a refused write does not grow the file
        raise


class WriteMode(enum.Enum):
    CLEAN = "clean"  # open for writing, nothing changed yet
    STREAMING = "streaming"  # appends stream to the object itself
    STAGED = "staged"  # a local copy is the file
    UPLOADING = "uploading"  # the local copy is being uploaded
    FAILED = "failed"  # sticky: ``failure`` is returned from now on
    CLOSED = "closed"  # the last writing handle was released


@dataclass
class WriteState:
    """The pending changes of one file, shared by its writing handles."""

    inode: Inode
    size: int
    base_generation: int  # precondition of a staged upload (0: must not exist)
    base_size: int | None = None  # size of the unfinalized object the staged copy was made from
    mode: WriteMode = WriteMode.CLEAN
    appender: ObjectAppender | None = None  # STREAMING
    staged_fd: int | None = None  # STAGED and UPLOADING
    dirty: bool = False  # the staged copy holds changes not uploaded yet
    handles: int = 0
    failure: FSError | None = None  # FAILED
    unlinked: bool = False  # the name was removed while open: nothing is ever uploaded
    mtime_ns: int | None = None  # set on the open file (utime); stored with the last upload or close
    uploaded_mtime_ns: int | None = None  # the time the last staged upload carried
    mode_changed: bool = False  # chmod (--preserve-mode) since the last upload
    lock: trio.Lock = field(default_factory=trio.Lock)  # one upload or restage at a time
    closed: trio.Event = field(default_factory=trio.Event)  # the last release finished its upload

    @property
    def holds_bytes(self) -> bool:
        """Reads must come from this state: it has bytes the bucket may not have."""
        return self.appender is not None or self.staged_fd is not None

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.mode is WriteMode.CLOSED:
            raise FSError(errno.EBADF)

    def fail(self, error: FSError) -> FSError:
        self.mode, self.failure = WriteMode.FAILED, error
        return error


class WritePath:
    """Every file open for writing, by inode number."""

    def __init__(self, config: MountConfig, store: ObjectStore, namespace: Namespace, stats: FSStats) -> None:
        self.config = config
        self.store = store
        self.layout = store.layout
        self.namespace = namespace
        self.stats = stats
        self.temp_dir = config.temp_dir or tempfile.gettempdir()
        self._states: dict[int, WriteState] = {}
        self._closing: dict[int, WriteState] = {}  # last handle released, final upload under way

    def get(self, ino: int) -> WriteState | None:
        return self._states.get(ino)

    def pending(self, ino: int) -> WriteState | None:
        """The file's state while it is open for writing or its last close runs."""
        return self._states.get(ino) or self._closing.get(ino)

    def knows_better(self, ino: int) -> bool:
        """The file's pending writes are truer than any stat of the bucket:
        it is open for writing or closing, and its last upload was not refused
        (a refused file's name is the other client's object again)."""
        state = self.pending(ino)
        return state is not None and state.failure is None

    def __contains__(self, ino: int) -> bool:
        return ino in self._states

    def snapshot(self) -> list[WriteState]:
        """A copy safe to take from another thread (the metrics endpoint)."""
        return list(self._states.values())

    def _storing(self, ino: int) -> WriteState | None:
        """The state whose last upload or close will still store metadata."""
        state = self.pending(ino)
        return None if state is None or state.unlinked or state.failure is not None else state

    def keep_mtime(self, ino: int, mtime_ns: int) -> bool:
        """utime of a file open for writing (or closing): True if its last
        upload or close will store ``mtime_ns``."""
        state = self._storing(ino)
        if state is not None:
            state.mtime_ns = mtime_ns
        return state is not None

    def keep_mode(self, ino: int) -> bool:
        """chmod of a file open for writing: True if its last upload or close will store it."""
        state = self._storing(ino)
        if state is not None:
            state.mode_changed = True
        return state is not None

    def _metadata(self, state: WriteState) -> dict[str, str] | None:
        """Custom metadata a new generation of the file carries: its time and mode."""
        metadata = {}
        if state.mtime_ns is not None:
            metadata[MTIME_METADATA_KEY] = format_mtime(state.mtime_ns)
        if state.inode.permissions is not None:
            metadata[MODE_METADATA_KEY] = f"{stat.S_IFREG | state.inode.permissions:o}"
        return metadata or None

    def state_for(self, inode: Inode) -> WriteState:
        state = self._states.get(inode.ino)
        if state is None:
            state = WriteState(inode, size=inode.size, base_generation=inode.generation)
            self._states[inode.ino] = state
        return state

    @contextlib.contextmanager
    def _staging(self, inode: Inode, state: WriteState | None = None):
        """A failure of the local copy (a full ``--temp-dir``) as one logged
        errno. With ``state`` it sticks: the copy no longer holds what was
        written, so it must never be uploaded."""
        try:
            yield
        except OSError as err:
            error = local_error(err, f"staging {inode.path!r} in {self.temp_dir}")
            raise (state.fail(error) if state is not None else error) from None

    async def _appender_call(self, state: WriteState, fn, *args):
        """A call on the appender; a failure sticks to the state (e.g. ESTALE)."""
        try:
            return await fn(*args)
        except StorageError as err:
            raise state.fail(fs_error(err)) from None

    # -- opening ----------------------------------------------------------------------------------

    async def create(self, parent: Inode, name: str) -> Inode:
        """A new, empty file ``name``: on zonal buckets an appendable object at once."""
        path = parent.path + name
        generation = 0
        appender = None
        if self.layout.appendable_objects:
            appender = self.store.open_appender(path)
            try:
                meta = await appender.create(if_generation_match=0)
            except StorageError as err:
                raise FSError(errno.EEXIST if err.errno == errno.ESTALE else err.errno, str(err)) from None
            generation = meta.generation if meta is not None else appender.generation
        self.namespace.changed(path)
        inode = self.namespace.inodes.resolve(parent.ino, name, EntryKind.FILE, generation=generation or None)
        now = time.time_ns()
        inode.generation, inode.size, inode.finalized = generation, 0, False
        inode.mtime_ns = inode.ctime_ns = now
        state = self.state_for(inode)
        state.base_generation = generation
        if appender is not None:
            state.appender, state.mode = appender, WriteMode.STREAMING
        else:
            await self._stage(state, keep=0)  # regional buckets: uploaded on fsync and close
        self.namespace.inodes.lookup(inode.ino)
        return inode

    async def opened(self, inode: Inode, truncate: bool) -> None:
        state = self.state_for(inode)
        state.handles += 1
        if truncate and state.size:
            async with state.lock:
                await self._truncate_open_file(state, 0)

    # -- writing ----------------------------------------------------------------------------------

    async def write(self, inode: Inode, offset: int, data: bytes, append_only: bool) -> int:
        state = self.state_for(inode)
        state.check()
        if state.mode is WriteMode.CLEAN:
            offset = await self._choose_mode(state, offset, append_only)
        elif append_only:
            offset = state.size
        if state.mode is WriteMode.STREAMING and offset != state.size:
            async with state.lock:
                await self._stage(state, keep=state.size)  # not an append: stage the whole object
        if state.mode is WriteMode.STREAMING:
            await self._appender_call(state, state.appender.append, bytes(data))
            state.size += len(data)
        else:
            async with state.lock:  # never change the copy under an upload
                with self._staging(inode, state):
                    write_staged(state.staged_fd, data, offset)
                state.size = max(state.size, offset + len(data))
                state.dirty = True
        self.stats.bytes_written += len(data)
        inode.size = state.size
        inode.mtime_ns = time.time_ns()
        state.mtime_ns = None  # a write is newer than any time set before it
        return len(data)

    async def _choose_mode(self, state: WriteState, offset: int, append_only: bool) -> int:
        """The first write decides: append to the object in place, or stage it.

        Returns the offset to write at: for ``O_APPEND`` that is the object's
        end as the bucket reports it now, not as this mount last saw it.
        """
        inode = state.inode
        for attempt in range(2):
            if self.layout.appendable_objects and not inode.finalized and inode.generation and (
                    append_only or offset == state.size):
                appender = self.store.open_appender(inode.path)
                try:
                    size = await appender.takeover(inode.generation)
                except StorageError as err:
                    log.info("cannot take over %r (%s); staging instead", inode.path, err)
                else:
                    if append_only or size == offset:
                        state.appender, state.mode = appender, WriteMode.STREAMING
                        state.size = inode.size = size
                        return size
                    await appender.abort()
            # Our view may be stale (the object grew, or was finalized): refresh
            # it and decide again, once.
            if attempt:
                break
            # Not namespace.refresh: it leaves inodes with pending writes (this one) as they are.
            meta = await storage_call(self.store.get_object, inode.path)
            if meta is None or (inode.generation and meta.generation != inode.generation):
                self.namespace.meta.invalidate(inode.path)
                raise FSError(errno.ESTALE, f"{inode.path!r} was replaced by another client")
            self.namespace.meta.put_object(meta)
            inode.size, inode.finalized = meta.size, meta.finalized
            if not append_only and offset != inode.size:
                break
            state.size = inode.size
            offset = state.size if append_only else offset
        async with state.lock:
            await self._stage(state, keep=state.size)
        return state.size if append_only else offset

    async def _stage(self, state: WriteState, *, keep: int) -> None:
        """Make the file STAGED: a local copy holding its first ``keep`` bytes.

        The caller holds ``state.lock``.
        """
        if state.staged_fd is not None:
            # Already staged: the local copy is the file; the bucket is not read
            # again, and what the copy was made from (base_*) stays the same.
            os.ftruncate(state.staged_fd, keep)
            state.size = keep
            state.dirty = True
            return
        if state.mode is WriteMode.STREAMING:
            # Appended bytes become part of the object first; then stage it all.
            await self._appender_call(state, state.appender.close)
            # Every byte is in the object now: if the copy fails, nothing is pending.
            state.appender, state.mode = None, WriteMode.CLEAN
            state.base_generation = state.inode.generation
        inode = state.inode
        fd = await self._copy_of(inode, keep)
        state.staged_fd, state.mode = fd, WriteMode.STAGED
        # Appends keep the generation, so the precondition alone would not
        # notice another client appending to an unfinalized object meanwhile.
        state.base_size = inode.size if inode.generation and not inode.finalized else None
        state.size = keep
        state.dirty = True

    async def _copy_of(self, inode: Inode, keep: int) -> int:
        """A descriptor of an unlinked temporary file holding the object's first ``keep`` bytes.

        A full ``--temp-dir`` fails it with ENOSPC before anything is read
        (the room for the copy is reserved first) and leaves nothing behind.
        """
        with self._staging(inode):
            fd, path = tempfile.mkstemp(prefix="rapidmount-", dir=self.temp_dir)
            os.unlink(path)  # lives as long as the descriptor
        copied = 0
        try:
            if keep and inode.generation:
                if min(keep, inode.size):
                    with self._staging(inode):
                        reserve(fd, 0, min(keep, inode.size))
                reader = self.store.open_reader(inode.path, inode.generation)
                try:
                    while copied < keep:
                        chunk = await storage_call(reader.read, copied, min(COPY_CHUNK, keep - copied))
                        if not chunk:
                            break
                        with self._staging(inode):
                            write_staged(fd, chunk, copied)
                        copied += len(chunk)
                finally:
                    await reader.close()
            if copied < keep:
                with self._staging(inode):
                    os.ftruncate(fd, keep)
        except BaseException:
            os.close(fd)  # an incomplete copy must never be uploaded
            raise
        return fd

    async def read_own(self, state: WriteState, reader: ObjectReader, offset: int, size: int):
        """Read through a file with pending writes: they are the truth."""
        if state.failure is not None and state.staged_fd is None:
            raise state.failure  # a failed stream sticks to reads too
        end = min(offset + size, state.size)
        if offset >= end:
            return b""
        if state.staged_fd is not None:
            return os.pread(state.staged_fd, end - offset, offset)
        # Streaming: make the bucket hold every byte, then read it back.
        await self._appender_call(state, state.appender.flush)
        return await storage_call(reader.read, offset, end - offset)

    # -- durability ---------------------------------------------------------------------------------

    async def persist(self, state: WriteState, *, closing: bool = False) -> None:
        """fsync(2), and close(2) when ``closing``: every change made so far,
        a truncation alone included, is in the bucket when this returns."""
        if state.failure is not None:
            raise state.failure
        if state.unlinked:
            return  # nothing of an unlinked file is kept
        if state.mode is WriteMode.STREAMING:
            await self._appender_call(state, state.appender.flush)
            self.stats.writers_flushed += 1
            self.namespace.changed(state.inode.path)
        elif state.staged_fd is not None:
            async with state.lock:
                if state.dirty:
                    await self._upload(state, keep_stream=closing)

    async def _upload(self, state: WriteState, *, keep_stream: bool = False) -> None:
        """Upload the staged copy as a new generation (the caller holds ``state.lock``).

        ``keep_stream``: a close that uploads an empty file keeps the upload's
        stream, and the file goes on STREAMING into that generation: a write
        through another descriptor of the same open file may follow (see the
        module's docstring); the release closes the stream otherwise."""
        inode = state.inode
        fd, size = state.staged_fd, state.size
        state.mode = WriteMode.UPLOADING
        kept: list[ObjectAppender] = []
        try:
            meta = await self._upload_copy(state, fd, size, kept if keep_stream and not size else None)
        except StorageError as err:
            failure = fs_error(err)
            if err.errno == errno.ESTALE:
                raise state.fail(failure) from None  # someone else changed the object: never overwrite it
            state.mode = WriteMode.STAGED  # still dirty: close tries again
            raise failure from None
        state.mode = WriteMode.STAGED
        state.dirty = False
        self.stats.writers_flushed += 1
        state.base_generation = meta.generation
        state.base_size = meta.size if not meta.finalized else None
        self.namespace.changed(inode.path)
        self.namespace.meta.put_object(meta)
        inode.generation, inode.finalized = meta.generation, meta.finalized
        inode.metageneration = meta.metageneration  # a new generation starts its own count
        inode.size = size
        if kept:
            os.close(fd)
            state.staged_fd = None
            state.appender, state.mode = kept[0], WriteMode.STREAMING

    async def _upload_copy(self, state: WriteState, fd: int, size: int,
                           keep: list[ObjectAppender] | None = None) -> ObjectMeta:
        """The staged copy as a new generation; with ``keep`` (an appendable
        bucket, not finalizing), the stream that wrote it is left open and
        handed over in that list instead of being closed."""
        path = state.inode.path
        state.uploaded_mtime_ns, state.mode_changed = state.mtime_ns, False
        if state.base_size is not None:
            current = await self.store.get_object(path)
            if current is None or current.generation != state.base_generation or current.size != state.base_size:
                raise StorageError(f"upload {path!r}: the object changed since it was staged",
                                   errno_=errno.ESTALE, object_name=path)
        if not self.layout.appendable_objects:
            return await self.store.write_object(path, fd, size,
                                                 if_generation_match=state.base_generation,
                                                 metadata=self._metadata(state))
        appender = self.store.open_appender(path)
        try:
            await appender.create(if_generation_match=state.base_generation, metadata=self._metadata(state))
            for offset in range(0, size, COPY_CHUNK):
                await appender.append(os.pread(fd, min(COPY_CHUNK, size - offset), offset))
            if self.config.finalize_on_close:
                return await appender.finalize()
            if keep is not None:
                await appender.flush()
                keep.append(appender)
            else:
                await appender.close()
        finally:
            if not keep:
                await appender.abort()
        meta = await self.store.get_object(path)
        if meta is None:
            raise StorageError(f"upload {path!r}: the object vanished", errno_=errno.ESTALE, object_name=path)
        return meta

    async def closed(self, inode: Inode) -> WriteState | None:
        """A writing handle was released; the last one ends the write: then
        the state it ended (its ``failure`` says if its last upload was refused)."""
        state = self._states.get(inode.ino)
        if state is None:
            return None
        state.handles -= 1
        if state.handles > 0:
            return None
        del self._states[inode.ino]
        self._closing[inode.ino] = state
        try:
            if state.failure is None and not state.unlinked:
                if state.mode is WriteMode.STREAMING:
                    if self.config.finalize_on_close:
                        meta = await state.appender.finalize()
                        inode.finalized = True
                        inode.generation, inode.metageneration = meta.generation, meta.metageneration
                    else:
                        await state.appender.close()
                    self.stats.writers_flushed += 1
                elif state.dirty:
                    async with state.lock:
                        await self._upload(state)
                # A utime or chmod may arrive while this runs (close() has returned): loop.
                while state.mode_changed or state.mtime_ns not in (None, state.uploaded_mtime_ns):
                    state.mode_changed, state.uploaded_mtime_ns = False, state.mtime_ns
                    await self._store_metadata(state)
        except StorageError as err:
            log_failure(err, f"closing {inode.path!r}: ")
        except FSError:
            pass  # _upload logged it
        finally:
            del self._closing[inode.ino]
            state.closed.set()
            await self._release(state)
        return state

    async def _store_metadata(self, state: WriteState) -> None:
        """A time or mode set on the open file, stored after the bytes on the
        generation this mount just wrote."""
        inode = state.inode
        meta = await self.store.get_object(inode.path)
        if meta is None or meta.generation != inode.generation:
            return  # replaced meanwhile: the time was for bytes that are gone
        meta = await self.store.update_metadata(inode.path, meta.generation, self._metadata(state),
                                                if_metageneration_match=meta.metageneration)
        self.namespace.meta.put_object(meta)
        inode.metageneration = meta.metageneration  # a later utime or chmod is conditional on it
        inode.mtime_ns = meta.mtime_ns

    async def _release(self, state: WriteState) -> None:
        if state.appender is not None:
            await state.appender.abort()
            state.appender = None
        if state.staged_fd is not None:
            os.close(state.staged_fd)
            state.staged_fd = None
        inode = state.inode
        self.namespace.changed(inode.path)
        if state.failure is None and not state.dirty and not state.unlinked:
            inode.size = state.size
            if state.mtime_ns is not None:
                inode.mtime_ns = state.mtime_ns
        self.namespace.kernel.forget_attributes(inode.ino)  # the bucket's size and time from now on
        if state.failure is None:
            state.mode = WriteMode.CLOSED

    # -- truncation -------------------------------------------------------------------------------

    async def truncate(self, inode: Inode, size: int) -> None:
        """truncate(2) or ftruncate(2): a file open for writing keeps the
        change until a close or fsync uploads it; a truncate(2) of a file no
        handle writes is uploaded before it returns."""
        state = self.state_for(inode)
        state.check()
        if size == state.size:
            if state.handles == 0 and state.mode is WriteMode.CLEAN:
                del self._states[inode.ino]
            return
        if state.handles:
            async with state.lock:
                await self._truncate_open_file(state, size)
            return
        # truncate(2) without an open file: stage, upload now, and forget the
        # state whatever happens, so a refusal leaves nothing pending behind.
        old_size = inode.size
        try:
            async with state.lock:
                await self._stage(state, keep=min(size, state.size))
                with self._staging(inode, state):
                    os.ftruncate(state.staged_fd, size)
                state.size = inode.size = size
                await self._upload(state)
        except BaseException:
            inode.size = old_size
            raise
        finally:
            if self._states.get(inode.ino) is state:
                del self._states[inode.ino]
            if state.staged_fd is not None:
                os.close(state.staged_fd)
                state.staged_fd = None

    async def _truncate_open_file(self, state: WriteState, size: int) -> None:
        """Stage the file at ``size`` (the caller holds ``state.lock``); the
        next close or fsync of a writing handle uploads it."""
        await self._stage(state, keep=min(size, state.size))
        with self._staging(state.inode, state):
            os.ftruncate(state.staged_fd, size)
        state.size = state.inode.size = size

    # -- names changing under open files ------------------------------------------------------------

    async def settle(self, ino: int) -> None:
        """Wait until a released file's final upload and metadata are stored:
        a rename or unlink that came after close() must not overtake them."""
        state = self._closing.get(ino)
        if state is not None:
            await state.closed.wait()

    def below(self, prefix: str) -> list[Inode]:
        """Files under the directory ``prefix`` that are open for writing or still closing."""
        states = [*self._states.values(), *self._closing.values()]
        return list({state.inode.ino: state.inode for state in states if state.inode.path.startswith(prefix)}.values())

    async def before_rename(self, inode: Inode) -> None:
        """Pending writes go first, so the renamed object holds every byte."""
        state = self._states.get(inode.ino)
        if state is not None:
            await self.persist(state)

    async def after_rename(self, inode: Inode, moved: ObjectMeta) -> None:
        """The open file now names ``moved``: later writes, fsyncs and close go there."""
        state = self._states.get(inode.ino)
        if state is None:
            return
        inode.generation, inode.finalized = moved.generation, moved.finalized
        state.base_generation = moved.generation
        state.base_size = moved.size if not moved.finalized else None
        if state.mode is WriteMode.STREAMING:
            # Everything is persisted; the stream still names the old object.
            # The next write takes the moved object over under its new name.
            await state.appender.abort()
            state.appender, state.mode = None, WriteMode.CLEAN
            inode.size = state.size = moved.size

    async def before_unlink(self, inode: Inode) -> None:
        """An open file loses its name: its descriptors go on working on a
        local copy (reads see every byte, writes are accepted), and nothing is
        uploaded any more."""
        state = self._states.get(inode.ino)
        if state is None or state.unlinked:
            return
        async with state.lock:
            if state.staged_fd is None and state.failure is None:
                if state.mode is WriteMode.STREAMING:
                    await self._appender_call(state, state.appender.flush)
                await self._stage(state, keep=state.size)
                state.dirty = False  # the copy is what the bucket holds

    def unlinked(self, inode: Inode) -> None:
        state = self._states.get(inode.ino)
        if state is not None:
            state.unlinked = True
