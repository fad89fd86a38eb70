"""Google's official clients against the emulator, as they would talk to GCS.

google-cloud-storage's AsyncGrpcClient / AsyncAppendableObjectWriter /
AsyncMultiRangeDownloader and GAPIC StorageAsyncClient, and
google-cloud-storage-control's StorageControlAsyncClient. Each scenario runs
on its own asyncio loop (``asyncio.run``); the emulator has its own thread.
"""

from __future__ import annotations

import asyncio
import io
import random

import google_crc32c
import grpc
import pytest
from google.api_core import exceptions
from google.cloud import _storage_v2
from google.cloud import storage_control_v2
from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter
from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader
from google.cloud.storage_control_v2.services.storage_control.transports.grpc_asyncio import (
    StorageControlGrpcAsyncIOTransport,
)

from tests.conftest import FLAT_BUCKET, HNS_BUCKET, ZONAL_BUCKET

MiB = 1 << 20


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def _download(mrd: AsyncMultiRangeDownloader, ranges: list[tuple[int, int]]) -> list[bytes]:
    buffers = [io.BytesIO() for _ in ranges]
    await mrd.download_ranges([(offset, length, buffer) for (offset, length), buffer in zip(ranges, buffers)])
    return [buffer.getvalue() for buffer in buffers]


def test_appendable_object_lifecycle(emulator, official_client):
    """Create, append 5 MiB+, flush, close unfinalized; multi-range read; read
    again after more appends; takeover, append, finalize with a full CRC32C."""
    first_part = _payload(5 * MiB + 123_457, 1)
    second_part = _payload(700_001, 2)
    third_part = _payload(3 * MiB + 5, 3)
    whole = first_part + second_part + third_part

    async def scenario():
        client = official_client()
        writer = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "life/object.bin")
        await writer.open()
        generation = writer.generation
        assert generation
        await writer.append(first_part)
        assert await writer.flush() == len(first_part)
        assert await writer.close() == len(first_part)
        info = emulator.object_info(ZONAL_BUCKET, "life/object.bin")
        assert info["finalized"] is False and info["size"] == len(first_part)

        mrd = await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, "life/object.bin")
        assert mrd.persisted_size == len(first_part) and not mrd.is_finalized
        head, middle, everything = await _download(mrd, [(0, 100), (4 * MiB, 1024), (0, 0)])
        assert head == first_part[:100]
        assert middle == first_part[4 * MiB:4 * MiB + 1024]
        assert everything == first_part

        # A takeover writer appends; the reader's open stream sees the new bytes.
        takeover = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "life/object.bin", generation=generation)
        await takeover.open()
        assert takeover.persisted_size == len(first_part)
        await takeover.append(second_part)
        assert await takeover.flush() == len(first_part) + len(second_part)
        (tail,) = await _download(mrd, [(len(first_part), 0)])
        assert tail == second_part

        await takeover.append(third_part)
        resource = await takeover.close(finalize_on_close=True,
                                        full_object_checksum=google_crc32c.value(whole))
        assert resource.size == len(whole)
        assert resource.finalize_time
        await mrd.close()

        fresh = await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, "life/object.bin")
        (again,) = await _download(fresh, [(0, 0)])
        assert again == whole
        await fresh.close()

    asyncio.run(scenario())
    info = emulator.object_info(ZONAL_BUCKET, "life/object.bin")
    assert info["finalized"] is True and info["size"] == len(whole)
    assert info["crc32c"] == google_crc32c.value(whole)
    assert emulator.read_object(ZONAL_BUCKET, "life/object.bin") == whole


def test_finalize_with_a_wrong_checksum_is_refused(emulator, official_client):
    data = _payload(10_000, 4)

    async def scenario():
        writer = AsyncAppendableObjectWriter(official_client(), ZONAL_BUCKET, "bad-crc")
        await writer.open()
        await writer.append(data)
        with pytest.raises(exceptions.InvalidArgument):
            await writer.close(finalize_on_close=True, full_object_checksum=google_crc32c.value(data) ^ 1)

    asyncio.run(scenario())
    assert emulator.object_info(ZONAL_BUCKET, "bad-crc")["finalized"] is False


def test_takeover_fences_the_previous_writer(emulator, official_client):
    async def scenario():
        client = official_client()
        first = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "fenced")
        await first.open()
        await first.append(b"one")
        await first.flush()
        second = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "fenced", generation=first.generation)
        await second.open()
        await second.append(b"two")
        await second.flush()
        await first.append(b"late")
        with pytest.raises(exceptions.FailedPrecondition):
            await first.flush()
        await second.close()

    asyncio.run(scenario())
    assert emulator.read_object(ZONAL_BUCKET, "fenced") == b"onetwo"


