"""The storage seam over Storage v2 gRPC: :class:`GrpcStore`.

Each method is one crossing of the thread bridge: the trio caller awaits one
coroutine of ``rapidmount.client`` on the gRPC thread, which does the call
with its retries there. Readers and appenders are thin trio wrappers of the
client's stream objects, one crossing per read, append or flush.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rapidmount.bridge import GrpcBridge
from rapidmount.client import reader as _reader
from rapidmount.client.multistream import MultiStreamReader, StreamPolicy
from rapidmount.client.reader import BidiObjectReader, RangeObjectReader
from rapidmount.client.storage import StorageClient
from rapidmount.client.writer import AppendableWriter
from rapidmount.storage.counters import RpcErrorCounts, StreamEvents
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout, ListPage, ObjectMeta
from rapidmount.storage.retry import RetryPolicy
from rapidmount.storage.seam import LIST_PAGE_SIZE, ByteSource

__all__ = ["GrpcStore"]


class _Reader:
    """An :class:`~rapidmount.storage.seam.ObjectReader` over a client reader."""

    __slots__ = ("_call", "_reader", "_read")

    def __init__(self, bridge: GrpcBridge,
                 reader: BidiObjectReader | MultiStreamReader | RangeObjectReader) -> None:
        self._call = bridge.call
        self._reader = reader
        self._read = reader.read  # bound once: the hot path is one crossing and nothing else

    @property
    def idle(self) -> bool:
        return self._reader.idle

    @property
    def stream_open(self) -> bool:
        return self._reader.stream_open

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        return await self._call(self._read, offset, length)

    async def close(self) -> None:
        if self._reader.idle:
            return  # nothing on the gRPC thread to end
        try:
            await self._call(self._reader.close)
        except Exception:  # noqa: BLE001 - closing must not fail (the bridge may be down)
            pass


class _Appender:
    """An :class:`~rapidmount.storage.seam.ObjectAppender` over an :class:`AppendableWriter`."""

    __slots__ = ("_bridge", "_writer")

    def __init__(self, bridge: GrpcBridge, writer: AppendableWriter) -> None:
        self._bridge = bridge
        self._writer = writer

    @property
    def generation(self) -> int:
        return self._writer.generation  # set by create, takeover or a redirect

    @property
    def stream_open(self) -> bool:
        return self._writer.stream_open

    async def create(self, *, if_generation_match: int | None = 0,
                     metadata: Mapping[str, str] | None = None) -> ObjectMeta | None:
        return await self._bridge.call(self._writer.create, if_generation_match=if_generation_match,
                                       metadata=metadata)

    async def takeover(self, generation: int) -> int:
        return await self._bridge.call(self._writer.takeover, generation)

    async def append(self, data: bytes) -> None:
        await self._bridge.call(self._writer.append, data)

    async def flush(self) -> int:
        return await self._bridge.call(self._writer.flush)

    async def finalize(self) -> ObjectMeta:
        return await self._bridge.call(self._writer.finalize)

    async def close(self) -> None:
        await self._bridge.call(self._writer.close)

    async def abort(self) -> None:
        try:
            await self._bridge.call(self._writer.abort)
        except Exception:  # noqa: BLE001 - aborting must not fail (the bridge may be down)
            pass


class GrpcStore:
    """One bucket over Storage v2 gRPC (implements ``ObjectStore``)."""

    def __init__(self, bridge: GrpcBridge, client: StorageClient, layout: BucketLayout, *,
                 retry: RetryPolicy, stall_timeout: float, write_buffer: int, read_streams: int = 1) -> None:
        self._bridge = bridge
        self._client = client
        # One policy for every call: the client's unary calls and uploads too.
        client.retry = retry
        self._retry = retry
        self._stall_timeout = stall_timeout
        self._write_buffer = write_buffer
        # Streams per open file handle (bidi buckets), added by load; the
        # small-file and scan-ahead paths keep one stream per object.
        self._read_policy = StreamPolicy(read_streams)
        self.bucket = client.bucket
        self.layout = layout
        self.stream_events = StreamEvents()
        self.rpc_errors: RpcErrorCounts = client.rpc_errors

    # -- metadata ---------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        return await self._bridge.call(self._client.get_object, name, generation)

    async def stat_name(self, name: str) -> tuple[ObjectMeta | None, bool]:
        return await self._bridge.call(self._client.stat_name, name, hns=self.layout.folders)

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        return await self._bridge.call(
            self._client.list_page, prefix, delimiter=delimiter, page_token=page_token, page_size=page_size,
            folders_as_prefixes=self._folders_as_prefixes(delimiter), start=start, end=end,
            include_trailing_delimiter=include_trailing_delimiter)

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "") -> tuple[list[str], str]:
        return await self._bridge.call(self._client.list_folders_page, prefix, page_token=page_token,
                                      page_size=page_size, start=start, end=end)

    async def list_directory(self, prefix: str, *, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        return await self._bridge.call(self._client.list_directory, prefix,
                                      folders_as_prefixes=self._folders_as_prefixes(delimiter),
                                      delimiter=delimiter, limit=limit)

    def _folders_as_prefixes(self, delimiter: str) -> bool:
        # The service only applies it to "/"-delimited listings.
        return self.layout.folders and delimiter == "/"

    # -- changes ----------------------------------------------------------------------------------

    async def write_object(self, name: str, source: ByteSource, size: int, *, if_generation_match: int | None,
                           metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        # ``source`` runs on the gRPC thread.
        return await self._bridge.call(self._client.write_object, name, source, size,
                                      if_generation_match=if_generation_match, metadata=metadata)

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        await self._bridge.call(self._client.delete_object, name, if_generation_match=if_generation_match)

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        return await self._bridge.call(self._client.move_object, source, destination,
                                      if_source_generation_match=if_source_generation_match,
                                      if_generation_match=if_generation_match)

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        return await self._bridge.call(self._client.update_metadata, name, generation, metadata,
                                      if_metageneration_match=if_metageneration_match)

    async def create_folder(self, prefix: str) -> None:
        await self._bridge.call(self._client.create_folder, prefix)

    async def delete_folder(self, prefix: str) -> None:
        await self._bridge.call(self._client.delete_folder, prefix)

    async def rename_folder(self, source: str, destination: str) -> None:
        await self._bridge.call(self._client.rename_folder, source, destination)

    # -- data -------------------------------------------------------------------------------------

    def open_reader(self, name: str, generation: int) -> _Reader:
        options = dict(retry=self._retry, stall_timeout=self._stall_timeout, on_event=self.stream_events.on_read)
        if not self.layout.bidi_reads:
            return _Reader(self._bridge, RangeObjectReader(self._client, name, generation, **options))
        if self._read_policy.max_streams == 1:
            return _Reader(self._bridge, BidiObjectReader(self._client, name, generation, **options))
        return _Reader(self._bridge, MultiStreamReader(self._client, name, generation, policy=self._read_policy,
                                                       **options))

    def open_appender(self, name: str) -> _Appender:
        return _Appender(self._bridge, AppendableWriter(
            self._client, name, retry=self._retry, buffer_limit=self._write_buffer,
            stall_timeout=self._stall_timeout, on_event=self.stream_events.on_write))

    async def read_objects_whole(self, items: list[tuple[str, int, int]], *,
                                 concurrency: int) -> list[bytes | memoryview | StorageError]:
        return await self._bridge.call(
            _reader.read_objects_whole, self._client, items, zonal=self.layout.bidi_reads,
            concurrency=concurrency, retry=self._retry, stall_timeout=self._stall_timeout,
            on_event=self.stream_events.on_read)

    async def read_objects_composed(self, items: list[tuple[str, int, int, int | None]], *, concurrency: int,
                                    temporary_name: Callable[[], str]
                                    ) -> list[bytes | memoryview | StorageError]:
        if not self.layout.compose:
            return await self.read_objects_whole([item[:3] for item in items], concurrency=concurrency)
        return await self._bridge.call(
            _reader.read_objects_composed, self._client, items, concurrency=concurrency, retry=self._retry,
            temporary_name=temporary_name, stall_timeout=self._stall_timeout, on_event=self.stream_events.on_read)
