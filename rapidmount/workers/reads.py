"""A worker's reads: ranges of object streams into the arena (and into the
kernel's page cache), and the replies to the FUSE process's READs that it
writes to ``/dev/fuse`` itself.

A stream's reader is opened at its first range, with the given generation,
read handle and routing token. ``read_blocks`` reads several ranges, where a
block stored whole into the kernel's page cache skips the arena, and
``copy_held`` copies one such block's bytes there while its store still
holds them. ``reply`` answers a READ from the arena, on the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from typing import Any, cast

from rapidmount.shared import fuse_replies
from rapidmount.shared.messages import IN_KERNEL_ONLY, REPLIED_FROM_HELD, Message
from rapidmount.workers.client.reader import BidiObjectReader, RangeObjectReader
from rapidmount.workers.state import WorkerState

log = logging.getLogger("rapidmount.worker")


class ReadCalls(WorkerState):
    """The ``read``, ``read_blocks``, ``copy_held``, ``reply`` and ``drain_stores`` calls."""

    readers: dict[int, BidiObjectReader | RangeObjectReader]

    def _reader(self, stream_id: int, spec: Message) -> Any:
        reader = self.readers.get(stream_id)
        if reader is None:
            self._check_open(stream_id)
            name, generation, bidi, read_handle, routing_token = spec
            stall_timeout, on_event = self.settings.stall_timeout, self._on_read_event
            reader = (BidiObjectReader(self.client, name, generation, read_handle=read_handle,
                                       routing_token=routing_token, retry=self.retry, stall_timeout=stall_timeout,
                                       on_event=on_event) if bidi else
                      RangeObjectReader(self.client, name, generation, retry=self.retry, stall_timeout=stall_timeout,
                                        on_event=on_event))
            self.readers[stream_id] = reader
        return reader

    @staticmethod
    def _state(reader: Any) -> Message:
        return (reader.generation, getattr(reader, "read_handle", None), getattr(reader, "routing_token", None))

    def _store(self, store: Message | None, offset: int, data: bytes | memoryview, length: int) -> None:
        """Store a range read at ``offset`` into the kernel's page cache, if asked."""
        if store is not None and len(data) == length:
            # The store runs on its own thread and may block on the pages of
            # the READ this answer serves until the FUSE process has answered
            # it; neither this loop nor that READ waits for the store.
            nodeid, epoch, start, end, ticket = store
            self.pages.submit(nodeid, epoch, start, memoryview(data)[start - offset:end - offset], ticket)

    def _land_block(self, store: Message | None, offset: int, data: bytes | memoryview, length: int,
                    arena_offset: int) -> int:
        """Put a block read at ``offset`` where it goes; the count in the arena,
        or :data:`IN_KERNEL_ONLY` when its store covers all of it and was
        queued: then its bytes go only to the kernel's page cache (the copy
        into the arena, and the arena's first touch, are the costliest part
        of a read here), and the store keeps them until they are stored, for
        a READ that comes meanwhile (``copy_held``)."""
        if store is not None and len(data) == length:
            nodeid, epoch, start, end, ticket = store
            if start == offset and end == offset + length and ticket:
                if self.pages.submit(nodeid, epoch, start, data, ticket, held=True):
                    return IN_KERNEL_ONLY
                return self.arena.write(arena_offset, data)  # refused (a READ waits for it, ...): as without
        count = self.arena.write(arena_offset, data)
        self._store(store, offset, data, length)
        return count

    async def op_read(self, stream_id: int, spec: Message, offset: int, length: int, arena_offset: int | None,
                      store: Message | None = None, reply: Message | None = None) -> tuple[object, Message, bool]:
        """A range, into its arena region (or in the answer without one). With
        ``reply`` (a READ's ``(unique, skip, length)``), part of the bytes are
        also that READ's reply, written here as soon as they are checked: its
        reader need not wait for the FUSE process."""
        reader = self._reader(stream_id, spec)
        data = await reader.read(offset, length)
        sent = reply is not None and self._reply_from(reply, memoryview(data))
        state = self._state(reader)
        payload = bytes(data) if arena_offset is None else self.arena.write(arena_offset, data)
        self._store(store, offset, data, length)
        return payload, state, sent

    async def op_read_blocks(self, stream_id: int, spec: Message, offset: int,
                             items: list[tuple[int, int, Message | None]]) -> tuple[list[int], Message]:
        """Consecutive ranges from ``offset``, each ``(length, arena_offset,
        store)``, read at once on one stream and answered together. Each
        range goes to its region (and its store) as it lands, so the bytes of
        the first do not wait in this process for the last."""
        reader = self._reader(stream_id, spec)

        async def land(start: int, length: int, arena_offset: int, store: Message | None) -> int:
            return self._land_block(store, start, await reader.read(start, length), length, arena_offset)

        ranges = []
        for length, arena_offset, store in items:
            ranges.append(land(offset, length, arena_offset, store))
            offset += length
        # Every range ends before the answer: none writes into the arena after it.
        landed = await asyncio.gather(*ranges, return_exceptions=True)
        failed = [count for count in landed if isinstance(count, BaseException)]
        if failed:
            raise failed[0]
        return cast(list[int], landed), self._state(reader)

    async def op_copy_held(self, ticket: int, length: int, arena_offset: int,
                           reply: Message | None = None) -> tuple[int, bool]:
        """The bytes of block ``ticket``, which went only to the kernel's page
        cache, for a READ that came before their store was made. With
        ``reply``, that READ is answered from them where they are held, and
        they stay there (:data:`REPLIED_FROM_HELD`): the store is made all
        the same, and the READs of the block's other pages come here too until
        then, so copying the block into the arena would only add a copy.
        Without one (or when the kernel refused the reply) they are copied
        into the arena. The count and whether the kernel took the reply; -1
        once the store is done (or dropped): read them again."""
        data = self.pages.held(ticket)
        if data is None or len(data) < length:
            return IN_KERNEL_ONLY, False
        held = memoryview(data)[:length]
        if reply is not None and self._reply_from(reply, held):
            return REPLIED_FROM_HELD, True
        return self.arena.write(arena_offset, held), False

    def reply(self, unique: int, ranges: list[tuple[int, int]]) -> bool:
        """Answer the FUSE process's READ ``unique`` with the arena bytes of
        ``ranges`` (offset, length) in order, on this loop, never behind a
        store: a store may wait on that READ's pages. True once the kernel took
        the reply; False when it refused it (the READ was interrupted) or this
        worker has no ``/dev/fuse`` yet: the FUSE process answers then."""
        return self._write_reply(unique, [self.arena.view(at, size) for at, size in ranges])

    def _reply_from(self, reply: Message, data: memoryview) -> bool:
        """Answer READ ``reply`` = ``(unique, skip, length)`` with ``data[skip:skip +
        length]`` (to the end if ``length`` is None), if ``data`` holds all of it."""
        unique, skip, length = reply
        end = len(data) if length is None else skip + length
        return end <= len(data) and self._write_reply(unique, [data[skip:end]])

    def _write_reply(self, unique: int, buffers: list[Any]) -> bool:
        """Write READ ``unique``'s reply of ``buffers``; True once the kernel took it."""
        device = self.pages.device
        if device is None:
            return False
        length = sum(len(buffer) for buffer in buffers)
        try:
            os.writev(device, [fuse_replies.reply_header(unique, length), *buffers])
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.info("could not answer a READ of %d bytes: %s", length, err.strerror)
            return False
        return True

    async def op_drain_stores(self, nodeid: int, epoch: int) -> None:
        await asyncio.to_thread(self.pages.drain, nodeid, epoch)
