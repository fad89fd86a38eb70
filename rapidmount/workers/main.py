"""A data-plane worker: one process that owns gRPC channels, streams and calls.

Started by the FUSE process (``python -m rapidmount.workers.main``) with
one end of a socket pair, one end of its descriptor socket and the
shared-memory arena as inherited file descriptors. It runs its own asyncio
loop (grpc.aio) and so its own GIL: receiving, decoding and checking CRC32C
of the bytes happens here, and the bytes go straight into the arena.

What it serves (``op`` of a call; see :mod:`rapidmount.shared.messages`):

* ``client``: a unary Storage v2 call of :class:`StorageClient`;
* ``write_object``: a whole upload, read from the FUSE process's staged file,
  whose descriptor the call passes;
* ``whole`` and ``composed``: scan-ahead's batches of small objects, each
  written into its arena region;
* ``reply``: the reply to one of the FUSE process's READs, from the arena,
  written to the mount's ``/dev/fuse`` (answered at once, on the loop);
* ``read``: a range of one stream, into the arena (a stream is opened at its
  first range, with the given generation, read handle and routing token);
  ``read_blocks`` several, where a block stored whole into the kernel's page
  cache skips the arena, and ``copy_held`` copies one such block's bytes
  there while its store still holds them;
* ``append``, ``append_arena``, ``append_peer``, ``append_file`` and
  ``appender``: an appendable object's stream; appended bytes are read from
  the arena (copied there, or written there by the kernel), or
  straight from the FUSE process's memory (``process_vm_readv``: the
  ``bytes`` it got from the kernel, at the addresses the call names), both
  of which the FUSE process keeps until the bucket confirmed them, or from
  a staged file whose descriptor the call passes. Whether this worker can
  read the FUSE process's memory is probed at its start and told in the
  ``peer_reads`` notice, before ``ready``.

The worker exits when its socket closes: the FUSE process unmounts, or dies
(the kernel closes its end of the socket even after SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import errno
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

from rapidmount.shared import allocator, logs
from rapidmount.shared import auth, peer_memory
from rapidmount.workers.client.connect import connect
from rapidmount.shared.peer_memory import PeerBytes
from rapidmount.workers.client.reader import BidiObjectReader, RangeObjectReader
from rapidmount.workers.client.storage import StorageClient
from rapidmount.workers.client.writer import CHUNK_BYTES, AppendableWriter
from rapidmount.shared.arena import WorkerArena
from rapidmount.workers.descriptors import DescriptorInbox
from rapidmount.shared.messages import (FAILED, FILL, FRAME_HEADER, IN_KERNEL_ONLY, NOTICE, OK, REPLIED_FROM_HELD,
                                           FrameReader,
                                           Message, encode)
from rapidmount.workers.pagestore import PageStorer, abort_connection
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.workers.tokens import PushedTokens
from rapidmount.shared.exits import MountError
from rapidmount.shared import fuse_codec as codec
from rapidmount.workers import scan_batches as batches
from rapidmount.storage.counters import RpcErrorCounts
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout
from rapidmount.workers.retry import RetryPolicy
from rapidmount.shared.threads import start_named

log = logging.getLogger("rapidmount.worker")

#: The unary calls a worker makes for the FUSE process (``StorageClient`` methods).
CLIENT_CALLS = frozenset({
    "get_object", "stat_name", "list_page", "list_folders_page", "list_child_folders", "list_directory", "delete_object",
    "move_object", "update_metadata", "create_folder", "delete_folder", "rename_folder"})
#: The calls on an appender besides ``append``.
APPENDER_CALLS = frozenset({"create", "takeover", "flush", "finalize", "close", "abort"})
#: How many closed stream ids the worker remembers (a call crosses a close
#: within milliseconds; this bounds the memory).
ENDED_KEPT = 4096
#: How long a worker whose socket closed while a store sleeps waits to see
#: its FUSE process gone (a process that exits closes its descriptors first).
PARENT_EXIT_S = 2.0
#: Page-store outcomes go to the FUSE process at most this often, as one
#: notice: a notice per block stored woke that process for a counter.
STORE_REPORT_S = 0.05
#: The exit status of a worker that could not take a WRITE's bytes from its pipe.
EXIT_UNFILLED = 75


class _ForwardedErrors(RpcErrorCounts):
    """Failed calls, counted by the FUSE process's metrics (sent as notices)."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        super().__init__()
        self._send = send

    def add(self, method: str, code: object) -> None:
        self._send((NOTICE, "rpc_error", (method, getattr(code, "name", None) or str(code))))


