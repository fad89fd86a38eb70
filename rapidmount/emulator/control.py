"""grpc.aio handlers for ``google.storage.control.v2.StorageControl``:
the storage layout (how clients detect a zonal bucket) and HNS folders."""

from __future__ import annotations

import itertools
import time
from typing import Any

import grpc

from rapidmount.shared import wire

from . import convert
from .rpc import Environment, Impl, invalid
from .store import folder_name

C = wire.control

_LAYOUT_SUFFIX = "/storageLayout"
_FOLDERS_MARKER = "/folders/"


class ControlRpcs:
    def __init__(self, env: Environment) -> None:
        self._env = env
        self._operation_ids = itertools.count(1)

    def impls(self) -> dict[str, Impl]:
        return {
            "GetStorageLayout": self.get_storage_layout,
            "CreateFolder": self.create_folder,
            "GetFolder": self.get_folder,
            "DeleteFolder": self.delete_folder,
            "ListFolders": self.list_folders,
            "RenameFolder": self.rename_folder,
        }

    def _folder_target(self, name: str, context: grpc.aio.ServicerContext, method: str) -> tuple[str, str]:
        cut = name.find(_FOLDERS_MARKER)
        if cut < 0:
            raise invalid(f"folder name {name!r} is not of the form projects/_/buckets/BUCKET/folders/PATH")
        bucket = self._env.resolve_bucket(name[:cut], context, "name")
        folder = folder_name(name[cut + len(_FOLDERS_MARKER):], "folder path in name")
        self._env.admit(method, folder)
        return bucket, folder

    async def get_storage_layout(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env = self._env
        if not request.name.endswith(_LAYOUT_SUFFIX):
            raise invalid(f"name {request.name!r} is not of the form projects/_/buckets/BUCKET/storageLayout")
        bucket = env.resolve_bucket(request.name[:-len(_LAYOUT_SUFFIX)], context, "name")
        env.admit("GetStorageLayout")
        layout = convert.storage_layout(env.store.get_bucket(bucket))
        await env.round_trip()
        return layout

    async def create_folder(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env = self._env
        bucket = env.resolve_bucket(request.parent, context, "parent")
        if request.folder.name:
            raise invalid("folder.name must be empty: the folder path goes in folder_id")
        folder_id = folder_name(request.folder_id, "folder_id")
        env.admit("CreateFolder", folder_id)
        record = env.store.create_folder(bucket, folder_id, recursive=request.recursive)
        await env.round_trip()
        return convert.folder_proto(record)

    async def get_folder(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        bucket, folder = self._folder_target(request.name, context, "GetFolder")
        record = self._env.store.get_folder(bucket, folder, convert.preconditions(request))
        await self._env.round_trip()
        return convert.folder_proto(record)

    async def delete_folder(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        bucket, folder = self._folder_target(request.name, context, "DeleteFolder")
        self._env.store.delete_folder(bucket, folder, convert.preconditions(request))
        await self._env.round_trip()
        return wire.empty_pb2.Empty()

    async def list_folders(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        env = self._env
        bucket = env.resolve_bucket(request.parent, context, "parent")
        env.admit("ListFolders")
        listing = env.store.list_folders(
            bucket, prefix=request.prefix, delimiter=request.delimiter,
            lexicographic_start=request.lexicographic_start, lexicographic_end=request.lexicographic_end,
            page_size=request.page_size, page_token=request.page_token)
        await env.round_trip()
        return C.ListFoldersResponse(folders=[convert.folder_proto(folder) for folder in listing.folders],
                                     next_page_token=listing.next_page_token)

    async def rename_folder(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Renames atomically, so the long-running operation is already done."""
        env = self._env
        bucket, source = self._folder_target(request.name, context, "RenameFolder")
        destination = folder_name(request.destination_folder_id, "destination_folder_id")
        started = time.time()
        record = env.store.rename_folder(bucket, source, destination, convert.preconditions(request))
        finished = time.time()
        metadata = C.RenameFolderMetadata(
            common_metadata=C.CommonLongRunningOperationMetadata(
                create_time=convert.timestamp(started), end_time=convert.timestamp(finished),
                update_time=convert.timestamp(finished), type="rename-folder", progress_percent=100),
            source_folder_id=source, destination_folder_id=destination)
        operation = wire.operations_pb2.Operation(
            name=f"{wire.bucket_resource(bucket)}/operations/rename-folder-{next(self._operation_ids)}",
            done=True, metadata=wire.pack_detail(metadata), response=wire.pack_detail(convert.folder_proto(record)))
        await env.round_trip()
        return operation
