"""Behaviours of the real service that the emulator models and Google's
storage-testbench was found to get wrong, through the official
clients, plus the byte-level encoders of the emulator's hot paths.

Where the real service's behaviour is not documented, the emulator's choice
and its reason are in ``rapidmount/emulator/store.py`` (module docstring)
and docs/configuration.md ("Service behaviours the emulator models").
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

from rapidmount.shared import wire
from rapidmount.emulator import chunks, handles, resources
from rapidmount.emulator.store import ObjectRecord, Store
from tests.conftest import FLAT_BUCKET, HNS_BUCKET, ZONAL_BUCKET

MiB = 1 << 20
S = wire.storage


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _bucket(name: str) -> str:
    return f"projects/_/buckets/{name}"


def _control_client(endpoint: str) -> storage_control_v2.StorageControlAsyncClient:
    channel = grpc.aio.insecure_channel(endpoint)
    return storage_control_v2.StorageControlAsyncClient(transport=StorageControlGrpcAsyncIOTransport(channel=channel))


async def _read_all(client, name: str, generation: int | None = None) -> bytes:
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, name, generation)
    try:
        buffer = io.BytesIO()
        await mrd.download_ranges([(0, 0, buffer)])
        return buffer.getvalue()
    finally:
        await mrd.close()


# ---------------------------------------------------------------- MoveObject

@pytest.mark.parametrize("finalize", [True, False], ids=["finalized", "unfinalized"])
def test_move_object_written_by_appends(emulator, official_client, finalize):
    """testbench refuses this (it checks an MD5 that appends left stale); the
    service moves the object: same bytes and CRC32C, new name, new generation."""
    data = _payload(3 * MiB + 4321, 7)

    async def scenario():
        client = official_client()
        writer = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "moves/source.bin")
        await writer.open()
        await writer.append(data[:MiB])
        await writer.flush()
        await writer.append(data[MiB:])
        if finalize:
            await writer.close(finalize_on_close=True, full_object_checksum=google_crc32c.value(data))
        else:
            await writer.close()
        source = await client.grpc_client.get_object(request=_storage_v2.GetObjectRequest(
            bucket=_bucket(ZONAL_BUCKET), object_="moves/source.bin"))
        moved = await client.grpc_client.move_object(request=_storage_v2.MoveObjectRequest(
            bucket=_bucket(ZONAL_BUCKET), source_object="moves/source.bin",
            destination_object="moves/destination.bin"))
        assert moved.name == "moves/destination.bin"
        assert moved.size == len(data)
        assert moved.generation != source.generation
        if finalize:
            assert moved.checksums.crc32c == google_crc32c.value(data)
        with pytest.raises(exceptions.NotFound):
            await client.grpc_client.get_object(request=_storage_v2.GetObjectRequest(
                bucket=_bucket(ZONAL_BUCKET), object_="moves/source.bin"))
        return await _read_all(client, "moves/destination.bin")

    assert asyncio.run(scenario()) == data
    info = emulator.object_info(ZONAL_BUCKET, "moves/destination.bin")
    assert (info["size"], info["finalized"]) == (len(data), finalize)


# ---------------------------------------------------------------- RenameFolder

def test_rename_folder_moves_the_objects_beneath_and_returns_the_folder(emulator):
    bucket = _bucket(HNS_BUCKET)
    emulator.seed(HNS_BUCKET, "data/a.txt", b"a")
    emulator.seed(HNS_BUCKET, "data/sub/b.txt", b"bb")
    emulator.seed(HNS_BUCKET, "data/sub/deeper/c.txt", b"ccc")
    emulator.seed(HNS_BUCKET, "database.txt", b"not below data/")

    async def scenario():
        control = _control_client(emulator.endpoint)
        operation = await control.rename_folder(name=f"{bucket}/folders/data/", destination_folder_id="renamed/")
        raw = operation.operation
        assert raw.done and not raw.HasField("error")
        assert raw.response.type_url == "type.googleapis.com/google.storage.control.v2.Folder"
        folder = await operation.result()
        assert isinstance(folder, storage_control_v2.Folder)
        assert folder.name == f"{bucket}/folders/renamed/"
        assert operation.metadata.destination_folder_id == "renamed/"
        with pytest.raises(exceptions.NotFound):
            await control.get_folder(name=f"{bucket}/folders/data/")
        deeper = await control.get_folder(name=f"{bucket}/folders/renamed/sub/deeper/")
        return deeper.name

    assert asyncio.run(scenario()) == f"{bucket}/folders/renamed/sub/deeper/"
    assert emulator.read_object(HNS_BUCKET, "renamed/a.txt") == b"a"
    assert emulator.read_object(HNS_BUCKET, "renamed/sub/b.txt") == b"bb"
    assert emulator.read_object(HNS_BUCKET, "renamed/sub/deeper/c.txt") == b"ccc"
    for old in ("data/a.txt", "data/sub/b.txt", "data/sub/deeper/c.txt"):
        assert emulator.object_info(HNS_BUCKET, old) is None
    assert emulator.read_object(HNS_BUCKET, "database.txt") == b"not below data/"


def test_a_folders_update_time_is_set_by_its_creation_and_its_rename_only(emulator, monkeypatch):
    """What the mount shows as a directory's time: objects written, changed
    and deleted inside a folder leave its update time; a rename sets it."""
    now = [1_700_000_000.0]
    monkeypatch.setattr("rapidmount.emulator.store_index.time", type("Clock", (), {
        "time": staticmethod(lambda: now[0]), "time_ns": staticmethod(lambda: int(now[0] * 1e9))}))
    bucket = _bucket(HNS_BUCKET)

    async def scenario():
        control = _control_client(emulator.endpoint)
        made = await control.create_folder(parent=bucket, folder_id="d/")
        now[0] += 10
        emulator.seed(HNS_BUCKET, "d/f", b"x")
        emulator.seed(HNS_BUCKET, "d/", b"", metadata={"gcsfuse_mtime": "2001-02-03T04:05:06Z"})
        emulator.store.delete_object(HNS_BUCKET, "d/f")
        kept = await control.get_folder(name=f"{bucket}/folders/d/")
        now[0] += 10
        operation = await control.rename_folder(name=f"{bucket}/folders/d/", destination_folder_id="e/")
        renamed = await operation.result()
        return made, kept, renamed

    made, kept, renamed = asyncio.run(scenario())
    assert made.create_time == made.update_time and made.update_time.timestamp() == 1_700_000_000.0
    assert (kept.update_time, kept.metageneration) == (made.update_time, made.metageneration)
    assert renamed.update_time.timestamp() == 1_700_000_020.0 and renamed.create_time == made.create_time
    assert renamed.metageneration == made.metageneration + 1
    assert emulator.object_info(HNS_BUCKET, "e/")["metadata"] == {"gcsfuse_mtime": "2001-02-03T04:05:06Z"}


# ---------------------------------------------------------------- implied directories

def _list(client, bucket: str, prefix: str, folders_as_prefixes: bool = False):
    async def listing():
        pager = await client.grpc_client.list_objects(request=_storage_v2.ListObjectsRequest(
            parent=_bucket(bucket), prefix=prefix, delimiter="/",
            include_folders_as_prefixes=folders_as_prefixes))
        names, prefixes = [], []
        async for page in pager.pages:
            names.extend(o.name for o in page.objects)
            prefixes.extend(page.prefixes)
        return names, prefixes
    return listing()


def test_directory_implied_by_object_names_on_hns_buckets(emulator, official_client):
    """HNS (and zonal) buckets: writing ``implied/dir/file`` creates the
    folders ``implied/`` and ``implied/dir/``; they are real folders and
    outlive the object. No placeholder object is made."""
    emulator.seed(HNS_BUCKET, "implied/dir/file", b"x")

    async def scenario():
        client = official_client()
        control = _control_client(emulator.endpoint)
        folder = await control.get_folder(name=f"{_bucket(HNS_BUCKET)}/folders/implied/dir/")
        assert folder.name.endswith("/folders/implied/dir/")
        for placeholder in ("implied/", "implied/dir/"):
            with pytest.raises(exceptions.NotFound):
                await client.grpc_client.get_object(request=_storage_v2.GetObjectRequest(
                    bucket=_bucket(HNS_BUCKET), object_=placeholder))
        assert await _list(client, HNS_BUCKET, "implied/") == ([], ["implied/dir/"])
        await client.grpc_client.delete_object(request=_storage_v2.DeleteObjectRequest(
            bucket=_bucket(HNS_BUCKET), object_="implied/dir/file"))
        # The folder stays: a plain listing no longer shows the prefix,
        # include_folders_as_prefixes does, and GetFolder still finds it.
        assert await _list(client, HNS_BUCKET, "implied/") == ([], [])
        assert await _list(client, HNS_BUCKET, "implied/", folders_as_prefixes=True) == ([], ["implied/dir/"])
        await control.get_folder(name=f"{_bucket(HNS_BUCKET)}/folders/implied/dir/")

    asyncio.run(scenario())


def test_directory_implied_by_object_names_on_flat_buckets(emulator, official_client):
    """Flat buckets: a directory is only a common prefix of names, gone with its last object."""
    emulator.seed(FLAT_BUCKET, "implied/dir/file", b"x")

    async def scenario():
        client = official_client()
        assert await _list(client, FLAT_BUCKET, "implied/") == ([], ["implied/dir/"])
        with pytest.raises(exceptions.NotFound):
            await client.grpc_client.get_object(request=_storage_v2.GetObjectRequest(
                bucket=_bucket(FLAT_BUCKET), object_="implied/dir/"))
        await client.grpc_client.delete_object(request=_storage_v2.DeleteObjectRequest(
            bucket=_bucket(FLAT_BUCKET), object_="implied/dir/file"))
        assert await _list(client, FLAT_BUCKET, "implied/") == ([], [])
        assert await _list(client, FLAT_BUCKET, "implied/", folders_as_prefixes=True) == ([], [])

    asyncio.run(scenario())


# ---------------------------------------------------------------- idle streams

def test_many_idle_bidi_streams_never_delay_unary_calls(emulator, official_client):
    """testbench's two server threads made a GetObject wait 10 s behind idle
    streams. Here 50 open, idle streams (reads and appendable writes) leave
    unary calls answered at once; the bound is a generous deadline, not a timing."""
    emulator.seed(ZONAL_BUCKET, "idle/target", b"t" * 1024)

    async def scenario():
        client = official_client()
        readers = [await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, "idle/target")
                   for _ in range(30)]
        writers = []
        for index in range(20):
            writer = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, f"idle/writer-{index}")
            await writer.open()
            writers.append(writer)
        try:
            for _ in range(5):
                obj = await client.grpc_client.get_object(
                    request=_storage_v2.GetObjectRequest(bucket=_bucket(ZONAL_BUCKET), object_="idle/target"),
                    timeout=5.0)
                assert obj.size == 1024
            listed = await client.grpc_client.list_objects(
                request=_storage_v2.ListObjectsRequest(parent=_bucket(ZONAL_BUCKET), prefix="idle/"), timeout=5.0)
            assert len(listed.objects) == 21
            # The idle streams are still usable afterwards.
            buffer = io.BytesIO()
            await readers[-1].download_ranges([(0, 16, buffer)])
            assert buffer.getvalue() == b"t" * 16
        finally:
            for reader in readers:
                await reader.close()
            for writer in writers:
                await writer.close()

    asyncio.run(scenario())


# ---------------------------------------------------------------- overwriting an unfinalized object

def test_new_generation_over_an_unfinalized_object(emulator, official_client):
    """A new appendable object written over an unfinalized one replaces it (no
    precondition given): the old generation is gone, its writer's next append
    fails with NOT_FOUND, new opens of it fail with NOT_FOUND, and a read
    stream opened before the overwrite finishes with the bytes it pinned.
    A create-only writer (if_generation_match=0) is refused instead."""
    old_data, new_data = _payload(MiB + 5, 1), _payload(777, 2)

    async def scenario():
        client = official_client()
        old_writer = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "over/object")
        await old_writer.open()
        await old_writer.append(old_data)
        await old_writer.flush()
        old_generation = old_writer.generation
        pinned = await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, "over/object", old_generation)

        create_only = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "over/object", generation=0)
        with pytest.raises(exceptions.FailedPrecondition):
            await create_only.open()

        new_writer = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "over/object")
        await new_writer.open()
        assert new_writer.generation > old_generation
        await new_writer.append(new_data)
        await new_writer.flush()

        live = await client.grpc_client.get_object(request=_storage_v2.GetObjectRequest(
            bucket=_bucket(ZONAL_BUCKET), object_="over/object"))
        assert (live.generation, live.size) == (new_writer.generation, len(new_data))
        assert not live.finalize_time  # the new generation is unfinalized too

        with pytest.raises(exceptions.NotFound):
            await old_writer.append(b"more")
            await old_writer.flush()
        with pytest.raises(exceptions.NotFound):
            await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, "over/object", old_generation)

        buffer = io.BytesIO()
        await pinned.download_ranges([(0, len(old_data), buffer)])
        await pinned.close()
        assert buffer.getvalue() == old_data

        await new_writer.close(finalize_on_close=True)
        return await _read_all(client, "over/object")

    assert asyncio.run(scenario()) == new_data


# ---------------------------------------------------------------- hot-path encoders

def _record(**changes) -> ObjectRecord:
    fields = dict(bucket="b-bucket", name="dir/ünïcode name", generation=1_700_000_000_123_456,
                  metageneration=3, size=12345, crc32c=0xDEADBEEF, md5=b"\x01" * 16, finalized=True,
                  create_time=1_700_000_000.25, update_time=1_700_000_100.5, finalize_time=1_700_000_100.5,
                  content_type="text/plain", storage_class="RAPID", component_count=2,
                  metadata={"k": "v", "z": "1"}, writer_epoch=1, blob_id=9)
    fields.update(changes)
    return ObjectRecord(**fields)


@pytest.mark.parametrize("record", [_record(), _record(finalized=False, finalize_time=None, md5=None, metadata={},
                                                       content_type="", component_count=0, size=0)],
                         ids=["finalized", "unfinalized"])
def test_encoded_responses_equal_protobuf(record):
    resource = resources.object_bytes(record)
    assert S.Object.FromString(resource) == resources.object_message(record)
    many = [resource, resources.object_bytes(_record(name="other", size=1))]
    encoded = chunks.encode_list_objects(many, ["dir/", "é/"], "token")
    expected = S.ListObjectsResponse(objects=[S.Object.FromString(r) for r in many], prefixes=["dir/", "é/"],
                                     next_page_token="token")
    assert S.ListObjectsResponse.FromString(encoded) == expected
    assert encoded == expected.SerializeToString()
    assert chunks.encode_list_objects([], [], "") == S.ListObjectsResponse().SerializeToString()
    handle = handles.read_handle("b-bucket", record.name, record.generation)
    opened = chunks.encode_read_open(resource, handle)
    expected_open = S.BidiReadObjectResponse(metadata=S.Object.FromString(resource),
                                             read_handle=S.BidiReadHandle(handle=handle))
    assert opened == expected_open.SerializeToString()


def test_stored_resources_follow_every_change(tmp_path):
    """The cached resource bytes always describe the row: after appends,
    finalize, metadata updates, moves and folder renames."""
    store = Store(tmp_path / "data")
    try:
        store.create_bucket("zonal-b", "zonal")

        def check(name: str) -> None:
            record, resource = store.get_object_resource("zonal-b", name)
            assert S.Object.FromString(resource) == resources.object_message(record)
            listed = store.list_object_resources("zonal-b", prefix=name)
            assert listed.objects == [resource]

        record = store.create_appendable("zonal-b", "f/a")
        store.append("zonal-b", "f/a", record.generation, 1, 0, b"hello")
        check("f/a")
        store.finalize("zonal-b", "f/a", record.generation, 1)
        check("f/a")
        store.update_object("zonal-b", "f/a", metadata={"x": "y"})
        check("f/a")
        store.move_object("zonal-b", "f/a", "f/b")
        check("f/b")
        store.rename_folder("zonal-b", "f/", "g/")
        check("g/b")
        assert store.get_object("zonal-b", "g/b").size == 5
    finally:
        store.close()


def test_an_index_without_resources_gets_them_on_open(tmp_path):
    """Data directories written before resources were cached are upgraded."""
    store = Store(tmp_path / "data")
    store.create_bucket("zonal-b", "zonal")
    store.put_object("zonal-b", "a", b"abc")
    store._db.execute("UPDATE objects SET resource = NULL")
    store.close()
    reopened = Store(tmp_path / "data")
    try:
        record, resource = reopened.get_object_resource("zonal-b", "a")
        assert S.Object.FromString(resource) == resources.object_message(record)
    finally:
        reopened.close()