class Worker:
    def __init__(self, settings: WorkerSettings, arena: WorkerArena, writer: asyncio.StreamWriter,
                 descriptor_socket: socket.socket, parent: int, peer_refusal: str | None,
                 write_pipes: dict[int, int] | None = None) -> None:
        self.settings = settings
        self.arena = arena
        #: The FUSE process, and why appended bytes cannot be read from its memory (None: they can).
        self.parent = parent
        self.peer_refusal = peer_refusal
        self._writer = writer
        self.client: StorageClient  # set by start(), before any call is taken
        self.layout: BucketLayout
        self.readers: dict[int, BidiObjectReader | RangeObjectReader] = {}
        self.appenders: dict[int, AppendableWriter] = {}
        # Ids closed lately: a call can cross its stream's close on the way (sent
        # before it, run after it), and must not open a stream nobody closes.
        self.ended: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.tasks: set[asyncio.Task[None]] = set()
        self.tokens: PushedTokens | None = None
        if settings.tokens:
            loop = asyncio.get_running_loop()
            self.tokens = PushedTokens(
                lambda: loop.call_soon_threadsafe(self.send, (NOTICE, "token_wanted", None)),
                lambda serial: self.send((NOTICE, "token_refused", serial)))
        self.reauth = self.tokens.reauth() if self.tokens is not None else None
        self.retry: RetryPolicy  # the client's, once connected
        self.store_reports = StoreReports(asyncio.get_running_loop(), self.send)
        self.pages = PageStorer(settings.page_store_buffer, self.store_reports.add)
        self.descriptors = DescriptorInbox(descriptor_socket, self.pages.use_device, self._new_write_pipe)
        #: The pipes large WRITEs' bytes come in: id -> read end (:mod:`~rapidmount.dataplane.write_pipes`).
        self.write_pipes = write_pipes or {}
        self.fills_done = 0  # WRITEs whose bytes the fill thread put into the arena
        self._fill_waiting = False  # an append waits for fills: the thread wakes this loop
        self._fill_futures: list[asyncio.Future[None]] = []
        #: Per stream, the last append waiting for fills: later calls on it wait for that one.
        self._gates: dict[int, asyncio.Future[None]] = {}
        #: fusectl's number of the mount's FUSE connection, once the FUSE process told it.
        self.fuse_connection: int | None = None

    def send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode(message))

    def _on_read_event(self, event: str) -> None:
        self.send((NOTICE, "event", ("read", event)))

    def _on_write_event(self, event: str) -> None:
        self.send((NOTICE, "event", ("write", event)))

    async def start(self) -> None:
        credentials = auth.call_credentials(self.tokens) if self.tokens is not None else None
        self.client, self.layout = await connect(self.settings, credentials, self.reauth)
        self.retry = self.client.retry
        self.client.rpc_errors = _ForwardedErrors(self.send)

    # -- calls -------------------------------------------------------------------------------------

    def dispatch(self, call_id: int, op: str, args: Message, passes_descriptor: bool = False) -> None:
        if call_id == NOTICE:
            self._notice(op, args)
            return
        if op == "reply":  # one writev: answered at once, without a task of its own
            self.send((call_id, OK, self.reply(*args)))
            return
        task = asyncio.get_running_loop().create_task(self._answer(call_id, op, args, passes_descriptor))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _notice(self, kind: str, payload: Any) -> None:
        if kind == "token":
            if self.tokens is not None:
                self.tokens.push(*payload)
        elif kind == "token_failed":
            if self.tokens is not None:
                self.tokens.push_failure(payload)
        elif kind == "close_reader":
            self._end(payload)
            reader = self.readers.pop(payload, None)
            if reader is not None:
                self._spawn(reader.close())
        elif kind == "forget_appender":
            self._end(payload)
            writer = self.appenders.pop(payload, None)
            if writer is not None:
                self._spawn(writer.abort())
        elif kind == "skip_store":
            self.pages.skip(payload)
        elif kind == "reopen_logs":
            logs.reopen()
        elif kind == "fuse_connection":
            self.fuse_connection = payload
            log.debug("the mount's FUSE connection is %d (fusectl)", payload)

    def _end(self, stream_id: int) -> None:
        self.ended[stream_id] = None
        if len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def _check_open(self, stream_id: int) -> None:
        if stream_id in self.ended:
            raise StorageError("the stream was closed", errno_=errno.EBADF)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, call_id: int, op: str, args: Message, passes_descriptor: bool) -> None:
        try:
            if passes_descriptor:
                fd = await self.descriptors.take(call_id, self.settings.retry_deadline)
                try:
                    result = await getattr(self, "op_" + op)(*args, fd=fd)
                finally:
                    os.close(fd)
            else:
                result = await getattr(self, "op_" + op)(*args)
        except StorageError as err:
            self.send((call_id, FAILED, err))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this worker is stopping: the FUSE process sees it gone
            # grpc.aio raises CancelledError in whoever awaits a call that was
            # cancelled under it (a stream aborted by another call): an answer
            # is still owed, or the caller would wait for good.
            self.send((call_id, FAILED, StorageError(f"{op}: its stream was cancelled", errno_=errno.EIO)))
        except Exception as err:  # noqa: BLE001 - one line to the caller, never a silent hang
            log.warning("data-plane call %s failed: %s: %s", op, type(err).__name__, err)
            self.send((call_id, FAILED, StorageError(f"{op}: {type(err).__name__}: {err}")))
        else:
            try:
                self.send((call_id, OK, result))
            except (pickle.PicklingError, TypeError) as err:  # a bug, but never a hang
                self.send((call_id, FAILED, StorageError(f"{op}: cannot send the result: {err}")))

    async def op_ping(self) -> None:
        """The FUSE process's heartbeat: answered as soon as this event loop turns."""
        return None

    async def op_client(self, method: str, args: Message, kwargs: dict[str, Any]) -> Any:
        if method not in CLIENT_CALLS:
            raise StorageError(f"unknown call {method!r}")
        return await getattr(self.client, method)(*args, **kwargs)

    async def op_write_object(self, name: str, size: int, kwargs: dict[str, Any], *, fd: int | None = None) -> Any:
        """A whole upload of the staged file ``fd`` (the call passed it), or of nothing."""
        source = staged_bytes(fd) if fd is not None else (lambda offset, n: b"")
        return await self.client.write_object(name, source, size, **kwargs)

    async def op_whole(self, items: list[tuple[str, int, int]], concurrency: int,
                       targets: list[int | None]) -> list[object]:
        answers = await batches.read_objects_whole(
            self.client, items, zonal=self.layout.bidi_reads, concurrency=concurrency, retry=self.retry,
            stall_timeout=self.settings.stall_timeout, on_event=self._on_read_event)
        return self._land(answers, [length for _, _, length in items], targets)

    async def op_composed(self, items: list[tuple[str, int, int, int | None]], concurrency: int,
                          temporary_names: list[str], targets: list[int | None]) -> list[object]:
        names = iter(temporary_names)
        answers = await batches.read_objects_composed(
            self.client, items, concurrency=concurrency, retry=self.retry, temporary_name=lambda: next(names),
            stall_timeout=self.settings.stall_timeout, on_event=self._on_read_event)
        return self._land(answers, [size for _, _, size, _ in items], targets)

    def _land(self, answers: list[bytes | memoryview | StorageError], lengths: list[int],
              targets: list[int | None]) -> list[object]:
        """A batch's answers for the FUSE process: each item's bytes written into
        its arena region (``targets``, of its length) and counted; in the answer
        when it has no region; a failure as it is."""
        landed: list[object] = []
        for answer, length, target in zip(answers, lengths, targets):
            if isinstance(answer, StorageError):
                landed.append(answer)
            elif len(answer) > length:  # never past its region
                landed.append(StorageError(f"a batch read got {len(answer)} bytes for {length}", errno_=errno.EIO))
            elif target is None:
                landed.append(bytes(answer))
            else:
                landed.append(self.arena.write(target, answer))
        return landed

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
            os.writev(device, [codec.reply_header(unique, length), *buffers])
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.info("could not answer a READ of %d bytes: %s", length, err.strerror)
            return False
        return True

    # -- WRITEs whose bytes wait in pipes (the fill thread) ----------------------------------------

    def start_fills(self, sock: socket.socket) -> None:
        """Take WRITEs from ``sock`` on a thread of its own: a WRITE's writer
        waits for its answer, which must not wait for this event loop."""
        loop = asyncio.get_running_loop()

        def advanced() -> None:
            self._fill_waiting = False
            waiting, self._fill_futures = self._fill_futures, []
            for future in waiting:
                if not future.done():
                    future.set_result(None)

        def send_soon(message: Message) -> None:
            loop.call_soon_threadsafe(self.send, message)

        def take() -> None:
            while True:
                try:
                    record = sock.recv(FILL.size)
                except OSError:
                    return
                if len(record) != FILL.size:
                    return  # the FUSE process closed it: this worker is stopping, or was given up
                pipe_id, size, arena_offset, unique = FILL.unpack(record)
                self.fill(pipe_id, arena_offset, size, unique, send_soon)
                self.fills_done += 1
                if self._fill_waiting:
                    loop.call_soon_threadsafe(advanced)

        def run() -> None:
            try:
                take()
            except BaseException as err:  # appends would wait for its fills for good: the mount takes them
                log.error("the WRITE fill thread failed (%s: %s); this worker stops", type(err).__name__, err)
                os._exit(EXIT_UNFILLED)

        start_named(run, "write-fills")

    def _new_write_pipe(self, pipe_id: int, fd: int) -> None:
        """A WRITE pipe made after this worker started (one replaced a lost
        worker's): the mount hands it WRITEs through it once told it is here."""
        self.write_pipes[pipe_id] = fd
        self.send((NOTICE, "write_pipe", pipe_id))

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

    async def _after_fills(self, count: int) -> None:
        """Return once ``count`` WRITEs have their bytes in the arena."""
        while self.fills_done < count:
            self._fill_waiting = True  # before the check below: the thread looks at it after counting
            if self.fills_done >= count:
                break
            future = asyncio.get_running_loop().create_future()
            self._fill_futures.append(future)
            await future

    def fill(self, pipe_id: int, arena_offset: int, size: int, unique: int,
             send: Callable[[Message], None] | None = None) -> None:
        """Read WRITE ``unique``'s ``size`` bytes from pipe ``pipe_id`` into
        the arena, then answer the WRITE. One read, into the start of the
        region: if this worker is lost, the FUSE process reads the rest into
        the rest. A pipe that cannot give them all ends this worker, so that
        the FUSE process takes them; it never appends a region not filled."""
        fd = self.write_pipes.get(pipe_id)
        got = -1
        if fd is not None:
            try:
                got = os.readv(fd, [self.arena.view(arena_offset, size)])
            except OSError as err:
                log.error("could not read a WRITE's bytes from its pipe: %s", err.strerror)
        if got != size:
            log.error("a WRITE's pipe gave %d of %d bytes; this worker stops, the mount takes them", got, size)
            os._exit(EXIT_UNFILLED)
        device = self.pages.device
        if device is not None:
            try:
                os.write(device, codec.reply_write(unique, size))
                return
            except OSError as err:
                if err.errno == errno.ENOENT:  # interrupted, or the mount was aborted
                    return
                log.info("could not answer a WRITE of %d bytes: %s", size, err.strerror)
        (send or self.send)((NOTICE, "write_unanswered", (unique, size)))

    async def op_drain_stores(self, nodeid: int, epoch: int) -> None:
        await asyncio.to_thread(self.pages.drain, nodeid, epoch)

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


