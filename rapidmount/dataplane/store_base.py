"""The base of :class:`~rapidmount.dataplane.store.WorkerStore`: its unary calls.

:class:`WorkerStoreBase` makes each metadata call and each change of the
filesystem core one call to some worker, which makes the gRPC call. A change
is made again on another worker if its worker dies before it answers; when
the first attempt had reached the bucket, the next one is refused, and the
change recognises its first attempt's effect in that refusal
(:func:`made_during`, :func:`own_new_object`). An upload of a staged file
passes the worker its descriptor (``socket.send_fds``): the worker reads the
file, this process does not.

It also holds what the store's readers and appenders share: the pool, the
arena, the bucket's layout, and the counters the workers' notices feed.
"""

from __future__ import annotations

import errno
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import trio

from rapidmount.dataplane.pool import WorkerPool
from rapidmount.dataplane.streams import StreamPolicy
from rapidmount.shared.checksums import file_crc32c
from rapidmount.shared.messages import Message
from rapidmount.storage.counters import PageStoreCounts, RpcErrorCounts, StreamEvents
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout, DirectoryMeta, FolderMeta, ListPage, ObjectMeta
from rapidmount.storage.seam import LIST_PAGE_SIZE, UploadSource

#: How far the service's clock may be from ours when a change made again
#: after a worker's death looks for the effect of its first attempt.
CLOCK_SKEW_NS = 2_000_000_000


def made_during(meta: ObjectMeta, started_ns: int) -> bool:
    """``meta``'s generation was created while a call that began at ``started_ns`` ran."""
    return started_ns - CLOCK_SKEW_NS <= meta.ctime_ns <= time.time_ns() + CLOCK_SKEW_NS


def own_new_object(meta: ObjectMeta | None, replaced: int | None, started_ns: int) -> bool:
    """Whether ``meta`` is the object a create (``if_generation_match=replaced``)
    whose worker died made: a new generation, still empty and appendable,
    created while the create ran. Anything else is another writer's."""
    return (meta is not None and meta.generation != replaced and not meta.finalized and meta.size == 0
            and made_during(meta, started_ns))


