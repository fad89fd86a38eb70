"""The streaming RPCs: BidiReadObject, BidiWriteObject, ReadObject, WriteObject.

BidiReadObject answers the spec at once (metadata + read handle), then
serves every range in its own task; ranges interleave chunk by chunk
through one write lock. BidiWriteObject persists each data message as it
arrives and answers only state_lookup, finish_write, the open and the
half-close, which is what the official client waits for.

With ``--stream-bandwidth``, each read stream's chunks are paced by its own
token bucket (``pacing.StreamPacer``); writes are not paced.
"""

from __future__ import annotations

import asyncio
from typing import Any

import google_crc32c
import grpc

from rapidmount.shared import wire

from . import chunks, convert, handles
from .blobs import BlobReader
from .faults import Faults
from .pacing import StreamPacer
from .rpc import Code, Environment, RpcError, first_message, invalid, logger
from .store import ObjectRecord, Store, StoreError, bytes_beyond

S = wire.storage

MAX_RANGES_PER_MESSAGE = 100
# Ranges served at once per stream; beyond it the stream stops reading
# requests, so flow control pushes back on the client.
MAX_ACTIVE_RANGES = 1000


class _StreamMeter:
    """Data bytes a stream has moved, and the broken-* fault that may cut it."""

    def __init__(self, faults: Faults, kind: str, method: str, object_name: str) -> None:
        self._faults = faults
        self._kind = kind
        self._method = method
        self._object = object_name
        self.moved = 0

    def allowance(self, length: int) -> tuple[int, bool]:
        """How many of the next ``length`` bytes to move, and whether to break after them."""
        cut = self._faults.claim_break(self._kind, self._method, self._object, self.moved, length)
        return (length, False) if cut is None else (cut, True)

    def add(self, count: int) -> None:
        self.moved += count

    def broken(self) -> RpcError:
        return RpcError(Code.UNAVAILABLE, f"injected fault {self._kind}: stream broken after "
                                          f"{self.moved} bytes")


def _read_chunk(env: Environment, reader: BlobReader, method: str, object_name: str,
                position: int, count: int) -> tuple[bytes, int]:
    data, crc = reader.read_chunk(position, count) if count else (b"", 0)
    if env.faults.claim_corruption(method, object_name):
        crc ^= 0xFFFFFFFF
    return data, crc


def _chunk_length(position: int, end: int) -> int:
    """At most 2 MiB, ending on a 2 MiB boundary: after a range's first chunk
    every chunk is a whole stored segment (served without copying)."""
    return min(end - position, wire.MAX_CHUNK_BYTES - position % wire.MAX_CHUNK_BYTES)


def _presented_token(env: Environment, context: grpc.aio.ServicerContext, spec: Any) -> str | None:
    token = env.routing_params(context).get("routing_token")
    if token is None and spec.HasField("routing_token"):
        token = spec.routing_token
    return token


# ---------------------------------------------------------------- BidiReadObject

