"""The write streams: BidiWriteObject and WriteObject.

BidiWriteObject persists each data message as it arrives and answers only
state_lookup, finish_write, the open and the half-close, which is what the
official client waits for. WriteObject is a one-shot upload that answers
once, after finish_write. Their bytes go to a target in ``write_targets``.
"""

from __future__ import annotations

from typing import Any

import grpc

from rapidmount.shared import wire

from . import convert, handles
from .rpc import Code, Environment, RpcError, first_message, invalid
from .store_errors import StoreError
from .stream_faults import presented_token
from .write_targets import AppendTarget, StagedTarget, Upload

S = wire.storage


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
        self._upload: Upload | None = None
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

    async def _open(self, first: Any) -> Upload:
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
                target: AppendTarget | StagedTarget = AppendTarget(env.store, record)
            else:
                target = StagedTarget(env.store, bucket, name, spec)
        else:
            spec = first.append_object_spec
            bucket = env.resolve_object(context, self.METHOD, spec.bucket, spec.object, "append_object_spec.")
            name = spec.object
            if spec.generation <= 0:
                raise invalid("append_object_spec.generation is required")
            self._check_pending_redirect(bucket, name, presented_token(env, context, spec))
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
            target = AppendTarget(env.store, record)
        upload = Upload(env, self.METHOD, name, target)
        try:
            token = env.faults.claim_redirect("write", self.METHOD, bucket, name)
            if token:
                raise self._redirect(token, target)
            if isinstance(target, AppendTarget):
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
            target = AppendTarget(self._env.store, live) if live and not live.finalized else None
            raise self._redirect(token, target)

    @staticmethod
    def _redirect(token: str, target: AppendTarget | StagedTarget | None) -> RpcError:
        error = S.BidiWriteObjectRedirectedError(routing_token=token)
        if isinstance(target, AppendTarget):
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


# ---------------------------------------------------------------- WriteObject

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
    target = StagedTarget(env.store, bucket, name, spec)
    upload = Upload(env, method, name, target)
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