class WorkerStoreBase:
    """One bucket's unary calls, served by the data-plane workers, and the
    state a :class:`~rapidmount.dataplane.store.WorkerStore`'s readers and appenders share."""

    def __init__(self, pool: WorkerPool, layout: BucketLayout, *, read_streams: int = 1) -> None:
        self.pool = pool
        #: Bytes of one file not yet confirmed by the bucket, at most (plus one write).
        self.write_buffer = pool.settings.write_buffer
        self.arena = pool.arena
        self.bucket = pool.settings.bucket
        self.layout = layout
        self.read_policy = StreamPolicy(read_streams)
        self.stream_events = StreamEvents()
        self.rpc_errors = RpcErrorCounts()
        self._turns = itertools.count()
        self._stream_ids = itertools.count(1)
        self.stores_pages = pool.settings.page_store_buffer > 0
        self.page_stores = PageStoreCounts()
        pool.add_notice_handler(self._notice)

    def _notice(self, kind: str, value: Any) -> None:
        if kind == "event":
            direction, event = value
            (self.stream_events.on_read if direction == "read" else self.stream_events.on_write)(event)
        elif kind == "rpc_error":
            self.rpc_errors.add(*value)
        elif kind == "page_stores":
            for outcome, count, size, seconds in value:
                self.page_stores.add(outcome, size, seconds, count)

    async def _client(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.pool.call("client", method, args, kwargs)

    async def _change(self, op: str, args: Message, done: Callable[[StorageError, int], Awaitable[object]], *,
                      passing: int | None = None) -> Any:
        """A change, made on some worker and made again on another if that
        worker dies before it answers. The first attempt may have reached the
        bucket: a refusal of a later attempt goes to ``done(err, started_ns)``,
        which returns the change's result if the refusal is that first
        attempt's own effect, and raises ``err`` otherwise. ``passing``: a
        descriptor each attempt hands to its worker."""
        started_ns = time.time_ns()
        return await self.pool.call(op, *args, after_loss=lambda err: done(err, started_ns), passing=passing)

    # -- metadata ---------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        return cast(ObjectMeta | None, await self._client("get_object", name, generation))

    async def stat_name(self, name: str) -> tuple[ObjectMeta | None, DirectoryMeta | None]:
        return cast(tuple[ObjectMeta | None, DirectoryMeta | None],
                    await self._client("stat_name", name, hns=self.layout.folders))

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        return cast(ListPage, await self._client(
            "list_page", prefix, delimiter=delimiter, page_token=page_token, page_size=page_size,
            folders_as_prefixes=self._folders_as_prefixes(delimiter), start=start, end=end,
            include_trailing_delimiter=include_trailing_delimiter))

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "") -> tuple[list[FolderMeta], str]:
        return cast(tuple[list[FolderMeta], str], await self._client(
            "list_folders_page", prefix, page_token=page_token, page_size=page_size, start=start, end=end))

    async def list_child_folders(self, prefix: str) -> list[FolderMeta]:
        return cast(list[FolderMeta], await self._client("list_child_folders", prefix))

    async def list_directory(self, prefix: str, *, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        return cast(tuple[list[ObjectMeta], list[str], bool], await self._client(
            "list_directory", prefix, folders_as_prefixes=self._folders_as_prefixes(delimiter), delimiter=delimiter,
            limit=limit))

    def _folders_as_prefixes(self, delimiter: str) -> bool:
        # The service only applies it to "/"-delimited listings.
        return self.layout.folders and delimiter == "/"

    # -- changes ----------------------------------------------------------------------------------

    # Each change is made again on another worker if its worker dies first.
    # When the first attempt had reached the bucket, the next one is refused
    # by the very preconditions that keep other writers' objects safe; each
    # change recognises its own first attempt's effect in that refusal, and
    # nothing else (see docs/reliability.md).

    async def write_object(self, name: str, source: UploadSource, size: int, *, if_generation_match: int | None,
                           metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        async def done(err: StorageError, started_ns: int) -> ObjectMeta:
            # Refused: is the live generation the upload's own (its bytes, made meanwhile)?
            meta = await self.get_object(name) if err.errno == errno.ESTALE else None
            if (meta is None or meta.generation == if_generation_match or meta.size != size
                    or not made_during(meta, started_ns)
                    or meta.crc32c != await trio.to_thread.run_sync(_crc32c_of, source, size)):
                raise err
            return meta

        # The worker reads the staged file itself, through the descriptor the call passes.
        return cast(ObjectMeta, await self._change(
            "write_object", (name, size, {"if_generation_match": if_generation_match, "metadata": metadata}), done,
            passing=source))

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.ENOENT:  # gone: deleted by the first attempt, or at least gone
                raise err

        await self._change("client", ("delete_object", (name,), {"if_generation_match": if_generation_match}), done)

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        async def done(err: StorageError, started_ns: int) -> ObjectMeta:
            # The source is gone: moved by the first attempt if the destination
            # is a generation made meanwhile with the source's bytes.
            moved = await self.get_object(destination) if err.errno == errno.ENOENT else None
            if moved is None or moved.generation == if_generation_match or not made_during(moved, started_ns):
                raise err
            return moved

        return cast(ObjectMeta, await self._change("client", ("move_object", (source, destination), {
            "if_source_generation_match": if_source_generation_match,
            "if_generation_match": if_generation_match}), done))

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        async def done(err: StorageError, started_ns: int) -> ObjectMeta:
            # The metageneration moved on: by the first attempt if it moved by
            # one and the object carries exactly what that attempt set.
            meta = await self.get_object(name, generation) if err.errno == errno.ESTALE else None
            if (meta is None or if_metageneration_match is None
                    or meta.metageneration != if_metageneration_match + 1
                    or any(meta.metadata.get(key) != value for key, value in metadata.items())):
                raise err
            return meta

        return cast(ObjectMeta, await self._change("client", ("update_metadata", (name, generation, metadata), {
            "if_metageneration_match": if_metageneration_match}), done))

    async def create_folder(self, prefix: str) -> FolderMeta | None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.EEXIST:
                raise err

        return cast(FolderMeta | None, await self._change("client", ("create_folder", (prefix,), {}), done))

    async def delete_folder(self, prefix: str) -> None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.ENOENT:
                raise err

        await self._change("client", ("delete_folder", (prefix,), {}), done)

    async def rename_folder(self, source: str, destination: str) -> FolderMeta | None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.ENOENT or (await self.stat_name(destination.rstrip("/")))[1] is None:
                raise err

        return cast(FolderMeta | None, await self._change("client", ("rename_folder", (source, destination), {}), done))


def _crc32c_of(fd: int | None, size: int) -> int | None:
    """CRC32C of the first ``size`` bytes of a staged file (in a thread: disk I/O)."""
    return 0 if fd is None else file_crc32c(fd, size)  # an empty upload has no staged file
