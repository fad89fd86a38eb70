"""A worker's appendable objects: one stream per appender, and the bytes
appended to it.

``appender`` creates, takes over, flushes, finalizes, closes or aborts an
appender's stream. The ``append`` calls take the bytes from the arena (copied
there, or written there by the kernel), straight from the FUSE process's
memory (``process_vm_readv``: the ``bytes`` it got from the kernel, at the
addresses the call names), or from a staged file whose descriptor the call
passes. The FUSE process keeps the bytes until the bucket confirmed them; the
calls on one stream run in the order they were sent.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from rapidmount.shared.messages import Message
from rapidmount.shared.peer_memory import PeerBytes
from rapidmount.storage.errors import StorageError
from rapidmount.workers.client.writer import CHUNK_BYTES, AppendableWriter
from rapidmount.workers.descriptors import staged_bytes
from rapidmount.workers.write_fills import WriteFills

#: The calls on an appender besides ``append``.
APPENDER_CALLS = frozenset({"create", "takeover", "flush", "finalize", "close", "abort"})


class AppendCalls(WriteFills):
    """The ``append``, ``append_arena``, ``append_peer``, ``append_file`` and ``appender`` calls."""

    appenders: dict[int, AppendableWriter]
    #: Per stream, the last append waiting for fills: later calls on it wait for that one.
    _gates: dict[int, asyncio.Future[None]]

    async def _after_fills_in_order(self, appender_id: int, fills: int) -> asyncio.Future[None] | None:
        """Wait until ``fills`` WRITEs have their bytes in the arena, keeping
        the order of the calls on stream ``appender_id``: while this one
        waits, a later call on the stream (another append, a flush) waits
        for it. Returns the gate to open once the append is under way (None
        when nothing waited: the common case)."""
        before = self._gates.get(appender_id)
        if self.fills_done >= fills and before is None:
            return None
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gates[appender_id] = gate
        try:
            if before is not None:
                await before
            await self._after_fills(fills)
        except BaseException:
            self._open_gate(appender_id, gate)
            raise
        return gate

    def _open_gate(self, appender_id: int, gate: asyncio.Future[None]) -> None:
        if not gate.done():
            gate.set_result(None)
        if self._gates.get(appender_id) is gate:
            del self._gates[appender_id]

    async def _in_order(self, appender_id: int) -> None:
        """Wait for an earlier append on the stream that waits for its fills."""
        before = self._gates.get(appender_id)
        if before is not None:
            await before

    async def op_append(self, appender_id: int, arena_offset: int | None, data: Any) -> Message:
        await self._in_order(appender_id)
        writer = self.appenders[appender_id]
        if arena_offset is not None:
            # ``data`` is the length here. The writer keeps a view of the arena,
            # not a copy: the FUSE process keeps the region until the bucket
            # confirmed its bytes, and so does the writer, no longer.
            data = self.arena.view(arena_offset, data)
        await writer.append(data)
        return None, writer.generation, writer.persisted_size

    async def op_append_arena(self, appender_id: int, segments: list[tuple[int, int]], fills: int = 0) -> Message:
        """Append arena bytes at ``segments`` (offset, length), kept as views:
        the FUSE process keeps the regions until the bucket confirmed them.
        ``fills``: the WRITEs handed to this worker before the call, whose
        bytes (these among them) its fill thread reads into the arena first."""
        gate = await self._after_fills_in_order(appender_id, fills)
        try:
            writer = self.appenders[appender_id]
        finally:
            if gate is not None:
                # Later calls on this stream go on now: this append's first
                # bytes are taken before they run, as when nothing waited.
                self._open_gate(appender_id, gate)
        for offset, length in segments:
            await writer.append(self.arena.view(offset, length))
        return None, writer.generation, writer.persisted_size

    async def op_append_peer(self, appender_id: int, segments: list[tuple[int, int]]) -> Message:
        """Append bytes the FUSE process holds at ``segments`` (address, length):
        the writer reads them into each request it sends, and again after a
        reconnect; the FUSE process keeps them until the bucket confirmed them."""
        if self.peer_refusal is not None:
            raise StorageError(f"appended bytes cannot be read from the mount's process: {self.peer_refusal}",
                               errno_=errno.EIO)
        await self._in_order(appender_id)
        writer = self.appenders[appender_id]
        await writer.append(PeerBytes(self.parent, segments))
        return None, writer.generation, writer.persisted_size

    async def op_append_file(self, appender_id: int, offset: int, length: int, *, fd: int) -> Message:
        """Append bytes ``[offset, offset + length)`` of the staged file ``fd``
        (the call passed it), a message of the stream at a time; the writer
        keeps them until the bucket confirmed them, within --write-buffer."""
        await self._in_order(appender_id)
        writer = self.appenders[appender_id]
        read = staged_bytes(fd)
        end = offset + length
        while offset < end:
            chunk = read(offset, min(CHUNK_BYTES, end - offset))
            await writer.append(chunk)
            offset += len(chunk)
        return None, writer.generation, writer.persisted_size

    async def op_appender(self, appender_id: int, name: str, method: str, args: Message,
                          kwargs: dict[str, Any]) -> Message:
        if method not in APPENDER_CALLS:
            raise StorageError(f"unknown appender call {method!r}")
        await self._in_order(appender_id)
        writer = self.appenders.get(appender_id)
        if writer is None:
            self._check_open(appender_id)
            writer = AppendableWriter(self.client, name, retry=self.retry, buffer_limit=self.settings.write_buffer,
                                      stall_timeout=self.settings.stall_timeout, on_event=self._on_write_event)
            self.appenders[appender_id] = writer
        try:
            result = await getattr(writer, method)(*args, **kwargs)
        finally:
            if method in ("finalize", "close", "abort"):
                self.appenders.pop(appender_id, None)
        return result, writer.generation, writer.persisted_size