def test_read_redirect_is_retried_with_the_routing_token(emulator, official_client):
    data = _payload(3 * MiB, 5)
    emulator.seed(ZONAL_BUCKET, "redirected-read", data)
    emulator.add_fault("redirect-read:token=read-here")
    emulator.reset_rpc_counts()

    async def scenario():
        mrd = await AsyncMultiRangeDownloader.create_mrd(official_client(), ZONAL_BUCKET, "redirected-read")
        (got,) = await _download(mrd, [(0, 0)])
        await mrd.close()
        return got

    assert asyncio.run(scenario()) == data
    assert emulator.rpc_counts["BidiReadObject"] == 2  # the redirected open, then the retry


def test_write_redirect_is_retried_with_handle_and_generation(emulator, official_client):
    data = _payload(4 * MiB + 9, 6)
    emulator.add_fault("redirect-write")
    emulator.reset_rpc_counts()

    async def scenario():
        writer = AsyncAppendableObjectWriter(official_client(), ZONAL_BUCKET, "redirected-write")
        await writer.open()
        await writer.append(data)
        await writer.close(finalize_on_close=True, full_object_checksum=google_crc32c.value(data))

    asyncio.run(scenario())
    assert emulator.rpc_counts["BidiWriteObject"] >= 2
    assert emulator.read_object(ZONAL_BUCKET, "redirected-write") == data


def test_broken_read_stream_is_resumed(emulator, official_client):
    data = _payload(5 * MiB + 77, 7)
    emulator.seed(ZONAL_BUCKET, "broken-read", data)
    emulator.add_fault("broken-read:after=524288")
    emulator.reset_rpc_counts()

    async def scenario():
        mrd = await AsyncMultiRangeDownloader.create_mrd(official_client(), ZONAL_BUCKET, "broken-read")
        got = await _download(mrd, [(0, 0), (MiB, 1000)])
        await mrd.close()
        return got

    everything, piece = asyncio.run(scenario())
    assert everything == data
    assert piece == data[MiB:MiB + 1000]
    assert emulator.rpc_counts["BidiReadObject"] == 2  # broken after 512 KiB, resumed once


def test_broken_write_stream_is_resumed(emulator, official_client):
    # The break lands inside a chunk whose flush the writer waits for, so the
    # writer sees it and resends from the persisted size.
    data = _payload(6 * MiB, 8)
    emulator.add_fault("broken-write:after=3000000")

    async def scenario():
        writer = AsyncAppendableObjectWriter(official_client(), ZONAL_BUCKET, "broken-write",
                                             writer_options={"FLUSH_INTERVAL_BYTES": 2 * MiB})
        await writer.open()
        await writer.append(data)
        await writer.close(finalize_on_close=True, full_object_checksum=google_crc32c.value(data))

    asyncio.run(scenario())
    assert emulator.read_object(ZONAL_BUCKET, "broken-write") == data


def test_appending_to_a_finalized_object_fails(emulator, official_client):
    generation = emulator.seed(ZONAL_BUCKET, "final", b"done")

    async def scenario():
        writer = AsyncAppendableObjectWriter(official_client(), ZONAL_BUCKET, "final", generation=generation)
        with pytest.raises(exceptions.FailedPrecondition):
            await writer.open()

    asyncio.run(scenario())


def test_create_only_writer_fails_when_the_object_exists(emulator, official_client):
    emulator.seed(ZONAL_BUCKET, "exists", b"x")

    async def scenario():
        writer = AsyncAppendableObjectWriter(official_client(), ZONAL_BUCKET, "exists", generation=0)
        with pytest.raises(exceptions.FailedPrecondition):
            await writer.open()

    asyncio.run(scenario())


def test_appendable_writes_need_a_zonal_bucket(emulator, official_client):
    async def scenario():
        writer = AsyncAppendableObjectWriter(official_client(), FLAT_BUCKET, "nope")
        with pytest.raises(exceptions.FailedPrecondition):
            await writer.open()

    asyncio.run(scenario())


