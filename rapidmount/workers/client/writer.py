"""Appendable writes: one long-lived BidiWriteObject stream per file being written.

The writer keeps every byte that the service has not yet confirmed as
persisted, so a broken or redirected stream resumes from ``persisted_size``
with nothing lost; that retained buffer is bounded by ``buffer_limit`` and
``append`` waits (backpressure) when it is full. Small writes are coalesced
into chunks of at most 2 MiB, each sent with its ``write_offset`` and
CRC32C. Each byte is checksummed once, for its chunk; the object's CRC32C is
combined from the chunks'. A chunk's request is encoded by hand from the
retained pieces (:func:`fastwire.encode_write_data`), its only copy here. A
retained piece may be bytes of another process (:class:`PeerBytes`: the FUSE
process keeps them until confirmed), read straight into the request, and read
again after a reconnect. A flush asks for ``flush + state_lookup`` and returns only once the
service reports every byte written so far as persisted, and the service's
CRC32C of the persisted bytes matches ours.

Another client taking the object over makes the service fail our stream
with FAILED_PRECONDITION; that surfaces as ``ESTALE``, never retried.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVarTuple, cast

import grpc

from rapidmount.shared import wire
from rapidmount.shared.checksums import crc32c_of
from rapidmount.workers.client import fastwire
from rapidmount.workers.client.fastwire import Piece
from rapidmount.shared.peer_memory import PeerBytes
from rapidmount.workers.client.errors import RetryPolicy, StorageError, code_name, describe, final_error, is_retryable
from rapidmount.workers.client.stall import read_within
from rapidmount.workers.client.storage import StorageClient, record_from_object
from rapidmount.storage.model import ObjectMeta
from rapidmount.workers.retry import RetryBudget, retry_call

log = logging.getLogger("rapidmount.writer")

CHUNK_BYTES = wire.MAX_CHUNK_BYTES

_Args = TypeVarTuple("_Args")


class _Broken(Exception):
    """The stream failed; the caller reconnects (retryable)."""


def _retryable(err: BaseException) -> bool:
    return isinstance(err, _Broken) or is_retryable(err)


class RetainedBytes:
    """Bytes not yet confirmed persisted, as a FIFO of the pieces written.

    A bytearray would be simpler, but appending to its end while trimming its
    front makes CPython move the whole buffer again and again.
    """

    def __init__(self) -> None:
        self._pieces: collections.deque[Piece] = collections.deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, data: Piece) -> None:
        if data:
            self._pieces.append(data)
            self._size += len(data)

    def drop_front(self, count: int) -> None:
        self._size -= count
        while count:
            piece = self._pieces[0]
            if len(piece) <= count:
                self._pieces.popleft()
                count -= len(piece)
            else:
                self._pieces[0] = piece[count:]
                count = 0

    def pieces(self, start: int, length: int) -> list[Piece]:
        """The ``length`` bytes from ``start`` (relative to the front), as the
        pieces (or parts of them) that hold them: no copy."""
        parts = []
        for piece in self._pieces:
            if start >= len(piece):
                start -= len(piece)
                continue
            take = piece[start:start + length] if start or length < len(piece) else piece
            parts.append(take)
            length -= len(take)
            start = 0
            if not length:
                break
        return parts

    def crc32c(self, start: int, length: int, crc: int = 0) -> int:
        """``crc`` extended over ``length`` bytes from ``start``."""
        for part in self.pieces(start, length):
            crc = crc32c_of(part.read() if isinstance(part, PeerBytes) else part, crc)
        return crc

    def clear(self) -> None:
        self._pieces.clear()
        self._size = 0


class AppendableWriter:
    """Appends to one appendable object through one bidi stream."""

    def __init__(self, client: StorageClient, name: str, *, retry: RetryPolicy,
                 buffer_limit: int = 32 << 20, stall_timeout: float = 60.0,
                 on_event: Callable[[str], None] | None = None) -> None:
        self._client = client
        self.name = name
        self._retry = retry
        self._buffer_limit = max(buffer_limit, CHUNK_BYTES)
        self._stall_timeout = stall_timeout
        self._on_event = on_event or (lambda event: None)
        self.generation = 0
        # Bytes [persisted_size, written) are kept in _retained.
        self.persisted_size = 0
        self.written = 0
        self._retained = RetainedBytes()
        self._sent = 0  # absolute offset sent on the current stream
        self._crc_persisted = 0  # CRC32C of bytes [0, persisted_size), from the service
        self._crc_sent = 0  # our CRC32C of bytes [0, _sent), combined from the chunks'
        self._call: grpc.aio.StreamStreamCall | None = None
        self._credentials: int | None = None  # the token serial the stream was opened with
        self._write_handle: bytes | None = None
        self._routing_token: str | None = None
        self._lock = asyncio.Lock()
        self._sender: asyncio.Task[None] | None = None
        self._failure: StorageError | None = None  # a failure of the background sender
        self._closed = False
        self.finalized = False
        self.resource: ObjectMeta | None = None

    @property
    def stream_open(self) -> bool:
        return self._call is not None

    # -- opening ---------------------------------------------------------------------------------

    async def create(self, *, if_generation_match: int | None = 0,
                     metadata: Mapping[str, str] | None = None) -> ObjectMeta | None:
        """Create a new appendable object (``0`` = it must not exist yet) with custom ``metadata``."""
        async with self._lock:
            spec = wire.storage.WriteObjectSpec(
                resource=wire.storage.Object(name=self.name, bucket=self._client.bucket_resource,
                                             metadata=metadata or {}),
                appendable=True)
            if if_generation_match is not None:
                spec.if_generation_match = if_generation_match
            first = wire.storage.BidiWriteObjectRequest(write_object_spec=spec)
            response = await self._open_with_retries(first)
            return self._absorb_first(response)

    async def takeover(self, generation: int) -> int:
        """Become the writer of the unfinalized object ``generation``; returns its size."""
        async with self._lock:
            self.generation = generation
            response = await self._open_with_retries(self._append_spec_request())
            self._absorb_first(response)
            return self.persisted_size

    def _append_spec_request(self) -> wire.storage.BidiWriteObjectRequest:
        spec = wire.storage.AppendObjectSpec(
            bucket=self._client.bucket_resource, object=self.name, generation=self.generation)
        if self._write_handle:
            spec.write_handle.handle = self._write_handle
        if self._routing_token:
            spec.routing_token = self._routing_token
        return wire.storage.BidiWriteObjectRequest(append_object_spec=spec)

    async def _open_with_retries(self, first: wire.storage.BidiWriteObjectRequest
                                 ) -> wire.storage.BidiWriteObjectResponse:
        def on_error(err: BaseException) -> None:
            nonlocal first
            redirected = self._note_failure(err)
            if redirected and first.HasField("write_object_spec") and self.generation:
                # The object exists now: the retry appends to it by generation.
                first = self._append_spec_request()
            elif first.HasField("append_object_spec"):
                first = self._append_spec_request()  # with the latest handle and routing token

        return await retry_call(self._retry, lambda budget: self._open(first, budget), retryable=_retryable,
                                on_error=on_error, on_retry=self._on_retry, give_up=self._give_up)

    async def _open(self, first: wire.storage.BidiWriteObjectRequest,
                    budget: RetryBudget) -> wire.storage.BidiWriteObjectResponse:
        self._credentials = budget.credentials  # what the stream carries, for its whole life
        call = self._client.rpc("BidiWriteObject", serializer=fastwire.passthrough_or_serialize)(
            metadata=self._client.metadata(self._routing_token))
        try:
            await call.write(first)
            response = await read_within(call, self._stall_timeout)
        except TimeoutError:
            call.cancel()
            raise _Broken("no answer to the stream's first message") from None
        except BaseException:
            call.cancel()  # an error, or a cancellation: the started call must not stay open
            raise
        if response is grpc.aio.EOF:
            call.cancel()
            raise _Broken("stream ended before its first response")
        self._call = call
        self._on_event("open")
        return cast(wire.storage.BidiWriteObjectResponse, response)  # not EOF: the stream's first message

    def _absorb_first(self, response: wire.storage.BidiWriteObjectResponse) -> ObjectMeta | None:
        if response.HasField("write_handle"):
            self._write_handle = response.write_handle.handle
        meta = None
        if response.HasField("resource"):
            meta = record_from_object(response.resource)
            self.generation = response.resource.generation
            persisted = response.resource.size
            self.resource = meta
        else:
            persisted = response.persisted_size
        crc = response.persisted_data_checksums.crc32c if response.persisted_data_checksums.HasField(
            "crc32c") else None
        self._accept_persisted(persisted, crc, first=True)
        self._resend_from_persisted()
        return meta

    def _accept_persisted(self, persisted: int, crc: int | None, *, first: bool = False) -> None:
        if first and self.written == 0 and not self._retained:
            # A fresh writer (takeover): everything persisted so far is the start.
            self.persisted_size = self.written = persisted
            self._crc_persisted = crc or 0
            return
        if persisted < self.persisted_size or persisted > self.written:
            raise StorageError(
                f"write {self.name!r}: service reports {persisted} bytes persisted, "
                f"expected between {self.persisted_size} and {self.written}", errno_=errno.EIO)
        newly = persisted - self.persisted_size
        if newly:
            if persisted == self._sent:
                self._crc_persisted = self._crc_sent  # the usual case: no need to rescan
            else:
                self._crc_persisted = self._retained.crc32c(0, newly, self._crc_persisted)
            self._retained.drop_front(newly)
            self.persisted_size = persisted
        if crc is not None and crc != self._crc_persisted:
            raise StorageError(f"write {self.name!r}: CRC32C of persisted data differs from what was sent",
                               errno_=errno.EIO)

    # -- data ------------------------------------------------------------------------------------

    async def append(self, data: Piece) -> None:
        """Append ``data``; returns once it is queued, waits while the buffer is full.

        Chunks go out from a sender task, so the caller does not wait for the
        network on every write; failures surface on the next call.
        """
        self._check_open()
        self._retained.append(data)
        self.written += len(data)
        if self.written - self._sent >= CHUNK_BYTES and (self._sender is None or self._sender.done()):
            self._sender = asyncio.get_running_loop().create_task(self._send_in_background())
        if self.written - self.persisted_size > self._buffer_limit:
            async with self._lock:
                self._check_open()
                await self._with_retries(self._persist)

    async def _send_in_background(self) -> None:
        async with self._lock:
            if self._failure is not None or self._closed:
                return
            try:
                await self._with_retries(self._push_ahead)
            except StorageError as err:
                self._failure = err

    async def _push_ahead(self) -> None:
        """Send whole chunks; past half the buffer, flush what was sent, so
        the buffer empties while appends go on, and an append seldom waits
        for a flush of its own."""
        await self._push(False)
        if self._sent - self.persisted_size >= self._buffer_limit // 2:
            await self._flush_sent()

    async def flush(self) -> int:
        """Make every byte appended so far durable; returns the persisted size."""
        async with self._lock:
            self._check_open()
            if self.persisted_size < self.written or self._call is None:
                await self._with_retries(self._persist)
            return self.persisted_size

    async def finalize(self) -> ObjectMeta:
        """Persist everything, then finalize with the full-object CRC32C.

        The finish is retried like any step. A finish whose answer was lost
        may have finalized the object already: the stream cannot be reopened
        then, and the object itself says whether it holds exactly our bytes."""
        async with self._lock:
            self._check_open()
            await self._with_retries(self._persist)
            finished: list[ObjectMeta | None] = []  # None: a finish was sent, no answer yet
            try:
                await self._with_retries(self._finish, finished)
            except StorageError:
                if not finished:  # no finish_write was sent: nothing to look for
                    raise
                meta = await self._client.get_object(self.name, self.generation)
                if meta is None or not self._is_ours_finalized(meta):
                    raise
                log.info("finalize %r: the answer was lost; the object is finalized with every byte",
                         self.name, extra={"object": self.name})
                finished.append(meta)
            self.finalized = True
            resource = finished[-1]
            assert resource is not None  # a finish that succeeded appended its answer
            self.resource = resource
            await self._end_stream()
            return resource

    async def _finish(self, finished: list[ObjectMeta | None]) -> None:
        """Send finish_write (after any bytes a reopened stream still needs)."""
        if self.persisted_size < self.written:
            await self._persist()
        call = self._call
        assert call is not None  # only while a stream is open
        finished.append(None)  # sent: from here, the object may be finalized whatever happens
        try:
            await call.write(wire.storage.BidiWriteObjectRequest(
                write_offset=self.written, finish_write=True,
                object_checksums=wire.storage.ObjectChecksums(crc32c=self._crc_of_written())))
        except (asyncio.InvalidStateError, grpc.aio.UsageError):
            await _raise_status(call)
        response = await self._read(call)
        if response is None:
            raise _Broken("stream ended while finalizing")
        if not response.HasField("resource"):
            raise StorageError(f"finalize {self.name!r}: no object in the answer", errno_=errno.EIO)
        finished.append(record_from_object(response.resource))

    def _is_ours_finalized(self, meta: ObjectMeta) -> bool:
        return (meta.finalized and meta.generation == self.generation and meta.size == self.written
                and meta.crc32c in (None, self._crc_of_written()))

    def _crc_of_written(self) -> int:
        """CRC32C of every byte written: the sent bytes' CRC, extended over any
        not sent yet (a finish that failed after a reopen may leave some)."""
        unsent = self.written - self._sent
        if not unsent:
            return self._crc_sent
        return self._retained.crc32c(self._sent - self.persisted_size, unsent, self._crc_sent)

    async def close(self) -> None:
        """Persist everything and close the stream, leaving the object appendable."""
        async with self._lock:
            if self._closed:
                return
            try:
                if not self.finalized and self.persisted_size < self.written:
                    await self._with_retries(self._persist)
            finally:
                await self._end_stream()

    async def abort(self) -> None:
        """Drop the stream without persisting anything further, and the bytes
        kept: their owner (the FUSE process) lets go of them once this returns."""
        self._closed = True
        self._retained.clear()
        if self._sender is not None:
            self._sender.cancel()
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed or self.finalized:
            raise StorageError(f"write {self.name!r}: the writer is closed", errno_=errno.EBADF)

    async def _end_stream(self) -> None:
        self._closed = True
        call, self._call = self._call, None
        if call is None:
            return
        try:
            await call.done_writing()
            # The service may answer once more after the half-close; drain it.
            while await read_within(call, 5.0) is not grpc.aio.EOF:
                pass
        except (grpc.aio.AioRpcError, TimeoutError, grpc.aio.UsageError):
            pass
        finally:
            call.cancel()

    # -- the stream ------------------------------------------------------------------------------

    async def _with_retries(self, step: Callable[[*_Args], Awaitable[None]], *args: *_Args) -> None:
        """``step(*args)`` on the stream, reopened (resuming from the persisted size) after a break."""
        async def attempt(budget: RetryBudget) -> None:
            if self._closed:  # aborted meanwhile: no stream again
                raise StorageError(f"write {self.name!r}: the writer is closed", errno_=errno.EBADF)
            if self._call is None:
                response = await self._open(self._append_spec_request(), budget)
                self._absorb_resume(response)
            else:
                budget.reusing(self._credentials)
            await step(*args)

        def on_error(err: BaseException) -> None:
            self._drop_call()
            self._note_failure(err)

        await retry_call(self._retry, attempt, retryable=_retryable, on_error=on_error,
                         on_retry=self._on_retry, give_up=self._give_up)

    def _absorb_resume(self, response: wire.storage.BidiWriteObjectResponse) -> None:
        if response.HasField("write_handle"):
            self._write_handle = response.write_handle.handle
        persisted = response.resource.size if response.HasField("resource") else response.persisted_size
        crc = response.persisted_data_checksums.crc32c if response.persisted_data_checksums.HasField(
            "crc32c") else None
        self._accept_persisted(persisted, crc)
        self._resend_from_persisted()

    def _resend_from_persisted(self) -> None:
        """A new stream: everything not yet persisted goes out again."""
        self._sent = self.persisted_size
        self._crc_sent = self._crc_persisted

    def _drop_call(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def _push(self, everything: bool) -> None:
        """Send retained bytes past ``_sent`` in chunks (a partial chunk only if ``everything``)."""
        call = self._call
        assert call is not None  # only while a stream is open
        if call.done():
            # The service ended the stream (e.g. another writer took over):
            # surface its status now rather than at the next flush.
            await _raise_status(call)
        while True:
            pending = self.written - self._sent
            if pending <= 0 or (pending < CHUNK_BYTES and not everything):
                return
            if self._closed:  # aborted: its owner may have let go of the retained bytes
                raise StorageError(f"write {self.name!r}: the writer is closed", errno_=errno.EBADF)
            size = min(pending, CHUNK_BYTES)
            pieces = self._retained.pieces(self._sent - self.persisted_size, size)
            request, crc = fastwire.encode_write_data(self._sent, pieces, size)
            del pieces  # views of the arena: held no longer than needed
            try:
                await call.write(request)
            except (asyncio.InvalidStateError, grpc.aio.UsageError):
                await _raise_status(call)
            self._sent += size
            self._crc_sent = wire.crc32c_combine(self._crc_sent, crc, size)

    async def _persist(self) -> None:
        """Send everything, then flush + state_lookup until all of it is persisted."""
        await self._push(True)
        await self._flush_sent()

    async def _flush_sent(self) -> None:
        """flush + state_lookup of every byte sent; the service must report them
        all persisted (appends made meanwhile are not part of it)."""
        call, sent = self._call, self._sent
        assert call is not None  # only while a stream is open
        try:
            await call.write(wire.storage.BidiWriteObjectRequest(write_offset=sent, flush=True, state_lookup=True))
        except (asyncio.InvalidStateError, grpc.aio.UsageError):
            await _raise_status(call)
        response = await self._read(call)
        if response is None:
            raise _Broken("stream ended while flushing")
        persisted = response.resource.size if response.HasField("resource") else response.persisted_size
        crc = response.persisted_data_checksums.crc32c if response.persisted_data_checksums.HasField(
            "crc32c") else None
        self._accept_persisted(persisted, crc)
        if self.persisted_size < sent:
            raise _Broken(f"flush persisted {self.persisted_size} of {sent} bytes")

    async def _read(self, call: grpc.aio.StreamStreamCall) -> wire.storage.BidiWriteObjectResponse | None:
        try:
            response = await read_within(call, self._stall_timeout)
        except TimeoutError:
            raise _Broken(f"no answer for {self._stall_timeout:g}s") from None
        return None if response is grpc.aio.EOF else response

    # -- errors ------------------------------------------------------------------------------------

    def _note_failure(self, err: BaseException) -> bool:
        """Count a failed attempt and follow its redirect, if any (True then)."""
        if isinstance(err, grpc.aio.AioRpcError):
            self._client.rpc_errors.add("BidiWriteObject", err.code())
        return self._note_redirect(err)

    def _on_retry(self, err: BaseException, delay: float) -> None:
        self._on_event("reconnect")
        log.info("write stream for %r broke (%s); resuming in %.3fs", self.name, describe(err), delay,
                 extra={"object": self.name, "grpc_code": code_name(err)})

    def _give_up(self, err: BaseException, deadline_passed: bool) -> StorageError:
        # FAILED_PRECONDITION (taken over by another writer, or finalized) is ESTALE by the one map;
        # NOT_FOUND of the generation being appended to (replaced or deleted elsewhere) is ESTALE too.
        return final_error(err, f"write {self.name!r}", object_name=self.name, deadline_passed=deadline_passed,
                           pinned_generation=bool(self.generation))

    def _note_redirect(self, err: BaseException) -> bool:
        if not isinstance(err, grpc.aio.AioRpcError) or err.code() != grpc.StatusCode.ABORTED:
            return False
        details = wire.unpack_details(err.trailing_metadata(), wire.storage.BidiWriteObjectRedirectedError)
        redirect = details.get(wire.storage.BidiWriteObjectRedirectedError)
        if redirect is None:
            return False
        self._on_event("redirect")
        if redirect.HasField("routing_token"):
            self._routing_token = redirect.routing_token
        if redirect.HasField("write_handle"):
            self._write_handle = redirect.write_handle.handle
        if redirect.HasField("generation"):
            self.generation = redirect.generation
        return True


async def _raise_status(call: grpc.aio.StreamStreamCall) -> None:
    """Raise the final status of a call the service has already ended."""
    code = await call.code()
    if code == grpc.StatusCode.OK:
        raise _Broken("the service closed the stream")
    raise grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                               await call.details())
