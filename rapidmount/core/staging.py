"""Staged copies and their uploads: the part of the write path that makes a
local copy the file, and makes a copy the object's next generation.

A staged copy lives in ``--temp-dir`` (``core/staged.py``). It is made from
the object's bytes (``_copy_of``) when a write cannot stream: a random write,
a truncation, an unlink of an open file, or any write on buckets without
appendable objects. ``_upload_staged`` sends it whole as a new generation,
on the precondition that the object is still the one the copy was made from.
:class:`StagedUploads` is the base of :class:`rapidmount.core.writes.WritePath`,
which decides when each of these happens.
"""

from __future__ import annotations

import contextlib
import errno
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import trio

from rapidmount.core.errors import FSError, fs_error, local_error, storage_call
from rapidmount.core.namespace import Namespace
from rapidmount.core.settings import CoreSettings
from rapidmount.core.staged import STAGED_IO_THREADS, StagedFile
from rapidmount.core.stats import FSStats
from rapidmount.core.write_state import (Dirty, Failed, Resized, StagedAnew, StagedAsIs, StreamClosed, Streaming,
                                         UploadInterrupted, Uploaded, UploadedKeepingStream, UploadStarted,
                                         WriteState)
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import MODE_METADATA_KEY, MTIME_METADATA_KEY, ObjectMeta, format_mtime
from rapidmount.storage.seam import ObjectAppender, ObjectStore
from rapidmount.superblock.inodes import Inode

_R = TypeVar("_R")

COPY_CHUNK = 8 << 20  # bytes per read when copying an object into a staged file


async def appender_call(state: WriteState, fn: Callable[..., Awaitable[_R]], *args: object) -> _R:
    """A call on the file's appender; a failure sticks to the state (e.g. ESTALE)."""
    try:
        return await fn(*args)
    except StorageError as err:
        raise state.fail(fs_error(err)) from None


class StagedUploads:
    """Makes staged copies of files and uploads them. The methods that
    change a file's state expect the caller to hold its ``state.lock``."""

    def __init__(self, settings: CoreSettings, store: ObjectStore, namespace: Namespace, stats: FSStats) -> None:
        self.settings = settings
        self.store = store
        self.layout = store.layout
        self.namespace = namespace
        self.stats = stats
        self.temp_dir = settings.temp_dir or tempfile.gettempdir()
        self._disk = trio.CapacityLimiter(STAGED_IO_THREADS)  # the threads of staged-file I/O

    def _metadata(self, state: WriteState) -> dict[str, str] | None:
        """Custom metadata a new generation of the file carries: its time and mode."""
        metadata = {}
        if state.metadata.mtime_ns is not None:
            metadata[MTIME_METADATA_KEY] = format_mtime(state.metadata.mtime_ns)
        if state.inode.permissions is not None:
            metadata[MODE_METADATA_KEY] = f"{stat.S_IFREG | state.inode.permissions:o}"
        return metadata or None

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

    # -- making the copy ---------------------------------------------------------------------------

    async def _stage(self, state: WriteState, *, keep: int, as_is: bool = False) -> None:
        """Make a local copy the file, holding its first ``keep`` bytes.
        ``as_is``: ``keep`` is all the object holds, so the copy has nothing to upload."""
        current = state.current
        copy = state.copy
        if copy is not None:
            # Already staged: the copy is the file; the bucket is not read
            # again, and what the copy was made from (base_*) stays the same.
            with self._staging(state.inode, state):
                await copy.truncate(keep)
            state.become(Resized(keep))
            return
        if isinstance(current, Failed):
            state.become(Resized(keep))  # nothing of a failed file is uploaded: no copy to make
            return
        if isinstance(current, Streaming):
            # Appended bytes become part of the object first; then stage it all.
            await appender_call(state, current.appender.close)
            # Every byte is in the object now: if the copy fails, nothing is pending.
            state.become(StreamClosed(state.inode.generation))
        inode = state.inode
        copy = await self._copy_of(inode, keep)
        # Appends keep the generation, so the precondition alone would not
        # notice another client appending to an unfinalized object meanwhile.
        base_size = inode.size if inode.generation and not inode.finalized else None
        state.become(StagedAsIs(copy, keep, base_size) if as_is else StagedAnew(copy, keep, base_size))

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

    # -- uploading it ------------------------------------------------------------------------------

    async def _upload_staged(self, state: WriteState, dirty: Dirty, *, keep_stream: bool = False) -> None:
        """Dirty → Uploading → Staged (clean; Dirty again after a transient
        failure) or Failed (ESTALE).

        ``keep_stream``: a close that uploads an empty file keeps the upload's
        stream, and the file goes on Streaming into that generation: a write
        through another descriptor of the same open file may follow (see
        ``core/writes.py``); the release closes the stream otherwise."""
        state.become(UploadStarted())
        try:
            meta, kept = await self._upload(state, dirty.copy, keep_stream=keep_stream)
        except BaseException as err:
            if isinstance(err, FSError) and err.errno == errno.ESTALE:
                raise state.fail(err) from None  # someone else changed the object: never overwrite it
            state.become(UploadInterrupted())  # still dirty: the next fsync or close tries again
            raise
        base_size = meta.size if not meta.finalized else None
        if kept is None:
            state.become(Uploaded(meta.generation, base_size))
        else:
            state.become(UploadedKeepingStream(meta.generation, base_size, kept))
            await dirty.copy.close()

    async def _upload(self, state: WriteState, copy: StagedFile, *,
                      keep_stream: bool) -> tuple[ObjectMeta, ObjectAppender | None]:
        """Upload the staged file as a new generation; returns it, and the
        stream that wrote it when it is kept (see :meth:`_upload_staged`)."""
        inode = state.inode
        size = state.size
        try:
            meta, kept = await self._upload_copy(state, copy, size, keep_stream=keep_stream and not size)
        except StorageError as err:
            raise fs_error(err) from None
        self.stats.writers_flushed += 1
        self.namespace.changed(inode.path)
        self.namespace.meta.put_object(meta)
        inode.generation, inode.finalized = meta.generation, meta.finalized
        inode.metageneration = meta.metageneration  # a new generation starts its own count
        inode.size = size
        return meta, kept

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
            if self.settings.finalize_on_close:
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