class BidiReadSession:
    METHOD = "BidiReadObject"

    def __init__(self, env: Environment, context: grpc.aio.ServicerContext) -> None:
        self._env = env
        self._context = context
        self._write_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(MAX_ACTIVE_RANGES)
        self._active: set[int] = set()
        self._reader: BlobReader | None = None
        self._name = ""
        self._meter: _StreamMeter | None = None
        self._pacer = StreamPacer(env.faults)  # one cap per stream, shared by its ranges
        self._broken = False

    async def run(self, requests: Any) -> None:
        first = await first_message(requests)
        if first is None:
            return
        try:
            await self._open(first)
            async with asyncio.TaskGroup() as ranges:
                # Ranges of the first message ride on the open's round trip.
                await self._schedule(ranges, first.read_ranges, round_trip=False)
                async for request in requests:
                    self._env.check_stream(self._context)
                    if request.HasField("read_object_spec"):
                        raise invalid("read_object_spec is only allowed in the first message of a stream")
                    await self._schedule(ranges, request.read_ranges)
            # The client half-closed and every range is served: end OK.
        finally:
            if self._reader is not None:
                self._reader.close()

    async def _open(self, first: Any) -> None:
        if not first.HasField("read_object_spec"):
            raise invalid("the first BidiReadObjectRequest must carry read_object_spec")
        env, spec = self._env, first.read_object_spec
        bucket = env.resolve_object(self._context, self.METHOD, spec.bucket, spec.object, "read_object_spec.")
        self._name = name = spec.object
        generation = spec.generation
        if spec.HasField("read_handle"):
            env.counters.bump("BidiReadObject with read_handle")
            try:
                pinned = handles.parse_read_handle(spec.read_handle.handle, bucket, name)
            except handles.BadHandle as exc:
                raise invalid(str(exc)) from None
            if generation and generation != pinned:
                raise invalid(f"read_handle names generation {pinned} but the spec asks for {generation}")
            generation = pinned
        presented = _presented_token(env, self._context, spec)
        token = env.faults.pending_redirect("read", bucket, name, presented)
        if token is None and not env.faults.follows_redirect(presented):
            token = env.faults.claim_redirect("read", self.METHOD, bucket, name)
        if token:
            raise self._redirect(bucket, name, generation, token)
        record, resource, self._reader = env.store.open_reader_resource(bucket, name, generation,
                                                                        convert.preconditions(spec))
        self._meter = _StreamMeter(env.faults, "broken-read", self.METHOD, name)
        size = self._reader.size()
        if size != record.size:  # appended to since the row was read: describe what is readable now
            resource = convert.object_proto(record, size).SerializeToString()
        await env.round_trip()
        # From the stored resource bytes: no Object message is built.
        await self._context.write(chunks.encode_read_open(
            resource, handles.read_handle(bucket, name, record.generation)))

    def _redirect(self, bucket: str, name: str, generation: int, token: str) -> RpcError:
        error = S.BidiReadObjectRedirectedError(routing_token=token)
        live = self._env.store.find_object(bucket, name)
        if live is not None:
            error.read_handle.handle = handles.read_handle(bucket, name, generation or live.generation)
        return RpcError(Code.ABORTED, f"redirected: retry with routing_token={token} in "
                                      "x-goog-request-params", [error])

    def _range_error(self, read_id: int, code: grpc.StatusCode, message: str) -> RpcError:
        status = wire.status_pb2.Status(code=code.value[0], message=message)
        detail = S.BidiReadObjectError(read_range_errors=[S.ReadRangeError(read_id=read_id, status=status)])
        return RpcError(code, message, [detail])

    async def _schedule(self, group: asyncio.TaskGroup, ranges: Any, *, round_trip: bool = True) -> None:
        if len(ranges) > MAX_RANGES_PER_MESSAGE:
            raise invalid(f"a BidiReadObjectRequest may carry at most {MAX_RANGES_PER_MESSAGE} "
                          f"read_ranges, got {len(ranges)}")
        seen: set[int] = set()
        for read_range in ranges:
            if read_range.read_id in self._active or read_range.read_id in seen:
                raise invalid(f"read_id {read_range.read_id} is already in use on this stream")
            seen.add(read_range.read_id)
        inline_ok = not (round_trip and self._env.faults.latency_s > 0)
        for read_range in ranges:
            offset = self._start_offset(read_range)
            read_id, length = read_range.read_id, read_range.read_length
            logger.debug("%s %r: read_id %d at %d, length %d", self.METHOD, self._name, read_id, offset, length)
            await self._slots.acquire()
            self._active.add(read_id)
            if inline_ok and 0 < length <= _chunk_length(offset, offset + length):
                # One chunk and no modelled wait: serve it now, without a task
                # (the common small read). Longer ranges get a task each, so
                # they interleave chunk by chunk.
                await self._serve(read_id, offset, length, False)
            else:
                group.create_task(self._serve(read_id, offset, length, round_trip))

    def _start_offset(self, read_range: Any) -> int:
        assert self._reader is not None
        if read_range.read_length < 0:
            raise self._range_error(read_range.read_id, Code.OUT_OF_RANGE,
                                    f"read_length {read_range.read_length} is negative")
        size = self._reader.size()
        offset = read_range.read_offset
        if offset < 0:
            return max(0, size + offset)  # counts back from the end
        if offset > size:
            raise self._range_error(read_range.read_id, Code.OUT_OF_RANGE,
                                    f"read_offset {offset} is beyond the object size {size}")
        return offset

    async def _serve(self, read_id: int, offset: int, length: int, round_trip: bool) -> None:
        assert self._reader is not None and self._meter is not None
        try:
            if round_trip:
                await self._env.round_trip()
            # Unfinalized objects grow: serve what is persisted now.
            size = self._reader.size()
            end = size if length == 0 else min(size, offset + length)
            position = offset
            while True:
                # Metered under the write lock: ranges interleave, and a
                # broken-read must cut after exactly N bytes on the wire.
                async with self._write_lock:
                    if self._broken:
                        return  # another range broke the stream; the task group is ending it
                    try:
                        self._env.check_stream(self._context)
                    except RpcError:
                        self._broken = True
                        raise
                    count, broken = self._meter.allowance(_chunk_length(position, end))
                    last = not broken and position + count >= end
                    if count or last:
                        # Paced under the lock: the cap is the stream's, and
                        # the other ranges could not send meanwhile anyway.
                        delay = self._pacer.charge(count)
                        if delay:
                            await asyncio.sleep(delay)
                        data, crc = _read_chunk(self._env, self._reader, self.METHOD, self._name, position, count)
                        await self._context.write(chunks.encode_range_chunk(data, crc, position, read_id, last))
                    self._meter.add(count)
                    self._broken = broken
                if broken:
                    raise self._meter.broken()
                if last:
                    return
                position += count
        finally:
            self._active.discard(read_id)
            self._slots.release()