def test_gapic_get_object_and_list_objects_with_delimiter(emulator, official_client):
    for index in range(25):
        emulator.seed(ZONAL_BUCKET, f"list/file-{index:02d}", b"%d" % index)
    for directory in ("list/sub-a/", "list/sub-b/"):
        emulator.seed(ZONAL_BUCKET, directory + "inner", b"inner")
    emulator.seed(ZONAL_BUCKET, "other/file", b"other")
    generation = emulator.seed(ZONAL_BUCKET, "list/file-07", b"seven", metadata={"k": "v"})

    async def scenario():
        client = official_client()
        obj = await client.grpc_client.get_object(
            request=_storage_v2.GetObjectRequest(bucket=f"projects/_/buckets/{ZONAL_BUCKET}", object_="list/file-07"))
        assert (obj.name, obj.size, obj.generation, dict(obj.metadata)) == ("list/file-07", 5, generation, {"k": "v"})
        assert obj.checksums.crc32c == google_crc32c.value(b"seven")
        assert obj.storage_class == "RAPID"

        helper = await client.get_object(ZONAL_BUCKET, "list/file-07")
        assert helper.generation == generation
        with pytest.raises(exceptions.NotFound):
            await client.get_object(ZONAL_BUCKET, "list/missing")

        pager = await client.grpc_client.list_objects(request=_storage_v2.ListObjectsRequest(
            parent=f"projects/_/buckets/{ZONAL_BUCKET}", prefix="list/", delimiter="/", page_size=10))
        names, prefixes, pages = [], [], 0
        async for page in pager.pages:
            pages += 1
            assert len(page.objects) + len(page.prefixes) <= 10
            names.extend(o.name for o in page.objects)
            prefixes.extend(page.prefixes)
        assert names == [f"list/file-{index:02d}" for index in range(25)]
        assert prefixes == ["list/sub-a/", "list/sub-b/"]
        assert pages == 3

    asyncio.run(scenario())


def _control_client(endpoint: str) -> storage_control_v2.StorageControlAsyncClient:
    channel = grpc.aio.insecure_channel(endpoint)
    return storage_control_v2.StorageControlAsyncClient(transport=StorageControlGrpcAsyncIOTransport(channel=channel))


def test_storage_control_layout_and_folders(emulator):
    emulator.seed(HNS_BUCKET, "docs/a/one.txt", b"1")
    emulator.seed(HNS_BUCKET, "docs/a/deeper/two.txt", b"22")
    emulator.seed(HNS_BUCKET, "docs/a/", b"")
    bucket = f"projects/_/buckets/{HNS_BUCKET}"

    async def scenario():
        control = _control_client(emulator.endpoint)
        layouts = {}
        for name in (ZONAL_BUCKET, HNS_BUCKET, FLAT_BUCKET):
            layout = await control.get_storage_layout(name=f"projects/_/buckets/{name}/storageLayout")
            layouts[name] = (layout.location_type, layout.hierarchical_namespace.enabled)
        assert layouts == {ZONAL_BUCKET: ("zone", True), HNS_BUCKET: ("region", True),
                           FLAT_BUCKET: ("region", False)}

        created = await control.create_folder(parent=bucket, folder_id="empty/", folder=storage_control_v2.Folder())
        assert created.name == f"{bucket}/folders/empty/"
        with pytest.raises(exceptions.AlreadyExists):
            await control.create_folder(parent=bucket, folder_id="empty/", folder=storage_control_v2.Folder())
        await control.create_folder(request=storage_control_v2.CreateFolderRequest(
            parent=bucket, folder_id="x/y/z/", recursive=True))

        got = await control.get_folder(name=f"{bucket}/folders/docs/a/deeper/")
        assert got.name == f"{bucket}/folders/docs/a/deeper/"

        operation = await control.rename_folder(name=f"{bucket}/folders/docs/a/", destination_folder_id="docs/b/")
        renamed = await operation.result()
        assert renamed.name == f"{bucket}/folders/docs/b/"
        metadata = operation.metadata
        assert (metadata.source_folder_id, metadata.destination_folder_id) == ("docs/a/", "docs/b/")

        with pytest.raises(exceptions.FailedPrecondition):
            await control.delete_folder(name=f"{bucket}/folders/docs/b/")
        await control.delete_folder(name=f"{bucket}/folders/empty/")
        with pytest.raises(exceptions.NotFound):
            await control.get_folder(name=f"{bucket}/folders/empty/")

        pager = await control.list_folders(request=storage_control_v2.ListFoldersRequest(parent=bucket))
        return [folder.name.removeprefix(f"{bucket}/folders/") async for folder in pager]

    folders = asyncio.run(scenario())
    assert folders == ["docs/", "docs/b/", "docs/b/deeper/", "x/", "x/y/", "x/y/z/"]
    assert emulator.object_info(HNS_BUCKET, "docs/a/one.txt") is None
    assert emulator.read_object(HNS_BUCKET, "docs/b/one.txt") == b"1"
    assert emulator.read_object(HNS_BUCKET, "docs/b/deeper/two.txt") == b"22"
    assert emulator.read_object(HNS_BUCKET, "docs/b/") == b""


def test_storage_control_folders_fail_on_a_flat_bucket(emulator):
    async def scenario():
        control = _control_client(emulator.endpoint)
        with pytest.raises(exceptions.FailedPrecondition):
            await control.create_folder(parent=f"projects/_/buckets/{FLAT_BUCKET}", folder_id="a/")
        with pytest.raises(exceptions.FailedPrecondition):
            await control.list_folders(parent=f"projects/_/buckets/{FLAT_BUCKET}")

    asyncio.run(scenario())
