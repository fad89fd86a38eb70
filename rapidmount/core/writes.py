"""The write path: the write state of every file with pending writes, and
the entry points that change it (create, open, write, fsync, close,
truncate, and the renames and unlinks of files being written).

Each file's state (``core/write_state.py``) is one record, changed only by
events its table allows. Streaming appends go to the object over one stream
(zonal buckets). A staged file is a whole local copy under ``--temp-dir``,
made and uploaded as a new generation, with a generation precondition, on
fsync and close (``core/staging.py``). Failed is sticky: every later write,
fsync and close returns its errno.

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
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import trio

from rapidmount.core.errors import FSError, log_failure, storage_call
from rapidmount.core.namespace import Namespace
from rapidmount.core.settings import CoreSettings
from rapidmount.core.staging import StagedUploads, appender_call
from rapidmount.core.stats import FSStats
from rapidmount.core.write_state import (Appended, AppendUndone, Clean, CloseEnded, Closed, CloseStarted, Closing,
                                         CopyWritten, Dirty, Failed, Moved, NameRemoved, Recreated, Resized, SizeSeen,
                                         Staged, StreamOpened, Streaming, Unlinked, WriteState)
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import ObjectMeta
from rapidmount.storage.seam import ObjectReader, ObjectStore
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.names import EntryKind
from rapidmount.shared.views import Arriving, landed

log = logging.getLogger("rapidmount.fs")
#: An open file goes on under the name its object was moved to (:meth:`WritePath.moving`).
Follow = Callable[[Inode, ObjectMeta], Awaitable[None]]


class WritePath(StagedUploads):
    """Every file with write state, by inode number: open for writing, or
    closing (its last release, or a truncate(2) of a file no handle writes)."""

    def __init__(self, settings: CoreSettings, store: ObjectStore, namespace: Namespace, stats: FSStats) -> None:
        super().__init__(settings, store, namespace, stats)
        self._states: dict[int, WriteState] = {}

    # -- which files have write state --------------------------------------------------------------

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

    # -- metadata set on open files ----------------------------------------------------------------

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

    # -- opening -----------------------------------------------------------------------------------

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
        if state.base_generation != generation:
            state.become(Recreated(generation))  # a state this inode still had (else it was made so)
        try:
            async with state.lock:
                if appender is not None:
                    state.become(StreamOpened(appender, state.size))
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

    # -- writing -----------------------------------------------------------------------------------

    def write_now(self, inode: Inode, offset: int, data: bytes | memoryview | Arriving,
                  append_only: bool) -> int | None:
        """An append to a streaming file that needs no wait (nothing holds the
        file, the appender queues it at once), done now; None when it needs
        one: then ``write``, which tries this first."""
        state = self.pending(inode.ino)
        if state is None or state.lock.locked() or state.failure is not None or state.closing:
            return None
        current = state.current
        if not isinstance(current, Streaming):
            return None
        appended = Appended(state.size if append_only else offset, len(data))
        if not state.allows(appended) or not current.appender.append_now(data):
            return None
        state.become(appended)
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
            appended = Appended(offset, len(data))
            if isinstance(state.current, Streaming) and not state.allows(appended):
                await self._stage(state, keep=state.size)  # not an append: stage the whole object
            current = state.current
            if isinstance(current, Streaming):
                # The size first: a WRITE whose bytes a worker reads from a pipe
                # is answered by it, maybe before the append returns, and a stat
                # right after must see them.
                state.become(appended)
                inode.size = state.size
                try:
                    # bytes, or a view of the arena the request loop gave up: kept as they are
                    await appender_call(state, current.appender.append,
                                        bytes(data) if isinstance(data, bytearray) else data)
                except BaseException:
                    state.become(AppendUndone(len(data)))  # the file failed (a failure sticks): not written
                    inode.size = state.size
                    raise
            else:
                assert isinstance(current, (Staged, Dirty, Unlinked))  # not streaming: staged (a failure raised)
                with self._staging(inode, state):
                    data = landed(data)  # a WRITE's bytes still in a pipe: read here
                    await current.copy.write(data, offset)
                state.become(CopyWritten(offset + len(data)))
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
                        state.become(StreamOpened(appender, size))
                        inode.size = size
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
            state.become(SizeSeen(inode.size))
            offset = state.size if append_only else offset
        await self._stage(state, keep=state.size)
        return state.size if append_only else offset

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
                await appender_call(state, current.appender.flush)
            end = min(offset + size, state.size)
            return await storage_call(reader.read, offset, end - offset)
        return None

    # -- durability --------------------------------------------------------------------------------

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
            await appender_call(state, current.appender.flush)
            self.stats.writers_flushed += 1
            self.namespace.changed(state.inode.path)
        elif isinstance(current, Dirty):
            await self._upload_staged(state, current, keep_stream=closing)
        # Unlinked: nothing of it is kept. Clean: nothing changed.

    # -- closing -----------------------------------------------------------------------------------

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
        state.become(CloseStarted())
        closing = state.phase
        assert isinstance(closing, Closing)
        try:
            async with state.lock:
                yield
        finally:
            appender, copy = state.appender, state.copy
            state.become(CloseEnded())
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
                if self.settings.finalize_on_close:
                    meta = await current.appender.finalize()
                    inode.finalized = True
                    inode.generation, inode.metageneration = meta.generation, meta.metageneration
                else:
                    await current.appender.close()
                self.stats.writers_flushed += 1
            elif isinstance(current, Dirty):
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
        if isinstance(current, (Clean, Streaming, Staged)):  # the bucket holds every byte
            inode.size = state.size
            if state.metadata.mtime_ns is not None:
                inode.mtime_ns = state.metadata.mtime_ns
        self.namespace.kernel.forget_attributes(inode.ino)

    # -- truncation --------------------------------------------------------------------------------

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
                assert state.copy is not None  # staged just now
                with self._staging(inode, state):
                    await state.copy.truncate(size)
                state.become(Resized(size))
                inode.size = size
                staged = state.current
                assert isinstance(staged, Dirty)  # staged and resized just now
                await self._upload_staged(state, staged)
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
        state.become(Resized(size))
        state.inode.size = size

    # -- names changing under files with write state -----------------------------------------------

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
                current = state.current
                if isinstance(current, Streaming):
                    # Everything is persisted; the stream still names the old object.
                    # The next write takes the moved object over under its new name.
                    await current.appender.abort()
                # A streaming file becomes Clean at the moved object's size.
                state.become(Moved(moved.generation, moved.size if not moved.finalized else None, moved.size))
                if isinstance(current, Streaming):
                    inode.size = state.size

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
                    await appender_call(state, current.appender.flush)
                await self._stage(state, keep=state.size, as_is=True)  # the copy is what the bucket holds
            yield
            if isinstance(state.current, (Staged, Dirty)):
                state.become(NameRemoved())