def staged_bytes(fd: int) -> Callable[[int, int], bytes]:
    """``read(offset, n)`` of a staged file: exactly ``n`` bytes, else EIO (the
    FUSE process never uploads past the end of what it staged)."""
    def read(offset: int, n: int) -> bytes:
        data = os.pread(fd, n, offset)
        if len(data) != n:
            raise StorageError(f"the staged file ends at {offset + len(data)}, before {offset + n}",
                               errno_=errno.EIO)
        return data
    return read


async def _release_free_memory() -> None:
    while await asyncio.to_thread(allocator.release_free_memory):
        await asyncio.sleep(allocator.TRIM_INTERVAL_S)


async def serve(settings: WorkerSettings, sock: socket.socket, arena: WorkerArena,
                descriptor_socket: socket.socket, parent: int, peer_refusal: str | None, *,
                trim: bool = True, write_pipes: dict[int, int] | None = None,
                fills: socket.socket | None = None) -> int:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    worker = Worker(settings, arena, writer, descriptor_socket, parent, peer_refusal, write_pipes)
    worker.pages.start()
    if fills is not None:
        fills.setblocking(True)
        worker.start_fills(fills)
    worker.descriptors.start()
    frames = FrameReader()

    async def pump() -> None:
        # Token pushes may arrive while connecting; calls come only after "ready".
        while data := await reader.read(1 << 20):
            for message in frames.feed(data):
                worker.dispatch(*message)
            await writer.drain()

    pumping = asyncio.get_running_loop().create_task(pump())
    try:
        await worker.start()
    except MountError as err:
        worker.send((NOTICE, "fatal", str(err)))
        await writer.drain()
        pumping.cancel()
        return 1
    worker.send((NOTICE, "peer_reads", worker.peer_refusal))
    worker.send((NOTICE, "ready", worker.layout))
    if trim:  # glibc's malloc; jemalloc gives idle pages back by itself
        worker._spawn(_release_free_memory())
    try:
        await pumping  # until the FUSE process closes the socket: unmounting, or gone
    except ConnectionError:
        pass
    if worker.pages.close() and await _parent_gone(parent, lambda: worker.pages.storing):
        # The FUSE process died (not an unmount: it would have waited for us)
        # while a store sleeps on a page only it could release.
        abort_connection(worker.fuse_connection)
    worker.descriptors.close()
    worker.store_reports.flush()
    for task in list(worker.tasks):
        task.cancel()
    # A socket reset at unmount (the FUSE process closed it with answers unread)
    # is kept by the stream's close future too: take it, or asyncio logs it at exit.
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass
    await worker.client.channel.close(grace=0.5)
    return 0