# ---------------------------------------------------------------- uploads

class _AppendTarget:
    """An unfinalized appendable object, written under one writer epoch."""

    def __init__(self, store: Store, record: ObjectRecord) -> None:
        self._store = store
        self.record = record

    def write_handle(self) -> bytes:
        record = self.record
        return handles.write_handle(record.bucket, record.name, record.generation, record.writer_epoch)

    def append(self, offset: int, data: bytes, crc32c: int | None = None) -> None:
        record = self.record
        self.record = self._store.append(record.bucket, record.name, record.generation,
                                         record.writer_epoch, offset, data, crc32c)

    def state(self) -> tuple[int, int]:
        """Persisted size and crc32c; fails if this writer was fenced."""
        record = self.record
        self.record = self._store.writer_state(record.bucket, record.name, record.generation,
                                               record.writer_epoch)
        return self.record.size, self.record.crc32c

    async def flush(self) -> None:
        self.state()
        if self._store.blobs.durable:
            await asyncio.to_thread(self._store.sync, self.record)

    async def finish(self, checksums: Any | None) -> ObjectRecord:
        record = self.record
        # In a worker thread: finalizing may hash and fsync the whole object.
        self.record = await asyncio.to_thread(
            self._store.finalize, record.bucket, record.name, record.generation, record.writer_epoch,
            expected_crc32c=_expected_crc32c(checksums), expected_md5=_expected_md5(checksums))
        return self.record

    def close(self) -> None:
        """Nothing to release: appended bytes are already part of the object."""


class _StagedTarget:
    """A one-shot (non-appendable) upload, invisible until finish_write."""

    def __init__(self, store: Store, bucket: str, name: str, spec: Any) -> None:
        self._store = store
        self._bucket = bucket
        self._name = name
        self._spec = spec
        self._size = 0
        self._crc = 0
        self._blob_id: int | None = store.begin_upload()

    def append(self, offset: int, data: bytes, crc32c: int | None = None) -> None:
        assert self._blob_id is not None
        data = bytes_beyond(offset, self._size, data)
        if data:
            self._store.upload_append(self._blob_id, data)
            self._size += len(data)
            self._crc = google_crc32c.extend(self._crc, data)

    def state(self) -> tuple[int, int]:
        return self._size, self._crc

    async def flush(self) -> None:
        """Staged bytes become durable when the object is committed."""

    async def finish(self, checksums: Any | None) -> ObjectRecord:
        assert self._blob_id is not None
        spec, resource = self._spec, self._spec.resource
        if spec.HasField("object_size") and spec.object_size != self._size:
            raise invalid(f"write_object_spec.object_size is {spec.object_size} but "
                          f"{self._size} bytes were written")
        blob_id, self._blob_id = self._blob_id, None  # commit_upload owns it now
        # In a worker thread: committing checksums (and may fsync) the whole object.
        return await asyncio.to_thread(
            self._store.commit_upload,
            blob_id, self._bucket, self._name, convert.preconditions(spec),
            metadata=dict(resource.metadata), content_type=resource.content_type,
            storage_class=resource.storage_class, expected_crc32c=_expected_crc32c(checksums),
            expected_md5=_expected_md5(checksums))

    def close(self) -> None:
        if self._blob_id is not None:
            self._store.abort_upload(self._blob_id)
            self._blob_id = None


