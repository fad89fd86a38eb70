"""MemoryStore: the storage seam over the emulator's bucket model.

The model's semantics (generations, preconditions, folders, listings,
compose, appendable objects) are tested once, on the model itself, in
tests/emulator/test_store.py. Here: what MemoryStore adds between the seam
and that model, as the gRPC client and the worker do it: ObjectMeta as the
client converts the wire Object, errnos, read streams, the appender's
buffer, batch reads, fault injection, counters and the test hooks.
"""

from __future__ import annotations

import errno
import os
import tempfile

import google_crc32c
import pytest
import trio

from rapidmount.storage.errors import StorageCode, StorageError
from rapidmount.emulator.memory_store import CHUNK, MemoryStore
from rapidmount.storage.model import DirectoryMeta, ObjectMeta, format_mtime, parse_mtime
from rapidmount.storage.seam import ObjectAppender, ObjectReader, ObjectStore

Code = StorageCode


async def names_of(page) -> tuple[list[str], str]:
    """A ``list_folders_page`` answer with the folders' names."""
    folders, token = await page
    return [folder.name for folder in folders], token


def source(data: bytes) -> int | None:
    """A descriptor of an unlinked temporary file holding ``data`` (what the core uploads from)."""
    if not data:
        return None
    fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR)
    os.write(fd, data)
    _SOURCES.append(fd)
    return fd


_SOURCES: list[int] = []


async def write(store, name: str, data: bytes, if_generation_match=None, metadata=None) -> ObjectMeta:
    return await store.write_object(name, source(data), len(data), if_generation_match=if_generation_match,
                                    metadata=metadata)


async def fails(awaitable, code: StorageCode, errno_: int | None = None) -> StorageError:
    with pytest.raises(StorageError) as caught:
        await awaitable
    assert caught.value.code == code, caught.value
    if errno_ is not None:
        assert caught.value.errno == errno_, caught.value
    return caught.value


@pytest.mark.parametrize("kind, location_type, hns", [("zonal", "zone", True), ("hns", "region", True),
                                                        ("flat", "region", False)])
def test_layout_by_kind(kind, location_type, hns):
    store = MemoryStore(bucket="layout-bucket", kind=kind)
    assert isinstance(store, ObjectStore)
    assert isinstance(store.open_reader("x", 1), ObjectReader)
    assert isinstance(store.open_appender("x"), ObjectAppender)
    layout = store.layout
    assert (layout.name, layout.location_type, layout.hierarchical_namespace) == ("layout-bucket", location_type, hns)
    assert layout.zonal == (kind == "zonal") and layout.compose == (kind != "zonal")
    assert layout.folders == hns


@pytest.mark.trio
async def test_generations_preconditions_and_checksums():
    store = MemoryStore(kind="flat")
    first = await write(store, "f", b"one", if_generation_match=0)
    assert (first.size, first.metageneration, first.finalized) == (3, 1, True)
    assert first.crc32c == google_crc32c.value(b"one")
    await fails(write(store, "f", b"two", if_generation_match=0), Code.FAILED_PRECONDITION, errno.ESTALE)
    second = await write(store, "f", b"two!", if_generation_match=first.generation)
    assert second.generation > first.generation
    assert await store.get_object("f", first.generation) is None
    assert (await store.get_object("f")).size == 4
    await fails(store.delete_object("f", if_generation_match=first.generation), Code.FAILED_PRECONDITION,
                errno.ESTALE)
    await store.delete_object("f", if_generation_match=second.generation)
    await fails(store.delete_object("f"), Code.NOT_FOUND, errno.ENOENT)
    assert store.names() == []


@pytest.mark.trio
async def test_metadata_updates_and_gcsfuse_mtime():
    store = MemoryStore(kind="hns")
    meta = await write(store, "f", b"x", metadata={"a": "1"})
    assert meta.mtime_ns == meta.ctime_ns
    stamp = "2024-05-06T07:08:09.123456789Z"
    updated = await store.update_metadata("f", meta.generation, {"gcsfuse_mtime": stamp})
    assert (updated.generation, updated.metageneration) == (meta.generation, 2)
    assert dict(updated.metadata) == {"a": "1", "gcsfuse_mtime": stamp}
    assert updated.mtime_ns == parse_mtime(stamp) == 1714979289123456789
    assert parse_mtime(format_mtime(1714979289123456789)) == 1714979289123456789
    assert parse_mtime("2024-05-06T07:08:09+02:00") == parse_mtime("2024-05-06T05:08:09Z")
    assert parse_mtime("yesterday") is None
    await fails(store.update_metadata("f", meta.generation, {"b": "2"}, if_metageneration_match=1),
                Code.FAILED_PRECONDITION, errno.ESTALE)
    await write(store, "f", b"y")
    # The generation named is gone: the file changed under us.
    await fails(store.update_metadata("f", meta.generation, {"b": "2"}), Code.NOT_FOUND, errno.ESTALE)