class StoreReports:
    """The store thread's outcomes (``add``), summed per outcome and sent as one
    ``page_stores`` notice of ``(outcome, stores, bytes, seconds)`` at most
    every STORE_REPORT_S."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[Message], None]) -> None:
        self._loop = loop
        self._send = send
        self._lock = threading.Lock()
        self._sums: dict[str, list[float]] = {}
        self._due = False  # a flush is planned

    def add(self, outcome: str, size: int, seconds: float) -> None:
        """From any thread."""
        with self._lock:
            sums = self._sums.setdefault(outcome, [0, 0, 0.0])
            sums[0] += 1
            sums[1] += size
            sums[2] += seconds
            if self._due:
                return
            self._due = True
        try:
            self._loop.call_soon_threadsafe(self._loop.call_later, STORE_REPORT_S, self.flush)
        except RuntimeError:  # the loop closed: the worker is ending, its reports with it
            pass

    def flush(self) -> None:
        """On the event loop: send what was added since the last flush."""
        with self._lock:
            sums, self._sums, self._due = self._sums, {}, False
        if sums:
            self._send((NOTICE, "page_stores", [(outcome, int(count), int(size), seconds)
                                                 for outcome, (count, size, seconds) in sums.items()]))


async def _parent_gone(parent: int, waiting: Callable[[], bool]) -> bool:
    """Whether the FUSE process died, asked while ``waiting()`` (a store
    sleeps): True once this worker has another parent. A dying process
    closes its descriptors, which ends our socket, before its children are
    given to another parent, so a first look may still find it."""
    deadline = time.monotonic() + PARENT_EXIT_S
    while os.getppid() == parent:
        if not waiting() or time.monotonic() > deadline:
            return False  # the store ended (an unmount), or the process lives on
        await asyncio.sleep(0.01)
    return waiting()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a rapidmount data-plane worker (started by the mount)")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--arena-fd", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--fd-socket", type=int, required=True,
                        help="the descriptor socket: staged files to upload, and /dev/fuse for page-cache stores")
    parser.add_argument("--write-pipes", default="",
                        help="ID:FD,...: the pipes large WRITEs' bytes come in (read ends, inherited)")
    parser.add_argument("--fill-socket", type=int, default=None,
                        help="the socket the WRITEs whose bytes wait in those pipes come on")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the mount decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    on_glibc = not allocator.jemalloc_is_malloc()
    if on_glibc:
        allocator.share_one_arena()  # before gRPC starts its threads
        allocator.retain_large_buffers()  # chunks arrive and leave here: reuse their memory
    sock = socket.socket(fileno=args.socket_fd)
    sock.setblocking(True)
    settings: WorkerSettings = _read_message(sock)
    logs.setup(settings.log_level, settings.log_file, settings.log_to_stderr, settings.log_format)
    arena = WorkerArena(args.arena_fd, settings.arena_size)
    os.close(args.arena_fd)
    sock.setblocking(False)
    descriptor_socket = socket.socket(fileno=args.fd_socket)
    parent = os.getppid()  # the FUSE process: it started this one
    peer_refusal = peer_memory.probe(parent, *settings.peer_probe) if settings.peer_probe else "not offered"
    try:
        fills = socket.socket(fileno=args.fill_socket) if args.fill_socket is not None else None
        return asyncio.run(serve(settings, sock, arena, descriptor_socket, parent, peer_refusal, trim=on_glibc,
                                 write_pipes=parse_write_pipes(args.write_pipes), fills=fills))
    except (ConnectionError, BrokenPipeError):
        return 0


def parse_write_pipes(text: str) -> dict[int, int]:
    """``ID:FD,...`` -> {id: fd}."""
    pipes = {}
    for item in filter(None, text.split(",")):
        pipe_id, fd = item.split(":")
        pipes[int(pipe_id)] = int(fd)
    return pipes


def _read_message(sock: socket.socket) -> Any:
    """The settings message, read before the event loop starts."""
    header = _recv_exactly(sock, FRAME_HEADER)
    (message,) = FrameReader().feed(header + _recv_exactly(sock, int.from_bytes(header[:4], "little")))
    return message


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            sys.exit(0)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    raise SystemExit(main())