def _expected_crc32c(checksums: Any | None) -> int | None:
    return checksums.crc32c if checksums is not None and checksums.HasField("crc32c") else None


def _expected_md5(checksums: Any | None) -> bytes | None:
    return checksums.md5_hash if checksums is not None and checksums.md5_hash else None


class _Upload:
    """Data handling shared by WriteObject and BidiWriteObject messages."""

    def __init__(self, env: Environment, method: str, name: str, target: _AppendTarget | _StagedTarget):
        self.target = target
        self.checksums: Any | None = None
        self._meter = _StreamMeter(env.faults, "broken-write", method, name)

    def take(self, request: Any) -> bool:
        """Persist the message's data (if any); True if it carried data."""
        if request.HasField("object_checksums"):
            self.checksums = request.object_checksums
        if not request.HasField("checksummed_data"):
            return False
        chunk = request.checksummed_data
        data = chunk.content
        if len(data) > wire.MAX_CHUNK_BYTES:
            raise invalid(f"checksummed_data carries {len(data)} bytes; the limit is {wire.MAX_CHUNK_BYTES}")
        verified = None
        if chunk.HasField("crc32c"):
            if google_crc32c.value(data) != chunk.crc32c:
                raise invalid(f"checksummed_data.crc32c {chunk.crc32c} does not match the {len(data)} bytes "
                              f"at write_offset {request.write_offset}")
            verified = chunk.crc32c  # kept with the stored bytes: reads need no second pass
        count, broken = self._meter.allowance(len(data))
        if broken:
            self.target.append(request.write_offset, data[:count])
        else:
            self.target.append(request.write_offset, data, verified)
        self._meter.add(count)
        if broken:
            raise self._meter.broken()
        return True


def _target_spec(env: Environment, context: grpc.aio.ServicerContext, method: str, spec: Any) -> tuple[str, str]:
    resource = spec.resource
    return env.resolve_object(context, method, resource.bucket, resource.name,
                              "write_object_spec.resource.", "name"), resource.name


def _no_upload_id(upload_id: str) -> RpcError:
    return RpcError(Code.NOT_FOUND, f"upload_id {upload_id!r} does not exist: this emulator issues no "
                                    "resumable upload ids (use write_object_spec or append_object_spec)")


# ---------------------------------------------------------------- BidiWriteObject