@pytest.mark.trio
async def test_move_object():
    store = MemoryStore(kind="zonal")
    src = await write(store, "a/src", b"data")
    other = await write(store, "dst", b"other")
    await fails(store.move_object("a/src", "b/dst", if_source_generation_match=src.generation + 1),
                Code.FAILED_PRECONDITION, errno.ESTALE)
    await fails(store.move_object("a/src", "dst", if_generation_match=0), Code.FAILED_PRECONDITION)
    moved = await store.move_object("a/src", "dst", if_source_generation_match=src.generation,
                                    if_generation_match=other.generation)
    assert moved.generation > other.generation and moved.crc32c == src.crc32c
    assert store.names() == ["dst"] and store.data("dst") == b"data"
    await fails(store.move_object("a/src", "x"), Code.NOT_FOUND, errno.ENOENT)
    await fails(store.move_object("dst", "dst"), Code.INVALID_ARGUMENT)


@pytest.mark.trio
async def test_zonal_reader_streams_a_pinned_generation():
    store = MemoryStore(kind="zonal")
    first = store.put("f", b"0123456789")
    reader = store.open_reader("f", first.generation)
    assert not reader.stream_open and store.stream_events.read["open"] == 0
    assert await reader.read(2, 3) == b"234"
    assert reader.stream_open and store.stream_events.read["open"] == 1
    store.put("f", b"new")  # overwritten: the open stream still serves what it pinned
    assert await reader.read(8, 100) == b"89"
    assert await reader.read(10, 5) == b""
    await fails(store.open_reader("f", first.generation).read(0, 1), Code.NOT_FOUND, errno.ESTALE)
    await fails(reader.read(11, 1), Code.OUT_OF_RANGE, errno.EINVAL)
    assert not reader.stream_open  # the service ended that stream: the next read opens another
    await fails(reader.read(0, 1), Code.NOT_FOUND, errno.ESTALE)
    assert store.stream_events.read["open"] == 3
    await reader.close()
    assert not reader.stream_open
    await fails(reader.read(0, 1), None, errno.EBADF)


@pytest.mark.trio
async def test_zonal_reader_sees_appends_and_regional_reader_keeps_no_stream():
    store = MemoryStore(kind="zonal")
    meta = store.put("log", b"ab", appendable=True)
    reader = store.open_reader("log", meta.generation)
    assert await reader.read(0, 10) == b"ab"
    store.append_external("log", b"cd")
    assert await reader.read(0, 10) == b"abcd"

    flat = MemoryStore(kind="flat")
    meta = flat.put("f", b"abc")
    reader = flat.open_reader("f", meta.generation)
    assert await reader.read(1, 10) == b"bc" and await reader.read(9, 1) == b""  # past the end: empty
    assert not reader.stream_open and flat.stream_events.read["open"] == 0
    flat.put("f", b"xyz")
    await fails(reader.read(0, 1), Code.NOT_FOUND, errno.ESTALE)  # every read is its own call
    assert flat.rpc_errors.snapshot() == {("ReadObject", "NOT_FOUND"): 1}


