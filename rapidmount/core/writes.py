"""The write path: the write state of every file with pending writes.

Each file's phase (``core/write_state.py``) is one value, changed only
through its table. Streaming appends go to the object over one stream
(zonal buckets). Staged keeps the whole file in a local copy under
``--temp-dir`` (``core/staged.py``), uploaded as a new generation with a
generation precondition on fsync and close. Failed is sticky: every later
write, fsync and close returns its errno.

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
import errno
import logging
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

import trio

from rapidmount.daemon.config import MountConfig
from rapidmount.core.errors import FSError, fs_error, local_error, log_failure, storage_call
from rapidmount.core.namespace import Namespace
from rapidmount.core.staged import STAGED_IO_THREADS, StagedFile
from rapidmount.core.stats import FSStats
from rapidmount.core.write_state import (Clean, Closed, Closing, Failed, Staged, Streaming, Unlinked, Uploading,
                                         WriteState)
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import MODE_METADATA_KEY, MTIME_METADATA_KEY, ObjectMeta, format_mtime
from rapidmount.storage.seam import ObjectAppender, ObjectReader, ObjectStore
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.names import EntryKind
from rapidmount.shared.views import Arriving, landed

log = logging.getLogger("rapidmount.fs")
_R = TypeVar("_R")
#: An open file goes on under the name its object was moved to (:meth:`WritePath.moving`).
Follow = Callable[[Inode, ObjectMeta], Awaitable[None]]

COPY_CHUNK = 8 << 20  # bytes per read when copying an object into a staged file


class WritePath:
    """Every file with write state, by inode number: open for writing, or
    closing (its last release, or a truncate(2) of a file no handle writes)."""

    def __init__(self, config: MountConfig, store: ObjectStore, namespace: Namespace, stats: FSStats) -> None:
        self.config = config
        self.store = store
        self.layout = store.layout
        self.namespace = namespace
        self.stats = stats
        self.temp_dir = config.temp_dir or tempfile.gettempdir()
        self._states: dict[int, WriteState] = {}
        self._disk = trio.CapacityLimiter(STAGED_IO_THREADS)  # the threads of staged-file I/O

    # -- which files have write state ----------------------------------------------------------------

    def pending(self, ino: int) -> WriteState | None:
        """The file's write state, from its first open for writing (or create,
        or a truncate(2)) until its last close has finished; else None."""
        return self._states.get(ino)

    def knows_better(self, ino: int) -> bool:
        """The file's pending writes are truer than any stat of the bucket:
        it has write state, and was not refused (a refused file's name is the
        other client's object again)."""
        state = self.pending(ino)
        return state is not None and state.failure is None

    def snapshot(self) -> list[WriteState]:
        """A copy safe to take from another thread (the metrics endpoint)."""
        return list(self._states.values())

    def below(self, prefix: str) -> list[Inode]:
        """Files under the directory ``prefix`` with write state."""
        return [state.inode for state in self._states.values() if state.inode.path.startswith(prefix)]

    async def settle(self, ino: int) -> WriteState | None:
        """Wait until no closing of the file is under way (a released file's
        final upload and metadata are stored: an open, rename or unlink that
        came after close() must not overtake them); then its state, if any."""
        while (state := self.pending(ino)) is not None and isinstance(state.phase, Closing):
            await state.phase.done.wait()
        return state

    async def _open_state(self, inode: Inode) -> WriteState:
        """The file's state for a new writer, made if it has none."""
        state = await self.settle(inode.ino)
        if state is None:
            state = self._states[inode.ino] = WriteState(inode, size=inode.size, base_generation=inode.generation)
        return state

    # -- metadata set on open files ------------------------------------------------------------------

    def _storing(self, ino: int) -> WriteState | None:
        """The state whose last upload or close will still store metadata."""
        state = self.pending(ino)
        return None if state is None or state.unlinked or state.failure is not None else state

    def keep_mtime(self, ino: int, mtime_ns: int) -> bool:
        """utime of a file open for writing (or closing): True if its last
        upload or close will store ``mtime_ns``."""
        state = self._storing(ino)
        if state is not None:
            state.metadata.mtime_ns = mtime_ns
        return state is not None

    def keep_mode(self, ino: int) -> bool:
        """chmod of a file open for writing: True if its last upload or close will store it."""
        state = self._storing(ino)
        if state is not None:
            state.metadata.mode_changed = True
        return state is not None

    def _metadata(self, state: WriteState) -> dict[str, str] | None:
        """Custom metadata a new generation of the file carries: its time and mode."""
        metadata = {}
        if state.metadata.mtime_ns is not None:
            metadata[MTIME_METADATA_KEY] = format_mtime(state.metadata.mtime_ns)
        if state.inode.permissions is not None:
            metadata[MODE_METADATA_KEY] = f"{stat.S_IFREG | state.inode.permissions:o}"
        return metadata or None

    # -- failures ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _staging(self, inode: Inode, state: WriteState | None = None) -> Iterator[None]:
        """A failure of the local copy (a full ``--temp-dir``) as one logged
        errno. With ``state`` it sticks: the copy no longer holds what was
        written, so it must never be uploaded."""
        try:
            yield
        except OSError as err:
            error = local_error(err, f"staging {inode.path!r} in {self.temp_dir}")
            raise (state.fail(error) if state is not None else error) from None

    async def _appender_call(self, state: WriteState, fn: Callable[..., Awaitable[_R]], *args: object) -> _R:
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
        state = await self._open_state(inode)
        state.base_generation = generation
        try:
            async with state.lock:
                if appender is not None:
                    state.become(Streaming(appender))
                else:
                    await self._stage(state, keep=0)  # regional buckets: uploaded on fsync and close
        except BaseException:
            async with self._closing(state):
                pass  # no file was made: its state must not pass for one being written
            raise
        self.namespace.inodes.lookup(inode.ino)
        return inode

    async def opened(self, inode: Inode, truncate: bool) -> None:
        state = await self._open_state(inode)
        state.handles += 1
        if truncate and state.size:
            async with state.lock:
                await self._truncate_open_file(state, 0)

    # -- writing ----------------------------------------------------------------------------------

    def write_now(self, inode: Inode, offset: int, data: bytes | memoryview | Arriving,
                  append_only: bool) -> int | None:
        """An append to a streaming file that needs no wait (nothing holds the
        file, the appender queues it at once), done now; None when it needs
        one: then ``write``, which tries this first."""
        state = self.pending(inode.ino)
        if state is None or state.lock.locked() or state.failure is not None or state.closing:
            return None
        current = state.current
        if (not isinstance(current, Streaming) or (offset != state.size and not append_only)
                or not current.appender.append_now(data)):
            return None
        state.size = inode.size = state.size + len(data)
        return self._wrote(state, inode, len(data))

    async def write(self, inode: Inode, offset: int, data: bytes | memoryview | Arriving,
                    append_only: bool) -> int:
        written = self.write_now(inode, offset, data, append_only)
        if written is not None:
            return written
        state = self.pending(inode.ino)
        if state is None:
            raise FSError(errno.EBADF)
        async with state.lock:  # never change the file under an upload or a restage
            state.check()
            if isinstance(state.current, Clean):
                offset = await self._choose_mode(state, offset, append_only)
            elif append_only:
                offset = state.size
            if isinstance(state.current, Streaming) and offset != state.size:
                await self._stage(state, keep=state.size)  # not an append: stage the whole object
            current = state.current
            if isinstance(current, Streaming):
                # The size first: a WRITE whose bytes a worker reads from a pipe
                # is answered by it, maybe before the append returns, and a stat
                # right after must see them.
                before = state.size
                state.size = inode.size = before + len(data)
                try:
                    # bytes, or a view of the arena the request loop gave up: kept as they are
                    await self._appender_call(state, current.appender.append,
                                              bytes(data) if isinstance(data, bytearray) else data)
                except BaseException:
                    state.size = inode.size = before  # the file failed (a failure sticks): not written
                    raise
            else:
                assert isinstance(current, (Staged, Unlinked))  # not streaming: staged (a failure raised above)
                with self._staging(inode, state):
                    data = landed(data)  # a WRITE's bytes still in a pipe: read here
                    await current.copy.write(data, offset)
                state.size = max(state.size, offset + len(data))
                if isinstance(current, Staged) and not current.dirty:
                    state.become(Staged(current.copy, dirty=True))
        return self._wrote(state, inode, len(data))

    def _wrote(self, state: WriteState, inode: Inode, written: int) -> int:
        self.stats.bytes_written += written
        inode.size = state.size
        inode.mtime_ns = time.time_ns()
        state.metadata.mtime_ns = None  # a write is newer than any time set before it
        return written

    async def _choose_mode(self, state: WriteState, offset: int, append_only: bool) -> int:
        """The first write decides: append to the object in place, or stage it
        (the caller holds ``state.lock``).

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
                        state.become(Streaming(appender))
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
        await self._stage(state, keep=state.size)
        return state.size if append_only else offset

    async def _stage(self, state: WriteState, *, keep: int) -> None:
        """Make a local copy the file, holding its first ``keep`` bytes (the
        caller holds ``state.lock``)."""
        current = state.current
        if state.copy is not None:
            # Already staged: the copy is the file; the bucket is not read
            # again, and what the copy was made from (base_*) stays the same.
            with self._staging(state.inode, state):
                await state.copy.truncate(keep)
            state.size = keep
            if isinstance(current, Staged) and not current.dirty:
                state.become(Staged(current.copy, dirty=True))
            return
        if isinstance(current, Failed):
            state.size = keep  # nothing of a failed file is uploaded: no copy to make
            return
        if isinstance(current, Streaming):
            # Appended bytes become part of the object first; then stage it all.
            await self._appender_call(state, current.appender.close)
            # Every byte is in the object now: if the copy fails, nothing is pending.
            state.become(Clean())
            state.base_generation = state.inode.generation
        inode = state.inode
        copy = await self._copy_of(inode, keep)
        state.become(Staged(copy, dirty=True))
        # Appends keep the generation, so the precondition alone would not
        # notice another client appending to an unfinalized object meanwhile.
        state.base_size = inode.size if inode.generation and not inode.finalized else None
        state.size = keep

    async def _copy_of(self, inode: Inode, keep: int) -> StagedFile:
        """A staged file holding the object's first ``keep`` bytes.

        A full ``--temp-dir`` fails it with ENOSPC before anything is read
        (the room for the copy is reserved first) and leaves nothing behind.
        """
        with self._staging(inode):
            copy = await StagedFile.create(self.temp_dir, self._disk)
        copied = 0
        try:
            if keep and inode.generation:
                if min(keep, inode.size):
                    with self._staging(inode):
                        await copy.reserve(0, min(keep, inode.size))
                reader = self.store.open_reader(inode.path, inode.generation)
                try:
                    while copied < keep:
                        chunk = await storage_call(reader.read, copied, min(COPY_CHUNK, keep - copied))
                        if not chunk:
                            break
                        with self._staging(inode):
                            await copy.write(chunk, copied)
                        copied += len(chunk)
                finally:
                    await reader.close()
            if copied < keep:
                with self._staging(inode):
                    await copy.truncate(keep)
        except BaseException:
            await copy.close()  # an incomplete copy must never be uploaded
            raise
        return copy

    async def read_own(self, inode: Inode, reader: ObjectReader, offset: int, size: int
                       ) -> bytes | memoryview | None:
        """Read through a file whose pending writes hold bytes: they are the
        truth. None when it has none (the bucket's object is the file)."""
        state = self.pending(inode.ino)
        while state is not None:
            current, copy = state.current, state.copy
            if copy is None and isinstance(current, Failed) and current.appender is not None:
                raise current.error  # a failed stream sticks to reads too
            if copy is None and not isinstance(current, Streaming):
                return None
            end = min(offset + size, state.size)
            if offset >= end:
                return b""
            if copy is not None:
                with self._staging(inode):
                    return await copy.read(end - offset, offset)
            # Streaming: make the bucket hold every byte, then read it back.
            assert isinstance(current, Streaming)  # neither staged nor clean: both returned above
            async with state.lock:
                if state.current is not current:
                    continue  # it changed while this waited for the lock: look again
                await self._appender_call(state, current.appender.flush)
            end = min(offset + size, state.size)
            return await storage_call(reader.read, offset, end - offset)
        return None

    # -- durability ---------------------------------------------------------------------------------

    async def persist(self, state: WriteState, *, closing: bool = False) -> None:
        """fsync(2), and close(2) when ``closing``: every change made so far,
        a truncation alone included, is in the bucket when this returns."""
        async with state.lock:
            await self._persist(state, closing=closing)

    async def _persist(self, state: WriteState, *, closing: bool = False) -> None:
        """``persist``; the caller holds ``state.lock``."""
        current = state.current
        if isinstance(current, Failed):
            raise current.error
        if isinstance(current, Streaming):
            await self._appender_call(state, current.appender.flush)
            self.stats.writers_flushed += 1
            self.namespace.changed(state.inode.path)
        elif isinstance(current, Staged) and current.dirty:
            await self._upload_staged(state, current, keep_stream=closing)
        # Unlinked: nothing of it is kept. Clean: nothing changed.

    async def _upload_staged(self, state: WriteState, staged: Staged, *, keep_stream: bool = False) -> None:
        """Staged → Uploading → Staged (clean; still dirty after a transient
        failure) or Failed (ESTALE). The caller holds ``state.lock``.

        ``keep_stream``: a close that uploads an empty file keeps the upload's
        stream, and the file goes on Streaming into that generation: a write
        through another descriptor of the same open file may follow (see the
        module's docstring); the release closes the stream otherwise."""
        state.become(Uploading(staged.copy))
        try:
            kept = await self._upload(state, staged.copy, keep_stream=keep_stream)
        except BaseException as err:
            if isinstance(err, FSError) and err.errno == errno.ESTALE:
                raise state.fail(err) from None  # someone else changed the object: never overwrite it
            state.become(staged)  # still dirty: the next fsync or close tries again
            raise
        if kept is None:
            state.become(Staged(staged.copy, dirty=False))
        else:
            state.become(Streaming(kept))
            await staged.copy.close()

    async def _upload(self, state: WriteState, copy: StagedFile, *, keep_stream: bool) -> ObjectAppender | None:
        """Upload the staged file as a new generation; returns the stream
        that wrote it when it is kept (see :meth:`_upload_staged`)."""
        inode = state.inode
        size = state.size
        try:
            meta, kept = await self._upload_copy(state, copy, size, keep_stream=keep_stream and not size)
        except StorageError as err:
            raise fs_error(err) from None
        self.stats.writers_flushed += 1
        state.base_generation = meta.generation
        state.base_size = meta.size if not meta.finalized else None
        self.namespace.changed(inode.path)
        self.namespace.meta.put_object(meta)
        inode.generation, inode.finalized = meta.generation, meta.finalized
        inode.metageneration = meta.metageneration  # a new generation starts its own count
        inode.size = size
        return kept

    async def _upload_copy(self, state: WriteState, copy: StagedFile, size: int, *,
                           keep_stream: bool) -> tuple[ObjectMeta, ObjectAppender | None]:
        """The staged file as a new generation; with ``keep_stream`` (an
        appendable bucket, not finalizing), the stream that wrote it is left
        open and returned instead of being closed."""
        path = state.inode.path
        state.metadata.taken()
        if state.base_size is not None:
            current = await self.store.get_object(path)
            if current is None or current.generation != state.base_generation or current.size != state.base_size:
                raise StorageError(f"upload {path!r}: the object changed since it was staged",
                                   errno_=errno.ESTALE, object_name=path)
        if not self.layout.appendable_objects:
            return await self.store.write_object(path, copy.fd, size,
                                                 if_generation_match=state.base_generation,
                                                 metadata=self._metadata(state)), None
        appender = self.store.open_appender(path)
        kept = None
        try:
            await appender.create(if_generation_match=state.base_generation, metadata=self._metadata(state))
            await appender.append_file(copy.fd, size)  # read where the stream lives, not here
            if self.config.finalize_on_close:
                return await appender.finalize(), None
            if keep_stream:
                await appender.flush()
                kept = appender
            else:
                await appender.close()
        finally:
            if kept is None:
                await appender.abort()
        meta = await self.store.get_object(path)
        if meta is None:
            raise StorageError(f"upload {path!r}: the object vanished", errno_=errno.ESTALE, object_name=path)
        return meta, kept

    # -- closing ----------------------------------------------------------------------------------

    async def closed(self, inode: Inode) -> Closed | None:
        """A writing handle was released; the last one ends the write: then
        how it ended (``failure``: its last upload was refused)."""
        state = self.pending(inode.ino)
        if state is None or state.closing:
            return None
        state.handles -= 1
        if state.handles > 0:
            return None
        async with self._closing(state):
            await self._finish(state)
            self._forget(state)
        closed = state.phase
        assert isinstance(closed, Closed)  # _closing always ends in Closed
        return closed

    @contextlib.asynccontextmanager
    async def _closing(self, state: WriteState) -> AsyncIterator[None]:
        """The state's last act: ``Closing`` at once, the body under its lock;
        then, even if the body failed or was cancelled, it is ``Closed`` and
        gone (in one step: a utime accepted for the final store cannot come
        after it), whoever waited for it goes on, and its appender and staged
        file are released."""
        closing = Closing(state.current)  # the phase itself: it is not closing yet
        state.become(closing)
        try:
            async with state.lock:
                yield
        finally:
            appender, copy = state.appender, state.copy
            state.become(Closed(state.failure))
            del self._states[state.inode.ino]
            closing.done.set()
            with trio.CancelScope(shield=True):
                if appender is not None:
                    await appender.abort()
                if copy is not None:
                    await copy.close()

    async def _finish(self, state: WriteState) -> None:
        """The last release's work (under ``state.lock``): finalize or close
        the stream, or upload a staged file still dirty, then store a time or
        mode set meanwhile. Failures are only logged: close() has returned."""
        inode = state.inode
        try:
            current = state.current
            if isinstance(current, Failed):
                await self._size_from_bucket(inode)
                return
            if isinstance(current, Unlinked):
                return
            if isinstance(current, Streaming):
                if self.config.finalize_on_close:
                    meta = await current.appender.finalize()
                    inode.finalized = True
                    inode.generation, inode.metageneration = meta.generation, meta.metageneration
                else:
                    await current.appender.close()
                self.stats.writers_flushed += 1
            elif isinstance(current, Staged) and current.dirty:
                await self._upload_staged(state, current)
            # A utime or chmod may arrive while this runs (close() has returned): loop.
            while state.metadata.unstored:
                state.metadata.taken()
                await self._store_metadata(state)
        except StorageError as err:
            log_failure(err, f"closing {inode.path!r}: ")
        except FSError:
            pass  # logged where it was raised

    async def _size_from_bucket(self, inode: Inode) -> None:
        """After a failed write: the size its generation has in the bucket.
        Bytes this mount counted but the bucket never took are not the
        file's, and a read must not ask for them."""
        if not inode.generation:
            return  # never stored: nothing of it is the file's
        meta = await self.store.get_object(inode.path, inode.generation)
        if meta is not None and meta.generation == inode.generation:
            inode.size, inode.finalized = meta.size, meta.finalized

    async def _store_metadata(self, state: WriteState) -> None:
        """A time or mode set on the open file, stored after the bytes on the
        generation this mount just wrote."""
        inode = state.inode
        meta = await self.store.get_object(inode.path)
        if meta is None or meta.generation != inode.generation:
            return  # replaced meanwhile: the time was for bytes that are gone
        meta = await self.store.update_metadata(inode.path, meta.generation, self._metadata(state) or {},
                                                if_metageneration_match=meta.metageneration)
        self.namespace.meta.put_object(meta)
        inode.metageneration = meta.metageneration  # a later utime or chmod is conditional on it
        inode.mtime_ns = meta.mtime_ns

    def _forget(self, state: WriteState) -> None:
        """After the last release: the bucket's size and time from now on,
        this mount's own when the bucket holds its bytes."""
        inode = state.inode
        self.namespace.changed(inode.path)
        current = state.current
        if isinstance(current, (Clean, Streaming)) or (isinstance(current, Staged) and not current.dirty):
            inode.size = state.size
            if state.metadata.mtime_ns is not None:
                inode.mtime_ns = state.metadata.mtime_ns
        self.namespace.kernel.forget_attributes(inode.ino)

    # -- truncation -------------------------------------------------------------------------------

    async def truncate(self, inode: Inode, size: int) -> None:
        """truncate(2) or ftruncate(2): a file open for writing keeps the
        change until a close or fsync uploads it; a truncate(2) of a file no
        handle writes is uploaded before it returns."""
        while (state := await self.settle(inode.ino)) is not None:
            async with state.lock:
                if state.closing:
                    continue  # its last handle was released meanwhile: wait for that
                state.check()
                if size != state.size:
                    await self._truncate_open_file(state, size)
                return
        if size == inode.size:
            return
        # No handle writes the file: stage, upload now, and end the state
        # whatever happens (Closing, as a last release), so a refusal leaves
        # nothing pending behind and an open meanwhile waits for it.
        state = self._states[inode.ino] = WriteState(inode, size=inode.size, base_generation=inode.generation)
        old_size = inode.size
        try:
            async with self._closing(state):
                await self._stage(state, keep=min(size, state.size))
                assert isinstance(state.current, Staged) and state.copy is not None  # staged just now
                with self._staging(inode, state):
                    await state.copy.truncate(size)
                state.size = inode.size = size
                await self._upload_staged(state, state.current)
        except BaseException:
            inode.size = old_size
            raise

    async def _truncate_open_file(self, state: WriteState, size: int) -> None:
        """Stage the file at ``size`` (the caller holds ``state.lock``); the
        next close or fsync of a writing handle uploads it."""
        await self._stage(state, keep=min(size, state.size))
        if state.copy is not None:
            with self._staging(state.inode, state):
                await state.copy.truncate(size)
        state.size = state.inode.size = size

    # -- names changing under files with write state -------------------------------------------------

    @contextlib.asynccontextmanager
    async def moving(self, inodes: Iterable[Inode | None]) -> AsyncIterator[Follow]:
        """Around a rename that moves these files' objects. A released file's
        last upload, then every pending write, go first, so the moved objects
        hold every byte; writes that come meanwhile wait until the move is
        over, or they would go to the object under its old name and be lost
        with the stream. Inside, ``follow(inode, moved)`` has an open file
        go on under its new name (later writes, fsyncs and close go there).
        The files' locks are taken in the order of their inode numbers."""
        held: dict[int, WriteState] = {}
        async with contextlib.AsyncExitStack() as locks:
            for inode in sorted({i.ino: i for i in inodes if i is not None}.values(), key=lambda i: i.ino):
                state = await self.settle(inode.ino)
                if state is None:
                    continue
                await locks.enter_async_context(state.lock)
                await self._persist(state)
                held[inode.ino] = state

            async def follow(inode: Inode, moved: ObjectMeta) -> None:
                state = held.get(inode.ino)
                if state is None or isinstance(state.phase, Closed):
                    return  # (a last release waiting for the lock follows too: it closes nothing then)
                inode.generation, inode.finalized = moved.generation, moved.finalized
                state.base_generation = moved.generation
                state.base_size = moved.size if not moved.finalized else None
                current = state.current
                if isinstance(current, Streaming):
                    # Everything is persisted; the stream still names the old object.
                    # The next write takes the moved object over under its new name.
                    await current.appender.abort()
                    state.become(Clean())
                    inode.size = state.size = moved.size

            yield follow

    @contextlib.asynccontextmanager
    async def unlinking(self, inode: Inode | None) -> AsyncIterator[None]:
        """Around an operation that removes the name of ``inode`` (unlink, or a
        rename onto it). A released file's last upload goes first. An open
        file loses its name as in POSIX: its descriptors go on working on a
        local copy (reads see every byte, writes are accepted), and once the
        operation succeeded nothing is uploaded any more. Its writes wait
        until the operation is over."""
        state = await self.settle(inode.ino) if inode is not None else None
        if state is None:
            yield
            return
        async with state.lock:
            current = state.current
            if isinstance(current, (Clean, Streaming)):
                if isinstance(current, Streaming):
                    await self._appender_call(state, current.appender.flush)
                await self._stage(state, keep=state.size)
                assert state.copy is not None  # staged just now
                state.become(Staged(state.copy, dirty=False))  # the copy is what the bucket holds
            yield
            current = state.current
            if isinstance(current, Staged):
                state.become(Unlinked(current.copy))