class BidiWriteSession:
    """One BidiWriteObject stream.

    An error caused by a message the client does not wait on (data, a plain
    flush) is held, and the stream fails when the client next waits: at a
    state_lookup, finish_write or its half-close. Aborting at once races with
    the client's next write, and grpc clients then report INTERNAL ("Internal
    error from Core") instead of the real status. Held-back streams drop any
    further data, and give up waiting after ``_MAX_HELD_MESSAGES``.
    """

    METHOD = "BidiWriteObject"
    _MAX_HELD_MESSAGES = 256

    def __init__(self, env: Environment, context: grpc.aio.ServicerContext) -> None:
        self._env = env
        self._context = context
        self._upload: _Upload | None = None
        self._finished = False
        self._held_error: Exception | None = None
        self._held_messages = 0

    async def run(self, requests: Any) -> None:
        first = await first_message(requests)
        if first is None:
            return
        try:
            self._upload = await self._open(first)
            await self._handle_or_hold(first, follow_up=False)
            async for request in requests:
                await self._handle_or_hold(request, follow_up=True)
            if self._held_error is not None:
                raise self._held_error
            if not self._finished:
                # Half-close: one last persisted_size (a fenced writer gets its error).
                size, crc = self._upload.target.state()
                await self._env.round_trip()
                await self._context.write(S.BidiWriteObjectResponse(
                    persisted_size=size, persisted_data_checksums=S.ObjectChecksums(crc32c=crc)))
        finally:
            if self._upload is not None:
                self._upload.target.close()

    async def _handle_or_hold(self, request: Any, follow_up: bool) -> None:
        awaited = request.state_lookup or request.finish_write
        if self._held_error is not None:
            self._held_messages += 1
            if awaited or self._held_messages > self._MAX_HELD_MESSAGES:
                raise self._held_error
            return  # dropped: the stream has already failed
        try:
            self._env.check_stream(self._context)
            if follow_up and request.WhichOneof("first_message") is not None:
                raise invalid("write_object_spec, append_object_spec and upload_id are only "
                              "allowed in the first message of a stream")
            if self._finished:
                raise invalid("no message may follow finish_write")
            await self._handle(request)
        except (RpcError, StoreError) as error:
            if awaited:
                raise
            self._held_error = error

    async def _open(self, first: Any) -> _Upload:
        env, context = self._env, self._context
        kind = first.WhichOneof("first_message")
        if kind == "upload_id":
            raise _no_upload_id(first.upload_id)
        if kind is None:
            raise invalid("the first BidiWriteObjectRequest must carry write_object_spec or append_object_spec")
        if kind == "write_object_spec":
            spec = first.write_object_spec
            bucket, name = _target_spec(env, context, self.METHOD, spec)
            self._check_pending_redirect(bucket, name, env.routing_params(context).get("routing_token"))
            if spec.appendable:
                resource = spec.resource
                record = env.store.create_appendable(
                    bucket, name, convert.preconditions(spec), metadata=dict(resource.metadata),
                    content_type=resource.content_type, storage_class=resource.storage_class)
                target: _AppendTarget | _StagedTarget = _AppendTarget(env.store, record)
            else:
                target = _StagedTarget(env.store, bucket, name, spec)
        else:
            spec = first.append_object_spec
            bucket = env.resolve_object(context, self.METHOD, spec.bucket, spec.object, "append_object_spec.")
            name = spec.object
            if spec.generation <= 0:
                raise invalid("append_object_spec.generation is required")
            self._check_pending_redirect(bucket, name, _presented_token(env, context, spec))
            epoch = None
            if spec.HasField("write_handle"):
                try:
                    handle_generation, epoch = handles.parse_write_handle(spec.write_handle.handle, bucket, name)
                except handles.BadHandle as exc:
                    raise invalid(str(exc)) from None
                if handle_generation != spec.generation:
                    raise invalid(f"write_handle was issued for generation {handle_generation}, "
                                  f"not {spec.generation}")
            record = env.store.open_appendable(bucket, name, spec.generation, writer_epoch=epoch,
                                               preconditions=convert.preconditions(spec))
            target = _AppendTarget(env.store, record)
        upload = _Upload(env, self.METHOD, name, target)
        try:
            token = env.faults.claim_redirect("write", self.METHOD, bucket, name)
            if token:
                raise self._redirect(token, target)
            if isinstance(target, _AppendTarget):
                await env.round_trip()
                await context.write(S.BidiWriteObjectResponse(
                    resource=convert.object_proto(target.record),
                    write_handle=S.BidiWriteHandle(handle=target.write_handle()),
                    persisted_data_checksums=S.ObjectChecksums(crc32c=target.record.crc32c)))
        except BaseException:
            target.close()
            raise
        return upload

    def _check_pending_redirect(self, bucket: str, name: str, presented: str | None) -> None:
        token = self._env.faults.pending_redirect("write", bucket, name, presented)
        if token:
            live = self._env.store.find_object(bucket, name)
            target = _AppendTarget(self._env.store, live) if live and not live.finalized else None
            raise self._redirect(token, target)

    @staticmethod
    def _redirect(token: str, target: _AppendTarget | _StagedTarget | None) -> RpcError:
        error = S.BidiWriteObjectRedirectedError(routing_token=token)
        if isinstance(target, _AppendTarget):
            error.write_handle.handle = target.write_handle()
            error.generation = target.record.generation
        return RpcError(Code.ABORTED, f"redirected: retry with routing_token={token} in "
                                      "x-goog-request-params", [error])

    async def _handle(self, request: Any) -> None:
        assert self._upload is not None
        target = self._upload.target
        wrote = self._upload.take(request)
        if request.finish_write:
            record = await target.finish(self._upload.checksums)
            self._finished = True
            await self._env.round_trip()
            await self._context.write(S.BidiWriteObjectResponse(resource=convert.object_proto(record)))
            return
        if request.flush:
            await target.flush()
        if request.state_lookup:
            size, crc = target.state()
            await self._env.round_trip()
            await self._context.write(S.BidiWriteObjectResponse(
                persisted_size=size, persisted_data_checksums=S.ObjectChecksums(crc32c=crc)))
        elif not wrote:
            target.state()  # a fenced writer learns it on its next message