@pytest.mark.trio
async def test_appender_lifecycle():
    store = MemoryStore(kind="zonal")
    writer = store.open_appender("dir/log")
    assert not writer.stream_open
    created = await writer.create(if_generation_match=0, metadata={"k": "v"})
    assert (created.size, created.finalized, created.crc32c, dict(created.metadata)) == (0, False, None, {"k": "v"})
    assert writer.stream_open and writer.generation == created.generation
    assert store.folder_names() == ["dir/"]
    await writer.append(b"hello ")
    assert store.data("dir/log") == b""  # queued until a flush (or a whole 2 MiB chunk)
    await writer.append(b"world")
    assert await writer.flush() == 11 and store.data("dir/log") == b"hello world"
    await writer.close()
    meta = store.meta("dir/log")
    assert (meta.size, meta.finalized) == (11, False) and not writer.stream_open
    for call in (writer.append(b"x"), writer.flush(), writer.finalize(), writer.takeover(meta.generation)):
        await fails(call, None, errno.EBADF)
    await writer.close()  # closing twice is harmless

    again = store.open_appender("dir/log")
    await fails(again.create(if_generation_match=0), Code.FAILED_PRECONDITION, errno.ESTALE)
    assert await again.takeover(meta.generation) == 11
    await again.append(b"!" * (CHUNK + 5))
    assert len(store.data("dir/log")) == 11 + CHUNK  # the whole chunk went out at once
    final = await again.finalize()
    assert (final.size, final.finalized, final.generation) == (11 + CHUNK + 5, True, meta.generation)
    assert final.crc32c == google_crc32c.value(b"hello world" + b"!" * (CHUNK + 5))
    await fails(again.flush(), None, errno.EBADF)
    await fails(store.open_appender("dir/log").takeover(meta.generation), Code.FAILED_PRECONDITION, errno.ESTALE)
    await store.open_appender("dir/log").abort()  # never raises, even unopened
    assert store.stream_events.write["open"] == 2


@pytest.mark.trio
async def test_takeover_fences_the_first_writer():
    store = MemoryStore(kind="zonal")
    first = store.open_appender("f")
    meta = await first.create()
    await first.append(b"abc")
    assert await first.flush() == 3
    second = store.open_appender("f")
    assert await second.takeover(meta.generation) == 3
    await fails(first.append(b"x"), Code.FAILED_PRECONDITION, errno.ESTALE)
    await fails(first.flush(), Code.FAILED_PRECONDITION, errno.ESTALE)
    assert not first.stream_open
    await second.append(b"def")
    assert await second.flush() == 6
    store.append_external("f", b"!")  # another client takes over in turn
    await fails(second.flush(), Code.FAILED_PRECONDITION, errno.ESTALE)
    store.put("f", b"replaced")
    await fails(second.append(b"x"), Code.NOT_FOUND, errno.ESTALE)
    await first.abort()


@pytest.mark.trio
@pytest.mark.parametrize("kind", ["hns", "flat"])
async def test_regional_buckets_have_no_appendable_objects(kind):
    store = MemoryStore(kind=kind)
    await fails(store.open_appender("f").create(), Code.FAILED_PRECONDITION)
    with pytest.raises(ValueError):
        store.put("f", b"", appendable=True)


@pytest.mark.trio
async def test_folder_calls():
    store = MemoryStore(kind="hns")
    await write(store, "a/b/c", b"1")
    await store.create_folder("x")  # a folder id without its trailing '/', as the client may send it
    assert store.folder_names() == ["a/", "a/b/", "x/"]
    await fails(store.create_folder("x/"), Code.ALREADY_EXISTS, errno.EEXIST)
    await fails(store.create_folder("y/z/"), Code.FAILED_PRECONDITION, errno.ESTALE)  # never recursive
    await fails(store.delete_folder("a"), Code.FAILED_PRECONDITION)  # not empty
    await fails(store.delete_folder("nope/"), Code.NOT_FOUND, errno.ENOENT)
    await fails(store.rename_folder("a/", "a/b/x/"), Code.INVALID_ARGUMENT, errno.EINVAL)
    await store.rename_folder("a", "x/a")
    assert store.names() == ["x/a/b/c"] and store.folder_names() == ["x/", "x/a/", "x/a/b/"]
    await store.delete_object("x/a/b/c")
    await store.delete_folder("x/a/b")
    found, directory = await store.stat_name("x/a")  # folders alone decide
    assert found is None and directory is not None and directory.placeholder is None
    assert directory.folder is not None and directory.folder.name == "x/a/"
    assert await store.stat_name("x/a/b") == (None, None)


@pytest.mark.trio
async def test_flat_buckets_have_no_folders():
    store = MemoryStore(kind="flat")
    await write(store, "a/b", b"1")
    assert store.folder_names() == []
    for call in (store.create_folder("a/"), store.delete_folder("a/"), store.rename_folder("a/", "c/"),
                 store.list_folders_page("")):
        await fails(call, Code.FAILED_PRECONDITION, errno.ESTALE)
    assert await store.stat_name("a") == (None, DirectoryMeta("a/"))  # implied by an object name
    assert await store.stat_name("a/b") == (store.meta("a/b"), None)
    await write(store, "a/", b"")
    assert await store.stat_name("a") == (None, DirectoryMeta("a/", None, store.meta("a/")))  # and its placeholder


