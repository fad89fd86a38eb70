"""grpc.aio handlers for ``google.storage.v2.Storage`` (unary RPCs here,
streams in ``read_streams`` and ``write_streams``) and the registration of
both services."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from rapidmount.shared import wire

from . import chunks, control, convert, read_streams, write_streams
from .rpc import Code, Environment, Impl, RpcError, generic_handler, invalid

S = wire.storage

_UPDATABLE = "metadata, metadata.KEY, content_type, *"


class StorageRpcs:
    def __init__(self, env: Environment) -> None:
        self._env = env

    def impls(self) -> dict[str, Impl]:
        env = self._env
        return {
            "GetBucket": self.get_bucket,
            "GetObject": self.get_object,
            "DeleteObject": self.delete_object,
            "UpdateObject": self.update_object,
            "MoveObject": self.move_object,
            "ComposeObject": self.compose_object,
            "ListObjects": self.list_objects,
            "ReadObject": lambda request, context: read_streams.read_object(env, request, context),
            "WriteObject": lambda requests, context: write_streams.write_object(env, requests, context),
            "BidiReadObject": lambda requests, context: read_streams.BidiReadSession(env, context).run(requests),
            "BidiWriteObject": lambda requests, context: write_streams.BidiWriteSession(env, context).run(requests),
        }

    def _object_target(self, request: Any, context: grpc.aio.ServicerContext, method: str) -> str:
        return self._env.resolve_object(context, method, request.bucket, request.object)

    async def get_bucket(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env = self._env
        name = env.resolve_bucket(request.name, context, "name")
        env.admit("GetBucket")
        bucket = env.store.get_bucket(name)
        # Bucket metadata never changes here: its metageneration is always 1.
        if request.HasField("if_metageneration_match") and request.if_metageneration_match != 1:
            raise RpcError(Code.FAILED_PRECONDITION, f"if_metageneration_match={request.if_metageneration_match} "
                                                     "but the bucket metageneration is 1")
        if request.HasField("if_metageneration_not_match") and request.if_metageneration_not_match == 1:
            raise RpcError(Code.FAILED_PRECONDITION, "if_metageneration_not_match=1 matched")
        await env.round_trip()
        return convert.bucket_proto(bucket)

    async def get_object(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        bucket = self._object_target(request, context, "GetObject")
        if request.HasField("soft_deleted") and request.soft_deleted:
            raise RpcError(Code.NOT_FOUND, "this emulator keeps no soft-deleted objects")
        _, resource = self._env.store.get_object_resource(bucket, request.object, request.generation,
                                                          convert.preconditions(request))
        await self._env.round_trip()
        return resource  # the serialized Object the store keeps

    async def delete_object(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        bucket = self._object_target(request, context, "DeleteObject")
        self._env.store.delete_object(bucket, request.object, request.generation,
                                      convert.preconditions(request))
        await self._env.round_trip()
        return wire.empty_pb2.Empty()

    async def update_object(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env, obj = self._env, request.object
        bucket = env.resolve_object(context, "UpdateObject", obj.bucket, obj.name, "object.", "name")
        paths = list(request.update_mask.paths)
        if not paths:
            raise invalid(f"update_mask is required (supported paths: {_UPDATABLE})")
        metadata: dict[str, str] | None = None
        patch: dict[str, str | None] = {}
        content_type: str | None = None
        for path in paths:
            if path in ("*", "metadata"):
                metadata = dict(obj.metadata)
            if path in ("*", "content_type"):
                content_type = obj.content_type
            if path.startswith("metadata.") and len(path) > len("metadata."):
                key = path[len("metadata."):]
                patch[key] = obj.metadata[key] if key in obj.metadata else None
            elif path not in ("*", "metadata", "content_type"):
                raise invalid(f"update_mask path {path!r} is not supported by rapidmount-emulator "
                              f"(supported: {_UPDATABLE})")
        record = env.store.update_object(bucket, obj.name, obj.generation, convert.preconditions(request),
                                         metadata=metadata, metadata_patch=patch, content_type=content_type)
        await env.round_trip()
        return convert.object_proto(record)

    async def move_object(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env = self._env
        bucket = env.resolve_bucket(request.bucket, context)
        if not request.source_object or not request.destination_object:
            raise invalid("source_object and destination_object are required")
        env.admit("MoveObject", request.source_object)
        record = env.store.move_object(
            bucket, request.source_object, request.destination_object,
            source_preconditions=convert.preconditions(request, "source_"),
            destination_preconditions=convert.preconditions(request))
        await env.round_trip()
        return convert.object_proto(record)

    async def compose_object(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env, destination = self._env, request.destination
        bucket = env.resolve_object(context, "ComposeObject", destination.bucket, destination.name,
                                    "destination.", "name")
        sources = []
        for source in request.source_objects:
            if not source.name:
                raise invalid("every source object needs a name")
            condition = source.object_preconditions
            sources.append((source.name, source.generation,
                            condition.if_generation_match if condition.HasField("if_generation_match") else None))
        checksums = request.object_checksums
        # In a worker thread: composing copies and checksums every source.
        record = await asyncio.to_thread(
            env.store.compose, bucket, destination.name, sources, convert.preconditions(request),
            metadata=dict(destination.metadata), content_type=destination.content_type,
            expected_crc32c=checksums.crc32c if checksums.HasField("crc32c") else None)
        if request.HasField("delete_source_objects") and request.delete_source_objects:
            for name in {name for name, _, _ in sources} - {destination.name}:
                env.store.delete_object(bucket, name)
        await env.round_trip()
        return convert.object_proto(record)

    async def list_objects(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env = self._env
        bucket = env.resolve_bucket(request.parent, context, "parent")
        env.admit("ListObjects")
        if request.match_glob or request.filter:
            raise RpcError(Code.UNIMPLEMENTED, "match_glob and filter are not supported by rapidmount-emulator")
        response = b""  # an empty ListObjectsResponse
        if not request.soft_deleted:  # no soft-deleted objects are kept: that listing is empty
            listing = env.store.list_object_resources(
                bucket, prefix=request.prefix, delimiter=request.delimiter,
                include_trailing_delimiter=request.include_trailing_delimiter,
                lexicographic_start=request.lexicographic_start, lexicographic_end=request.lexicographic_end,
                page_size=request.page_size, page_token=request.page_token,
                include_folders_as_prefixes=request.include_folders_as_prefixes)
            # Serialized from the stored resources: no Object message is built.
            response = chunks.encode_list_objects(listing.objects, listing.prefixes, listing.next_page_token)
        await env.round_trip()
        return response


def build_handlers(env: Environment) -> list[grpc.GenericRpcHandler]:
    return [
        generic_handler(wire.STORAGE_SERVICE, wire.STORAGE_METHODS, StorageRpcs(env).impls(), env),
        generic_handler(wire.CONTROL_SERVICE, wire.CONTROL_METHODS, control.ControlRpcs(env).impls(), env),
    ]