# ---------------------------------------------------------------- WriteObject / ReadObject

async def write_object(env: Environment, requests: Any, context: grpc.aio.ServicerContext) -> Any:
    method = "WriteObject"
    request = await first_message(requests)
    if request is None:
        raise invalid("the WriteObject stream carried no message")
    kind = request.WhichOneof("first_message")
    if kind == "upload_id":
        raise _no_upload_id(request.upload_id)
    if kind is None:
        raise invalid("the first WriteObjectRequest must carry write_object_spec")
    spec = request.write_object_spec
    if spec.HasField("appendable") and spec.appendable:
        raise invalid("appendable objects can only be written with BidiWriteObject")
    bucket, name = _target_spec(env, context, method, spec)
    target = _StagedTarget(env.store, bucket, name, spec)
    upload = _Upload(env, method, name, target)
    try:
        while True:
            upload.take(request)
            if request.finish_write:
                if await anext(requests, None) is not None:
                    raise invalid("no message may follow finish_write")
                record = await target.finish(upload.checksums)
                await env.round_trip()
                return S.WriteObjectResponse(resource=convert.object_proto(record))
            request = await anext(requests, None)
            if request is None:
                raise invalid("the WriteObject stream ended without finish_write")
            if request.WhichOneof("first_message") is not None:
                raise invalid("write_object_spec and upload_id are only allowed in the first message")
    finally:
        target.close()


async def read_object(env: Environment, request: Any, context: grpc.aio.ServicerContext) -> None:
    method = "ReadObject"
    bucket = env.resolve_object(context, method, request.bucket, request.object)
    if request.read_limit < 0:
        raise RpcError(Code.OUT_OF_RANGE, f"read_limit {request.read_limit} is negative")
    record, reader = env.store.open_reader(bucket, request.object, request.generation,
                                           convert.preconditions(request))
    try:
        size = reader.size()
        offset = request.read_offset
        if offset < 0:
            offset = max(0, size + offset)
        elif offset > size:
            raise RpcError(Code.OUT_OF_RANGE, f"read_offset {offset} is beyond the object size {size}")
        end = size if request.read_limit == 0 else min(size, offset + request.read_limit)
        meter = _StreamMeter(env.faults, "broken-read", method, request.object)
        pacer = StreamPacer(env.faults)
        await env.round_trip()
        position, first = offset, True
        while first or position < end:
            count, broken = meter.allowance(_chunk_length(position, end))
            response = S.ReadObjectResponse()
            if count:
                delay = pacer.charge(count)
                if delay:
                    await asyncio.sleep(delay)
                data, crc = _read_chunk(env, reader, method, request.object, position, count)
                response.checksummed_data.content = data
                response.checksummed_data.crc32c = crc
            if first:
                response.metadata.CopyFrom(convert.object_proto(record, size))
                response.content_range.start = offset
                response.content_range.end = end
                response.content_range.complete_length = size
                if record.finalized:
                    response.object_checksums.crc32c = record.crc32c
                    if record.md5:
                        response.object_checksums.md5_hash = record.md5
            if count or first:
                await context.write(response)
            first = False
            meter.add(count)
            position += count
            if broken:
                raise meter.broken()
    finally:
        reader.close()

