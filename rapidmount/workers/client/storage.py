"""The Storage v2 client as the mount uses it (runs in the data-plane workers).

Everything here is asyncio code for grpc.aio; the FUSE process reaches it
only through a worker (:mod:`rapidmount.workers.main`). Unary calls retry transient
failures with backoff inside a deadline; streams live in ``reader.py`` and
``writer.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import grpc

from rapidmount.shared import wire
from rapidmount.storage.counters import RpcErrorCounts
from rapidmount.workers.client.errors import RetryPolicy, StorageError, code_name, describe, final_error, is_retryable
from rapidmount.storage.errors import StorageCode
from rapidmount.storage.model import (MTIME_METADATA_KEY, BucketLayout, DirectoryMeta, FolderMeta, ListPage,
                                      ObjectMeta, parse_mtime)
from rapidmount.workers.retry import RetryBudget, retry_call
from rapidmount.storage.seam import LIST_PAGE_SIZE

log = logging.getLogger("rapidmount.client")

#: What grpc turns a response's bytes into, and a request into bytes with.
Deserializer: TypeAlias = Callable[[bytes], Any]
Serializer: TypeAlias = Callable[[Any], bytes]


class _Timestamp(Protocol):
    """A ``google.protobuf.Timestamp`` (protobuf ships no types)."""

    seconds: int
    nanos: int


def _timestamp_ns(ts: _Timestamp) -> int:
    return ts.seconds * 1_000_000_000 + ts.nanos


def record_from_object(obj: wire.storage.Object) -> ObjectMeta:
    metadata = dict(obj.metadata)
    mtime_ns = _timestamp_ns(obj.update_time) or _timestamp_ns(obj.create_time)
    # gcsfuse keeps a file's POSIX mtime in object metadata; honour it so a
    # bucket shared between the two mounts shows the same times.
    if MTIME_METADATA_KEY in metadata:
        mtime_ns = parse_mtime(metadata[MTIME_METADATA_KEY]) or mtime_ns
    return ObjectMeta(
        name=obj.name,
        generation=obj.generation,
        metageneration=obj.metageneration,
        size=obj.size,
        mtime_ns=mtime_ns,
        ctime_ns=_timestamp_ns(obj.create_time) or mtime_ns,
        finalized=obj.HasField("finalize_time") and _timestamp_ns(obj.finalize_time) > 0,
        crc32c=obj.checksums.crc32c if obj.checksums.HasField("crc32c") else None,
        metadata=metadata,
    )


def record_from_folder(folder: wire.control.Folder, path: str) -> FolderMeta:
    """``folder``, whose path in its bucket is ``path`` ("a/b/")."""
    created = _timestamp_ns(folder.create_time)
    return FolderMeta(name=path, metageneration=folder.metageneration, create_time_ns=created,
                      update_time_ns=_timestamp_ns(folder.update_time) or created)


def is_child_folder(name: str, prefix: str) -> bool:
    """Whether folder ``name`` ("a/b/") lies one level below ``prefix`` ("a/", "" for the root)."""
    return name.startswith(prefix) and name.find("/", len(prefix)) == len(name) - 1 > len(prefix)


def _subject_of(request: object) -> str | None:
    """The object (or prefix, or folder) a request is about, for error logs."""
    for field in ("object", "source_object", "prefix", "folder_id"):
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            return value
        whole: str | None = getattr(value, "name", None) if field == "object" else None
        if whole:
            return whole  # UpdateObject carries the whole Object
    name = getattr(request, "name", "")
    return name.partition("/folders/")[2] or None


class StorageClient:
    """Unary Storage v2 and StorageControl calls for one bucket."""

    def __init__(self, channel: grpc.aio.Channel, bucket: str, *,
                 retry: RetryPolicy | None = None, call_timeout: float = 30.0,
                 extra_metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.channel = channel
        self.bucket = bucket
        self.bucket_resource = wire.bucket_resource(bucket)
        self.retry = retry or RetryPolicy()
        self.call_timeout = call_timeout
        self.extra_metadata = tuple(extra_metadata)
        self._callables: dict[tuple[str, Deserializer | None, Serializer | None], Any] = {}
        self.rpc_errors = RpcErrorCounts()

    # -- plumbing ---------------------------------------------------------------------------------

    def metadata(self, routing_token: str | None = None) -> tuple[tuple[str, str], ...]:
        return (wire.routing_header(self.bucket, routing_token), *self.extra_metadata)

    def rpc(self, name: str, deserializer: Deserializer | None = None, serializer: Serializer | None = None) -> Any:
        """The channel's multi-callable for an RPC (of whatever kind), built once
        (a grpc object: grpc ships no types)."""
        key = (name, deserializer, serializer)
        callable_ = self._callables.get(key)
        if callable_ is None:
            method = wire.STORAGE_METHODS.get(name) or wire.CONTROL_METHODS[name]
            callable_ = getattr(self.channel, method.kind)(
                method.path, request_serializer=serializer or method.request.SerializeToString,
                response_deserializer=deserializer or method.response.FromString)
            self._callables[key] = callable_
        return callable_

    async def unary(self, name: str, request: object, what: str, *, pinned_generation: bool = False) -> Any:
        """One unary call, retried on transient failures until the deadline; its
        response (the RPC's message: protobuf ships no types for its base).

        ``pinned_generation``: the request names one generation, so NOT_FOUND
        means another client replaced or deleted it (ESTALE).
        """
        callable_ = self.rpc(name)

        def on_error(err: BaseException) -> None:
            if isinstance(err, grpc.aio.AioRpcError):
                self.rpc_errors.add(name, err.code())

        def on_retry(err: BaseException, delay: float) -> None:
            log.debug("%s: %s, retrying in %.3fs", what, describe(err), delay,
                      extra={"object": _subject_of(request), "grpc_code": code_name(err)})

        return await retry_call(
            self.retry, lambda budget: callable_(request, metadata=self.metadata(), timeout=self.call_timeout),
            retryable=is_retryable, on_error=on_error, on_retry=on_retry,
            give_up=lambda err, late: final_error(err, what, object_name=_subject_of(request),
                                                  pinned_generation=pinned_generation, deadline_passed=late))

    # -- bucket ------------------------------------------------------------------------------------

    async def get_layout(self) -> BucketLayout:
        layout = await self.unary(
            "GetStorageLayout",
            wire.control.GetStorageLayoutRequest(name=f"{self.bucket_resource}/storageLayout"),
            f"bucket {self.bucket!r}")
        return BucketLayout(
            name=self.bucket, location=layout.location, location_type=layout.location_type,
            hierarchical_namespace=layout.hierarchical_namespace.enabled)

    async def wait_ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise StorageError("endpoint is unreachable") from None

    # -- objects -----------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        """The object's metadata, or None if it does not exist."""
        try:
            obj = await self.unary(
                "GetObject",
                wire.storage.GetObjectRequest(bucket=self.bucket_resource, object=name, generation=generation),
                f"stat {name!r}")
        except StorageError as err:
            if err.code is StorageCode.NOT_FOUND:
                return None
            raise
        return record_from_object(obj)

    def _folder_path(self, folder: wire.control.Folder) -> str | None:
        """The path in this bucket of a folder the service named (None if not in it)."""
        head = f"{self.bucket_resource}/folders/"
        return folder.name[len(head):] if folder.name.startswith(head) else None

    async def get_folder(self, prefix: str) -> FolderMeta | None:
        """On hierarchical-namespace buckets: the folder ``prefix``, or None if it does not exist."""
        try:
            folder = await self.unary(
                "GetFolder",
                wire.control.GetFolderRequest(name=f"{self.bucket_resource}/folders/{prefix}"),
                f"stat folder {prefix!r}")
        except StorageError as err:
            if err.code is StorageCode.NOT_FOUND:
                return None
            raise
        return record_from_folder(folder, prefix)

    async def folder_exists(self, prefix: str) -> bool:
        """On hierarchical-namespace buckets: does the folder ``prefix`` exist?"""
        return await self.get_folder(prefix) is not None

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, folders_as_prefixes: bool = False,
                        start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        response = await self.unary(
            "ListObjects",
            wire.storage.ListObjectsRequest(
                parent=self.bucket_resource, prefix=prefix, delimiter=delimiter,
                page_token=page_token, page_size=page_size,
                include_folders_as_prefixes=folders_as_prefixes,
                include_trailing_delimiter=include_trailing_delimiter,
                lexicographic_start=start, lexicographic_end=end),
            f"list {prefix!r}")
        return ListPage([record_from_object(o) for o in response.objects],
                        list(response.prefixes), response.next_page_token)

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "", delimiter: str = "") -> tuple[list[FolderMeta], str]:
        """One page of every folder below ``prefix`` (hierarchical namespace),
        in name order from ``start`` (inclusive) to ``end`` (exclusive); with
        ``delimiter`` "/", only those one level down: (the folders, such as
        ``"a/b/"``, next page token)."""
        response = await self.unary(
            "ListFolders",
            wire.control.ListFoldersRequest(parent=self.bucket_resource, prefix=prefix, delimiter=delimiter,
                                            page_token=page_token, page_size=page_size,
                                            lexicographic_start=start, lexicographic_end=end),
            f"list folders {prefix!r}")
        folders = []
        for folder in response.folders:
            path = self._folder_path(folder)
            if path is not None:
                folders.append(record_from_folder(folder, path))
        return folders, response.next_page_token

    async def list_child_folders(self, prefix: str) -> list[FolderMeta]:
        """Every folder one level below ``prefix`` (all pages of ``ListFolders``
        with delimiter "/"; ``prefix`` itself, if listed, is left out)."""
        children: list[FolderMeta] = []
        token = ""
        while True:
            folders, token = await self.list_folders_page(prefix, page_token=token, delimiter="/")
            children += (folder for folder in folders if is_child_folder(folder.name, prefix))
            if not token:
                return children

    async def list_directory(self, prefix: str, *, folders_as_prefixes: bool, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        """Every object and sub-prefix directly under ``prefix`` (all pages).

        Returns (objects, prefixes, complete); ``complete`` is False when
        ``limit`` entries were reached first.
        """
        objects: list[ObjectMeta] = []
        prefixes: list[str] = []
        token = ""
        while True:
            page = await self.list_page(prefix, delimiter=delimiter, page_token=token,
                                        folders_as_prefixes=folders_as_prefixes,
                                        include_trailing_delimiter=delimiter == "/")
            objects.extend(page.objects)
            prefixes.extend(page.prefixes)
            token = page.next_page_token
            if not token:
                return objects, prefixes, True
            if limit is not None and len(objects) + len(prefixes) >= limit:
                return objects, prefixes, False

    async def stat_name(self, name: str, *, hns: bool) -> tuple[ObjectMeta | None, DirectoryMeta | None]:
        """Look a name up as a file and as a directory at once (one round trip;
        on hierarchical-namespace buckets, a second one for the placeholder
        object of a directory found).

        Returns (the object ``name`` or None, directory ``name/`` or None).
        """
        dir_prefix = name + "/"
        # On hierarchical-namespace buckets every object's parent folders
        # exist, so GetFolder alone is authoritative for directories.
        dir_probe = self._folder_probe(dir_prefix) if hns else self._prefix_probe(dir_prefix)
        obj, directory = await asyncio.gather(self.get_object(name), dir_probe)
        return obj, directory

    async def _folder_probe(self, prefix: str) -> DirectoryMeta | None:
        folder = await self.get_folder(prefix)
        if folder is None:
            return None
        return DirectoryMeta(prefix, folder, await self.get_object(prefix))

    async def _prefix_probe(self, prefix: str) -> DirectoryMeta | None:
        # The placeholder, if there is one, is the first name below the prefix.
        page = await self.list_page(prefix, delimiter="/", page_size=1, include_trailing_delimiter=True)
        if not (page.objects or page.prefixes):
            return None
        return DirectoryMeta(prefix, None, next((o for o in page.objects if o.name == prefix), None))

    # -- changes -----------------------------------------------------------------------------------

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        request = wire.storage.DeleteObjectRequest(bucket=self.bucket_resource, object=name)
        if if_generation_match is not None:
            request.if_generation_match = if_generation_match
        await self.unary("DeleteObject", request, f"delete {name!r}")

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        """Rename one object; ``if_generation_match`` is the destination's (``0``: must be free)."""
        request = wire.storage.MoveObjectRequest(
            bucket=self.bucket_resource, source_object=source, destination_object=destination)
        if if_source_generation_match is not None:
            request.if_source_generation_match = if_source_generation_match
        if if_generation_match is not None:
            request.if_generation_match = if_generation_match
        return record_from_object(await self.unary("MoveObject", request, f"rename {source!r}"))

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        """Set the given custom metadata keys of ``generation``, which must still be live."""
        request = wire.storage.UpdateObjectRequest(
            object=wire.storage.Object(bucket=self.bucket_resource, name=name, generation=generation,
                                       metadata=metadata),
            if_generation_match=generation)
        if if_metageneration_match is not None:
            request.if_metageneration_match = if_metageneration_match
        request.update_mask.paths.extend(f"metadata.{key}" for key in metadata)
        return record_from_object(await self.unary("UpdateObject", request, f"update {name!r}",
                                                   pinned_generation=True))

    async def write_object(self, name: str, source: Callable[[int, int], bytes], size: int, *,
                           if_generation_match: int | None,
                           metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        """Upload a whole object with WriteObject; ``source(offset, length)`` gives its bytes.

        A retry starts the upload over: WriteObject has no resumption.
        """
        spec = wire.storage.WriteObjectSpec(
            resource=wire.storage.Object(name=name, bucket=self.bucket_resource, metadata=metadata or {}),
            object_size=size)
        if if_generation_match is not None:
            spec.if_generation_match = if_generation_match

        async def upload(budget: RetryBudget) -> ObjectMeta:
            call = self.rpc("WriteObject")(metadata=self.metadata())
            crc = 0
            offset = 0
            first = True
            while first or offset < size:
                chunk = source(offset, min(wire.MAX_CHUNK_BYTES, size - offset)) if size else b""
                crc = wire.crc32c_extend(crc, chunk)
                request = wire.storage.WriteObjectRequest(
                    write_offset=offset,
                    checksummed_data=wire.storage.ChecksummedData(content=chunk, crc32c=wire.crc32c(chunk)))
                if first:
                    request.write_object_spec.CopyFrom(spec)
                    first = False
                offset += len(chunk)
                if offset >= size:
                    request.finish_write = True
                    request.object_checksums.crc32c = crc
                await call.write(request)
                if not chunk:
                    break
            await call.done_writing()
            response = await call
            return record_from_object(response.resource)

        def on_error(err: BaseException) -> None:
            if isinstance(err, grpc.aio.AioRpcError):
                self.rpc_errors.add("WriteObject", err.code())

        return await retry_call(
            self.retry, upload, retryable=is_retryable, on_error=on_error,
            give_up=lambda err, late: final_error(err, f"upload {name!r}", object_name=name, deadline_passed=late))

    async def create_folder(self, prefix: str) -> FolderMeta:
        folder = await self.unary("CreateFolder", wire.control.CreateFolderRequest(
            parent=self.bucket_resource, folder_id=prefix), f"mkdir {prefix!r}")
        return record_from_folder(folder, prefix)

    async def delete_folder(self, prefix: str) -> None:
        await self.unary("DeleteFolder", wire.control.DeleteFolderRequest(
            name=f"{self.bucket_resource}/folders/{prefix}"), f"rmdir {prefix!r}")

    async def rename_folder(self, source: str, destination: str) -> FolderMeta | None:
        """The renamed folder, when the finished operation names it."""
        operation = await self.unary("RenameFolder", wire.control.RenameFolderRequest(
            name=f"{self.bucket_resource}/folders/{source}", destination_folder_id=destination),
            f"rename {source!r}")
        # The rename is a long-running operation; wait until the source is gone.
        deadline = asyncio.get_running_loop().time() + self.retry.deadline
        while not operation.done and await self.folder_exists(source):
            if asyncio.get_running_loop().time() > deadline:
                raise StorageError(f"rename {source!r}: the folder rename did not finish in time")
            await asyncio.sleep(0.05)
        if operation.HasField("error") and operation.error.code:
            raise StorageError(f"rename {source!r}: {operation.error.message}")
        response = operation.response
        if operation.done and response.type_url == wire.type_url(wire.control.Folder):
            return record_from_folder(wire.control.Folder.FromString(response.value), destination)
        return None