@pytest.mark.trio
async def test_listing_calls():
    store = MemoryStore(kind="hns")
    for name in ("a/1", "a/b/c", "b", "c/"):
        store.put(name, b"x")
    await store.create_folder("empty/")
    page = await store.list_page("")
    assert ([o.name for o in page.objects], page.prefixes) == (["b"], ["a/", "c/", "empty/"])  # folders too
    assert isinstance(page.objects[0], ObjectMeta) and page.objects[0].size == 1
    page = await store.list_page("", include_trailing_delimiter=True)
    assert [o.name for o in page.objects] == ["b", "c/"]
    page = await store.list_page("", delimiter="", start="a/b", end="c/")
    assert [o.name for o in page.objects] == ["a/b/c", "b"]
    first = await store.list_page("", delimiter="", page_size=2)
    rest = await store.list_page("", delimiter="", page_token=first.next_page_token)
    assert [o.name for o in first.objects + rest.objects] == ["a/1", "a/b/c", "b", "c/"]
    await fails(store.list_page("", page_token="garbage"), Code.INVALID_ARGUMENT, errno.EINVAL)
    objects, prefixes, complete = await store.list_directory("", delimiter="")
    assert ([o.name for o in objects], prefixes, complete) == (["a/1", "a/b/c", "b", "c/"], [], True)
    assert await names_of(store.list_folders_page("")) == (["a/", "a/b/", "c/", "empty/"], "")
    folders, token = await names_of(store.list_folders_page("a/", page_size=1))
    assert folders == ["a/"] and await names_of(store.list_folders_page("a/", page_token=token)) == (["a/b/"], "")
    assert await names_of(store.list_folders_page("", start="b", end="empty/")) == (["c/"], "")
    assert [folder.name for folder in await store.list_child_folders("")] == ["a/", "c/", "empty/"]
    assert [folder.name for folder in await store.list_child_folders("a/")] == ["a/b/"]
    flat = MemoryStore(kind="flat")
    flat.put("a/1", b"")
    assert (await flat.list_page("")).prefixes == ["a/"]


@pytest.mark.trio
async def test_list_directory_limit():
    store = MemoryStore(kind="flat")
    for index in range(1500):
        store.put(f"d/{index:05}", b"")
    objects, _, complete = await store.list_directory("d/", limit=10)
    assert (len(objects), complete) == (1000, False)
    objects, _, complete = await store.list_directory("d/")
    assert (len(objects), complete) == (1500, True)


@pytest.mark.trio
async def test_fail_next_hooks_calls_and_counters():
    store = MemoryStore(kind="zonal")
    meta = store.put("a", b"abc")
    store.fail_next("get_object", Code.UNAVAILABLE, times=2, match=lambda name: name == "a")
    assert await store.get_object("b") is None  # not matched: untouched
    await fails(store.get_object("a"), Code.UNAVAILABLE, errno.EIO)
    await fails(store.get_object("a"), Code.UNAVAILABLE)
    assert (await store.get_object("a")).size == 3
    store.fail_next("write_object", Code.PERMISSION_DENIED)
    await fails(write(store, "c", b"x"), Code.PERMISSION_DENIED, errno.EACCES)
    assert store.names() == ["a"]  # the failed call did nothing
    assert store.calls["write_object"] == 1 and store.calls["get_object"] == 4

    reader = store.open_reader("a", meta.generation)
    assert await reader.read(0, 1) == b"a" and reader.stream_open
    store.fail_next("reader.read", Code.NOT_FOUND)
    await fails(reader.read(0, 1), Code.NOT_FOUND, errno.ESTALE)
    assert not reader.stream_open  # a failure ends the stream
    assert await reader.read(0, 3) == b"abc" and store.stream_events.read["open"] == 2
    writer = store.open_appender("log")
    store.fail_next("appender.create", Code.UNAVAILABLE)
    await fails(writer.create(), Code.UNAVAILABLE, errno.EIO)
    await writer.create()
    for op in ("append", "flush", "finalize", "close"):
        store.fail_next(f"appender.{op}", Code.DEADLINE_EXCEEDED)
    await fails(writer.append(b"x"), Code.DEADLINE_EXCEEDED)
    assert not writer.stream_open
    await writer.append(b"y")
    assert writer.stream_open and store.stream_events.write["open"] == 2
    await fails(writer.flush(), Code.DEADLINE_EXCEEDED)
    await fails(writer.finalize(), Code.DEADLINE_EXCEEDED)
    await fails(writer.close(), Code.DEADLINE_EXCEEDED)
    await fails(writer.flush(), None, errno.EBADF)  # a failed close still ends the writer
    assert store.rpc_errors.snapshot() == {
        ("GetObject", "UNAVAILABLE"): 2, ("GetObject", "NOT_FOUND"): 1, ("WriteObject", "PERMISSION_DENIED"): 1,
        ("BidiReadObject", "NOT_FOUND"): 1, ("BidiWriteObject", "UNAVAILABLE"): 1,
        ("BidiWriteObject", "DEADLINE_EXCEEDED"): 4}
    with pytest.raises(ValueError):
        store.fail_next("upload", Code.INTERNAL)
    store.fail_next("delete_object", Code.INTERNAL)
    store.clear_faults()
    await store.delete_object("a")


