"""The storage seam over the data-plane workers: :class:`WorkerStore`.

Every call of the filesystem core becomes one message to a worker process,
which makes the gRPC call. Only small control messages cross the socket:
read bytes land in the shared-memory arena, appended bytes stay where they
were written until the bucket confirmed them, and a staged file's
descriptor goes to the worker that uploads it. The store is made of one
module per concern:

* :mod:`~rapidmount.dataplane.store_base`: the unary calls (metadata, and
  changes made again after a worker's death), and the state the rest shares;
* :mod:`~rapidmount.dataplane.reading`: the readers and their streams;
* :mod:`~rapidmount.dataplane.appending` (pieces in
  :mod:`~rapidmount.dataplane.append_pieces`): the appenders;
* :mod:`~rapidmount.dataplane.read_replies`: READ replies the workers write.

This module puts them together, with the batch reads and the page-cache stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from rapidmount.dataplane.appending import _Appender
from rapidmount.dataplane.read_replies import ReadReplies
from rapidmount.dataplane.reading import _Reader
from rapidmount.dataplane.store_base import WorkerStoreBase
from rapidmount.storage.errors import StorageError

__all__ = ["WorkerStore"]


class WorkerStore(WorkerStoreBase, ReadReplies):
    """One bucket, served by the data-plane workers (implements ``ObjectStore``)."""

    async def drain_page_stores(self, ino: int, epoch: int) -> None:
        if self.stores_pages:
            await self.pool.on_every_worker("drain_stores", ino, epoch)  # the worker takes it as the node id

    def skip_page_store(self, ticket: int) -> None:
        self.pool.broadcast_soon("skip_store", ticket)

    def open_reader(self, name: str, generation: int) -> _Reader:
        return _Reader(self, name, generation)

    def open_appender(self, name: str) -> _Appender:
        return _Appender(self, name)

    async def read_objects_whole(self, items: list[tuple[str, int, int]], *,
                                 concurrency: int) -> list[bytes | memoryview | StorageError]:
        return await self._batch("whole", items, [length for _, _, length in items], concurrency)

    async def read_objects_composed(self, items: list[tuple[str, int, int, int | None]], *, concurrency: int,
                                    temporary_name: Callable[[], str]
                                    ) -> list[bytes | memoryview | StorageError]:
        if not self.layout.compose:
            return await self.read_objects_whole([item[:3] for item in items], concurrency=concurrency)
        names = [temporary_name() for _ in items]
        return await self._batch("composed", items, [size for _, _, size, _ in items], concurrency, names)

    async def _batch(self, op: str, items: list[Any], lengths: list[int], concurrency: int, *args: Any
                     ) -> list[bytes | memoryview | StorageError]:
        """A batch read: each item's bytes land in an arena region of its own,
        allocated here as a read's (bytes in the answer when the arena is full)."""
        regions = [self.arena.allocate(length) if length > 0 else None for length in lengths]
        targets = [None if region is None else region[0] for region in regions]
        answers = await self.pool.call(op, items, concurrency, *args, targets, keep=regions)
        # An answer is an int (the length landed) only for an item with a region.
        return [cast(tuple[int, memoryview], region)[1][:answer] if isinstance(answer, int) else answer
                for answer, region in zip(answers, regions)]
