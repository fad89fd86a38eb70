"""Object readers: one long-lived BidiReadObject stream per open file handle.

A :class:`BidiObjectReader` multiplexes concurrent range reads on one stream,
each with its own ``read_id``. One supervisor task owns the stream: it opens
it lazily, follows redirects (routing token + read handle), resumes every
unfinished range where it stopped after a break, and gives up with an errno
once the retry deadline passes. Every chunk's CRC32C is checked; a mismatch
is retried, never returned.

Non-zonal buckets have no bidi reads; :class:`RangeObjectReader` offers the
same interface over one ``ReadObject`` call per range.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from rapidmount.shared import wire
from rapidmount.workers.client.errors import (
    ChecksumMismatch, RetryPolicy, StorageError, code_name, describe, final_error, is_retryable)
from rapidmount.workers.client.fastwire import ReadResponse, decode_bidi_read_response
from rapidmount.workers.client.stall import read_within
from rapidmount.workers.client.storage import StorageClient
from rapidmount.workers.retry import RetryBudget, retry_call

log = logging.getLogger("rapidmount.reader")

MAX_RANGES_PER_MESSAGE = 100
#: How long a close waits for the stream's reader to see its cancelled call and end.
CLOSE_GRACE_S = 1.0


@dataclass(eq=False)
class _Range:
    read_id: int
    offset: int
    length: int  # 0 = to the end of the object
    future: asyncio.Future[bytes | memoryview]
    received: int = 0
    chunks: list[bytes | memoryview] = field(default_factory=list)

    def request(self) -> wire.storage.ReadRange:
        """The range still to read: resumes where the last stream stopped."""
        remaining = 0 if self.length == 0 else self.length - self.received
        return wire.storage.ReadRange(read_offset=self.offset + self.received,
                                      read_length=remaining, read_id=self.read_id)


class StreamBroken(Exception):
    """The stream ended or misbehaved with ranges pending (retryable)."""


def _retryable(err: BaseException) -> bool:
    return isinstance(err, StreamBroken) or is_retryable(err)


class BidiObjectReader:
    """Reads ranges of one object generation over one bidi stream."""

    def __init__(self, client: StorageClient, name: str, generation: int, *,
                 retry: RetryPolicy, stall_timeout: float = 60.0,
                 on_event: Callable[[str], None] | None = None,
                 read_handle: bytes | None = None, routing_token: str | None = None) -> None:
        self._client = client
        self.name = name
        self.generation = generation
        self._retry = retry
        self._stall_timeout = stall_timeout
        self._on_event = on_event or (lambda event: None)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Range] = {}
        self._call: grpc.aio.StreamStreamCall | None = None
        self._write_lock = asyncio.Lock()
        self._wanted = asyncio.Event()
        # Another stream's handle and token, if given: the stream opens with
        # them (a handle skips the service's lookup of the object).
        self._read_handle: bytes | None = read_handle or None
        self._routing_token: str | None = routing_token or None
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def stream_open(self) -> bool:
        return self._call is not None

    @property
    def read_handle(self) -> bytes | None:
        """The latest read handle the service gave (None before its first answer)."""
        return self._read_handle

    @property
    def routing_token(self) -> str | None:
        """The routing token of the latest redirect, if any."""
        return self._routing_token

    # -- public API (the worker's event loop) --------------------------------------------------

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        """Read ``length`` bytes at ``offset`` (fewer at the end of the object).

        May return a read-only memoryview into a received message.
        """
        if self._closed:
            raise StorageError("read on a closed stream", errno_=errno.EBADF)
        if length <= 0:
            return b""
        rng = _Range(next(self._ids), offset, length, asyncio.get_running_loop().create_future())
        self._pending[rng.read_id] = rng
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        call = self._call
        self._wanted.set()
        try:
            if call is not None:
                # A failed send is harmless: the supervisor resends every pending
                # range on the next stream.
                await self._send(call, [rng.request()])
            return await rng.future
        finally:
            self._pending.pop(rng.read_id, None)
            if not rng.future.done():
                rng.future.cancel()  # nobody waits for it any more
            elif not rng.future.cancelled():
                rng.future.exception()  # an outcome nobody awaited is not an error to log

    async def close(self) -> None:
        self._closed = True
        call, self._call = self._call, None
        if call is not None:
            # Before the supervisor, which then sees the call end (see below).
            call.cancel()
        supervisor = self._supervisor
        if supervisor is not None:
            if call is not None:
                # The cancelled call ends the supervisor's read by itself. A task
                # cancelled while it waits in ``call.read()`` leaks the call's memory
                # in gRPC's core (about 20 KiB a call, which readers closed with
                # ranges in flight made hours of traffic pile up in the workers).
                await asyncio.wait({supervisor}, timeout=CLOSE_GRACE_S)
            supervisor.cancel()
            try:
                await supervisor
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_all(StorageError("stream closed", errno_=errno.EBADF))

    # -- the supervisor ----------------------------------------------------------------------------

    async def _supervise(self) -> None:
        budget = self._retry.start()
        while not self._closed:
            if not self._pending:
                self._wanted.clear()
                await self._wanted.wait()
                continue
            call = None
            budget.attempting()
            try:
                try:
                    # A service that takes the stream but never reads it must not hang us.
                    async with asyncio.timeout(self._stall_timeout):
                        call = await self._open()  # on a timeout, _open cancels its call
                except TimeoutError:
                    raise StreamBroken(f"the stream did not open within {self._stall_timeout:g}s") from None
                await self._receive(call, budget)
            except asyncio.CancelledError:
                if call is not None:
                    call.cancel()
                raise
            except Exception as err:  # classified below; nothing escapes silently
                self._call = None
                if call is not None:
                    call.cancel()
                if isinstance(err, grpc.aio.AioRpcError):
                    self._client.rpc_errors.add("BidiReadObject", err.code())
                if not _retryable(err):
                    failure = await budget.reauthorize(err)
                    if failure is None:  # a fresh token: reopen at once
                        self._on_event("reconnect")
                        log.info("read stream for %r: %s; resuming with a fresh access token", self.name,
                                 describe(err), extra={"object": self.name, "grpc_code": code_name(err)})
                        continue
                    self._fail_all(self._final_error(failure))
                    budget.reset()  # a later read starts a fresh streak
                    continue
                delay = budget.next_delay()
                if delay is None:
                    self._fail_all(self._final_error(err, deadline_passed=True))
                    budget.reset()  # a later read starts a fresh streak
                    continue
                self._on_event("reconnect")
                log.info("read stream for %r broke (%s); resuming in %.3fs",
                         self.name, describe(err), delay,
                         extra={"object": self.name, "grpc_code": code_name(err)})
                await budget.pause(delay)

    async def _open(self) -> grpc.aio.StreamStreamCall:
        """Open a stream whose first message already asks for every pending range.

        One round trip, not two: the service answers the first message with
        the object's metadata and starts sending data right away.
        """
        spec = wire.storage.BidiReadObjectSpec(
            bucket=self._client.bucket_resource, object=self.name, generation=self.generation)
        if self._read_handle:
            spec.read_handle.handle = self._read_handle
        if self._routing_token:
            spec.routing_token = self._routing_token
        call = self._client.rpc("BidiReadObject", decode_bidi_read_response)(
            metadata=self._client.metadata(self._routing_token))
        try:
            async with self._write_lock:
                # No await between the snapshot and publishing the call: a range
                # added later is sent on the call by read() itself, after this.
                pending = [r.request() for r in list(self._pending.values())]
                self._call = call
                try:
                    await call.write(wire.storage.BidiReadObjectRequest(
                        read_object_spec=spec, read_ranges=pending[:MAX_RANGES_PER_MESSAGE]))
                    for start in range(MAX_RANGES_PER_MESSAGE, len(pending), MAX_RANGES_PER_MESSAGE):
                        await call.write(wire.storage.BidiReadObjectRequest(
                            read_ranges=pending[start:start + MAX_RANGES_PER_MESSAGE]))
                except (asyncio.InvalidStateError, grpc.aio.UsageError):
                    pass  # the call already ended; reading it reports why
        except BaseException as err:
            # An error, a timeout or a close (cancellation), even while waiting for
            # the lock: the call is already started and nobody else will end it.
            if isinstance(err, grpc.aio.AioRpcError):
                self._note_redirect(err)
            if self._call is call:
                self._call = None
            call.cancel()
            raise
        self._on_event("open")
        return call

    async def _receive(self, call: grpc.aio.StreamStreamCall, budget: RetryBudget) -> None:
        while True:
            try:
                response = await read_within(call, self._stall_timeout if self._pending else None)
            except TimeoutError:
                raise StreamBroken(f"no data for {self._stall_timeout:g}s") from None
            except grpc.aio.AioRpcError as err:
                self._note_redirect(err)
                raise
            if response is grpc.aio.EOF:
                if self._pending:
                    raise StreamBroken("stream ended with ranges pending")
                self._call = None
                return
            if self._closed:
                call.cancel()
                return
            self._absorb_metadata(response)
            if self._deliver(response):
                budget.reset()

    async def _send(self, call: grpc.aio.StreamStreamCall, ranges: list[wire.storage.ReadRange]) -> None:
        try:
            async with self._write_lock:
                for start in range(0, len(ranges), MAX_RANGES_PER_MESSAGE):
                    await call.write(wire.storage.BidiReadObjectRequest(
                        read_ranges=ranges[start:start + MAX_RANGES_PER_MESSAGE]))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # the supervisor sees the broken stream and resends

    # -- responses ---------------------------------------------------------------------------------

    def _absorb_metadata(self, response: ReadResponse) -> None:
        if response.read_handle:
            self._read_handle = response.read_handle
        if response.metadata is not None and not self.generation:
            # Pin what the first stream found, so a resumed stream reads the same bytes.
            self.generation = response.metadata.generation

    def _deliver(self, response: ReadResponse) -> bool:
        """Route each chunk to its range; True if any range made progress."""
        progressed = False
        for chunk in response.chunks:
            rng = self._pending.get(chunk.read_id)
            if rng is None or rng.future.done():
                continue  # a range we gave up on, or a stale duplicate
            if chunk.read_offset != rng.offset + rng.received:
                raise StreamBroken(f"chunk at offset {chunk.read_offset}, expected {rng.offset + rng.received}")
            if not chunk.crc_ok:
                self._on_event("checksum_failure")
                raise ChecksumMismatch(f"CRC32C mismatch in {self.name!r} at {chunk.read_offset}")
            size = len(chunk.content)
            if size:
                rng.chunks.append(chunk.content)
                rng.received += size
                progressed = True
            if rng.length and rng.received > rng.length:
                raise StreamBroken(f"server sent {rng.received} bytes for a {rng.length}-byte range")
            if chunk.range_end:
                chunks = rng.chunks
                # One chunk: hand out the view into the message, no copy.
                rng.future.set_result(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                progressed = True
        return progressed

    # -- errors ------------------------------------------------------------------------------------

    def _note_redirect(self, err: grpc.aio.AioRpcError) -> None:
        if err.code() != grpc.StatusCode.ABORTED:
            return
        details = wire.unpack_details(err.trailing_metadata(), wire.storage.BidiReadObjectRedirectedError)
        redirect = details.get(wire.storage.BidiReadObjectRedirectedError)
        if redirect is None:
            return
        self._on_event("redirect")
        if redirect.HasField("routing_token"):
            self._routing_token = redirect.routing_token
        if redirect.HasField("read_handle") and redirect.read_handle.handle:
            self._read_handle = redirect.read_handle.handle

    def _final_error(self, err: BaseException, *, deadline_passed: bool = False) -> StorageError:
        # NOT_FOUND of a pinned generation: the file changed (ESTALE).
        return final_error(err, f"read {self.name!r}", object_name=self.name,
                           pinned_generation=bool(self.generation), deadline_passed=deadline_passed)

    def _fail_all(self, error: StorageError) -> None:
        for rng in list(self._pending.values()):
            if not rng.future.done():
                rng.future.set_exception(error)
        self._pending.clear()


class RangeObjectReader:
    """Reads ranges with ``ReadObject`` (for buckets without bidi reads)."""

    def __init__(self, client: StorageClient, name: str, generation: int, *,
                 retry: RetryPolicy, stall_timeout: float = 60.0,
                 on_event: Callable[[str], None] | None = None) -> None:
        self._client = client
        self.name = name
        self.generation = generation
        self._retry = retry
        self._stall_timeout = stall_timeout
        self._on_event = on_event or (lambda event: None)

    async def read(self, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        chunks: list[bytes] = []
        received = 0

        async def attempt(budget: RetryBudget) -> bytes:
            """One ReadObject call, from where the last one stopped."""
            nonlocal received
            request = wire.storage.ReadObjectRequest(
                bucket=self._client.bucket_resource, object=self.name, generation=self.generation,
                read_offset=offset + received, read_limit=length - received)
            call = self._client.rpc("ReadObject")(request, metadata=self._client.metadata())
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._stall_timeout) as stall:
                    async for response in call:
                        stall.reschedule(loop.time() + self._stall_timeout)
                        data = response.checksummed_data
                        if data.HasField("crc32c") and wire.crc32c(data.content) != data.crc32c:
                            self._on_event("checksum_failure")
                            raise ChecksumMismatch(f"CRC32C mismatch in {self.name!r}")
                        if data.content:
                            chunks.append(data.content)
                            received += len(data.content)
                            budget.reset()
            except TimeoutError:
                call.cancel()
                raise StreamBroken(f"no data for {self._stall_timeout:g}s") from None
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                    return b"".join(chunks)  # reading at or past the end
                raise
            except BaseException:
                call.cancel()
                raise
            return b"".join(chunks)

        def on_error(err: BaseException) -> None:
            if isinstance(err, grpc.aio.AioRpcError):
                self._client.rpc_errors.add("ReadObject", err.code())

        return await retry_call(
            self._retry, attempt, retryable=_retryable, on_error=on_error,
            on_retry=lambda err, delay: self._on_event("reconnect"),
            give_up=lambda err, late: final_error(err, f"read {self.name!r}", object_name=self.name,
                                                  pinned_generation=bool(self.generation), deadline_passed=late))

    @property
    def stream_open(self) -> bool:
        return False  # one ReadObject call per range, no stream kept open

    async def close(self) -> None:
        return None