@pytest.mark.trio
async def test_read_objects_whole():
    store = MemoryStore(kind="zonal")
    a, b = store.put("a", b"aaaa"), store.put("b", b"bb")
    store.put("b", b"changed")
    store.fail_next("read_objects_whole", Code.UNAVAILABLE, match=lambda name: name == "c")
    c = store.put("c", b"c")
    answers = await store.read_objects_whole([("a", a.generation, 2), ("b", b.generation, 2), ("c", c.generation, 1),
                                              ("c", c.generation, 1)], concurrency=4)
    assert answers[0] == b"aa" and answers[3] == b"c"
    assert (answers[1].code, answers[1].errno) == (Code.NOT_FOUND, errno.ESTALE)
    assert (answers[2].code, answers[2].errno) == (Code.UNAVAILABLE, errno.EIO)
    assert store.stream_events.read["open"] == 4 and store.calls["read_objects_whole"] == 1


@pytest.mark.trio
async def test_read_objects_composed():
    names = iter(f".rapidmount-compose/{i}" for i in range(100))
    zonal = MemoryStore(kind="zonal")
    metas = [zonal.put(f"f{i}", bytes([i]) * i) for i in range(40)]
    items = [(m.name, m.generation, m.size, m.crc32c) for m in metas]
    answers = await zonal.read_objects_composed(items, concurrency=2, temporary_name=lambda: next(names))
    assert [bytes(a) for a in answers] == [bytes([i]) * i for i in range(40)]
    # Refused on zonal buckets (two groups of at most 32), then read whole.
    assert zonal.rpc_errors.snapshot() == {("ComposeObject", "FAILED_PRECONDITION"): 2}

    hns = MemoryStore(kind="hns")
    metas = [hns.put(f"f{i}", b"x" * i) for i in range(3)]
    hns.put("f1", b"new")
    items = [(m.name, m.generation, m.size, m.crc32c) for m in metas]
    items[2] = (*items[2][:3], 12345)  # a wrong CRC32C: that part is read again alone
    answers = await hns.read_objects_composed(items, concurrency=1, temporary_name=lambda: next(names))
    assert answers[0] == b"" and answers[2] == b"xx" and answers[1].errno == errno.ESTALE
    assert hns.folder_names() == []  # the failed compose made no temporary object
    answers = await hns.read_objects_composed([items[0], items[2][:3] + (None,)], concurrency=1,
                                              temporary_name=lambda: next(names))
    assert answers == [b"", b"xx"] and hns.folder_names() == [".rapidmount-compose/"]
    assert hns.names() == ["f0", "f1", "f2"]


@pytest.mark.trio
async def test_calls_are_atomic_and_interleave():
    store = MemoryStore(kind="flat")
    outcomes = []

    async def create(data):
        try:
            outcomes.append(await write(store, "f", data, if_generation_match=0))
        except StorageError as err:
            outcomes.append(err.errno)

    async with trio.open_nursery() as nursery:
        for index in range(5):
            nursery.start_soon(create, bytes([index]))
    assert sorted(o for o in outcomes if isinstance(o, int)) == [errno.ESTALE] * 4
    with trio.CancelScope() as scope:
        scope.cancel()
        await write(store, "g", b"never")  # cancelled at its checkpoint, before any effect
    assert store.names() == ["f"]
