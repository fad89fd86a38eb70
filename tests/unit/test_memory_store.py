"""MemoryStore: the in-memory ObjectStore, and its conformance with the emulator.

The conformance half runs the same scenarios against MemoryStore and against
the emulator's own store (``rapidmount.emulator.store.Store``, driven in
process, records converted the way the gRPC client converts them), and
requires the same observations: sizes, flags, checksums, metadata, listings,
error codes, and generations up to renaming.
"""

from __future__ import annotations

import os
import tempfile

import errno

import google_crc32c
import grpc
import pytest
import trio

from rapidmount.storage.model import format_mtime, parse_mtime
from rapidmount.client.storage import record_from_object
from rapidmount.emulator import convert
from rapidmount.emulator import store as emu
from rapidmount.storage.errors import StorageError, errno_for
from rapidmount.storage.memory import CHUNK, MemoryStore
from rapidmount.storage.model import ListPage, ObjectMeta
from rapidmount.storage.seam import ObjectAppender, ObjectReader, ObjectStore

Code = grpc.StatusCode
KINDS = ["zonal", "hns", "flat"]


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


async def fails(awaitable, code: grpc.StatusCode, errno_: int | None = None) -> StorageError:
    with pytest.raises(StorageError) as caught:
        await awaitable
    assert caught.value.code == code, caught.value
    if errno_ is not None:
        assert caught.value.errno == errno_, caught.value
    return caught.value


# ================================================================ MemoryStore alone

@pytest.mark.parametrize("kind, location_type, hns", [("zonal", "zone", True), ("hns", "region", True),
                                                        ("flat", "region", False)])
def test_layout_by_kind(kind, location_type, hns):
    store = MemoryStore(bucket="b", kind=kind)
    assert isinstance(store, ObjectStore)
    assert isinstance(store.open_reader("x", 1), ObjectReader)
    assert isinstance(store.open_appender("x"), ObjectAppender)
    layout = store.layout
    assert (layout.name, layout.location_type, layout.hierarchical_namespace) == ("b", location_type, hns)
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
    assert reader.idle and not reader.stream_open
    assert await reader.read(2, 3) == b"234"
    assert not reader.idle and reader.stream_open and store.stream_events.read["open"] == 1
    store.put("f", b"new")  # overwritten: the open stream still serves what it pinned
    assert await reader.read(8, 100) == b"89"
    assert await reader.read(10, 5) == b""
    await fails(store.open_reader("f", first.generation).read(0, 1), Code.NOT_FOUND, errno.ESTALE)
    await fails(reader.read(11, 1), Code.OUT_OF_RANGE, errno.EINVAL)
    assert not reader.stream_open  # the service ended that stream: the next read opens another
    await fails(reader.read(0, 1), Code.NOT_FOUND, errno.ESTALE)
    assert store.stream_events.read["open"] == 3 and not reader.idle
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
    assert reader.idle and not reader.stream_open and flat.stream_events.read["open"] == 0
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
async def test_folders_on_hns_and_zonal():
    store = MemoryStore(kind="hns")
    await write(store, "a/b/c", b"1")
    assert store.folder_names() == ["a/", "a/b/"]  # an object write creates its parent folders
    await store.create_folder("x")
    await fails(store.create_folder("x/"), Code.ALREADY_EXISTS, errno.EEXIST)
    await fails(store.create_folder("y/z/"), Code.FAILED_PRECONDITION)
    await fails(store.delete_folder("a/"), Code.FAILED_PRECONDITION)  # not empty
    await fails(store.delete_folder("nope/"), Code.NOT_FOUND, errno.ENOENT)
    before = store.meta("a/b/c")
    await fails(store.rename_folder("a/", "a/b/x/"), Code.INVALID_ARGUMENT)
    await fails(store.rename_folder("a/", "x/"), Code.ALREADY_EXISTS)
    await fails(store.rename_folder("a/", "q/r/"), Code.FAILED_PRECONDITION)
    await store.rename_folder("a/", "x/a/")
    after = store.meta("x/a/b/c")
    assert (after.generation, after.metageneration) == (before.generation, before.metageneration + 1)
    assert store.names() == ["x/a/b/c"] and store.folder_names() == ["x/", "x/a/", "x/a/b/"]
    await store.delete_object("x/a/b/c")
    assert store.folder_names() == ["x/", "x/a/", "x/a/b/"]  # deleting objects leaves folders
    await store.delete_folder("x/a/b/")
    assert (await store.stat_name("x/a")) == (None, True)


@pytest.mark.trio
async def test_flat_buckets_have_no_folders():
    store = MemoryStore(kind="flat")
    await write(store, "a/b", b"1")
    assert store.folder_names() == []
    for call in (store.create_folder("a/"), store.delete_folder("a/"), store.rename_folder("a/", "c/"),
                 store.list_folders_page("")):
        await fails(call, Code.FAILED_PRECONDITION, errno.ESTALE)
    assert await store.stat_name("a") == (None, True)  # implied by an object name
    assert await store.stat_name("a/b") == (store.meta("a/b"), False)


@pytest.mark.trio
async def test_listing():
    store = MemoryStore(kind="hns")
    for name in ("a/1", "a/2", "a/b/c", "b", "c/", "c/d"):
        store.put(name, b"x")
    await store.create_folder("empty/")
    page = await store.list_page("")
    assert ([o.name for o in page.objects], page.prefixes) == (["b"], ["a/", "c/", "empty/"])
    page = await store.list_page("", include_trailing_delimiter=True)
    assert [o.name for o in page.objects] == ["b", "c/"]
    page = await store.list_page("a/")
    assert ([o.name for o in page.objects], page.prefixes) == (["a/1", "a/2"], ["a/b/"])
    names, token = [], ""
    while True:
        page = await store.list_page("", delimiter="", page_size=2, page_token=token)
        assert len(page.objects) <= 2
        names += [o.name for o in page.objects]
        token = page.next_page_token
        if not token:
            break
    assert names == ["a/1", "a/2", "a/b/c", "b", "c/", "c/d"]
    page = await store.list_page("", delimiter="", start="a/2", end="c/d")
    assert [o.name for o in page.objects] == ["a/2", "a/b/c", "b", "c/"]
    await fails(store.list_page("", page_token="garbage"), Code.INVALID_ARGUMENT)
    objects, prefixes, complete = await store.list_directory("", delimiter="")
    assert (len(objects), prefixes, complete) == (6, [], True)
    assert await store.list_folders_page("") == (["a/", "a/b/", "c/", "empty/"], "")
    folders, token = await store.list_folders_page("a/", page_size=1)
    assert folders == ["a/"] and await store.list_folders_page("a/", page_token=token) == (["a/b/"], "")
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


# ================================================================ conformance with the emulator

class EmulatorSeam:
    """The emulator's store seen through the seam, the way the gRPC client sees it:
    records become ObjectMeta through the wire Object, refusals become StorageErrors."""

    def __init__(self, bucket: str, kind: str) -> None:
        self.store = emu.Store()
        self.bucket = self.store.create_bucket(bucket, kind)
        self.name = bucket

    def meta(self, record) -> ObjectMeta:
        return record_from_object(convert.object_proto(record))

    def call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except emu.StoreError as err:
            code = grpc.StatusCode[err.code]
            raise StorageError(str(err), errno_=errno_for(code), code=code) from None

    async def write_object(self, name, source, size, *, if_generation_match, metadata=None):
        return self.meta(self.call(self.store.put_object, self.name, name,
                                   os.pread(source, size, 0) if source is not None else b"",
                                   emu.Preconditions(if_generation_match=if_generation_match), metadata=metadata))

    async def get_object(self, name, generation=0):
        record = self.store.find_object(self.name, name)
        return self.meta(record) if record and generation in (0, record.generation) else None

    async def delete_object(self, name, *, if_generation_match=None):
        self.call(self.store.delete_object, self.name, name, 0,
                  emu.Preconditions(if_generation_match=if_generation_match))

    async def move_object(self, source, destination, *, if_source_generation_match=None, if_generation_match=None):
        return self.meta(self.call(self.store.move_object, self.name, source, destination,
                                   source_preconditions=emu.Preconditions(if_generation_match=if_source_generation_match),
                                   destination_preconditions=emu.Preconditions(if_generation_match=if_generation_match)))

    async def update_metadata(self, name, generation, metadata, *, if_metageneration_match=None):
        conditions = emu.Preconditions(if_generation_match=generation, if_metageneration_match=if_metageneration_match)
        return self.meta(self.call(self.store.update_object, self.name, name, generation, conditions,
                                   metadata_patch=metadata))

    async def create_folder(self, prefix):
        self.call(self.store.create_folder, self.name, prefix)

    async def delete_folder(self, prefix):
        self.call(self.store.delete_folder, self.name, prefix)

    async def rename_folder(self, source, destination):
        self.call(self.store.rename_folder, self.name, source, destination)

    async def list_page(self, prefix, *, delimiter="/", page_token="", page_size=1000, start="", end="",
                        include_trailing_delimiter=False):
        listing = self.call(self.store.list_objects, self.name, prefix=prefix, delimiter=delimiter,
                            page_token=page_token, page_size=page_size, lexicographic_start=start,
                            lexicographic_end=end, include_trailing_delimiter=include_trailing_delimiter,
                            include_folders_as_prefixes=self.bucket.hierarchical)
        return ListPage([self.meta(r) for r in listing.objects], listing.prefixes, listing.next_page_token)

    async def list_folders_page(self, prefix, *, page_token="", page_size=1000, start="", end=""):
        listing = self.call(self.store.list_folders, self.name, prefix=prefix, page_token=page_token,
                            page_size=page_size, lexicographic_start=start, lexicographic_end=end)
        return [folder.name for folder in listing.folders], listing.next_page_token

    async def stat_name(self, name):
        obj = await self.get_object(name)
        if self.bucket.hierarchical:
            return obj, self.store._folder(self.name, name + "/") is not None
        page = await self.list_page(name + "/", page_size=1, include_trailing_delimiter=True)
        return obj, bool(page.objects or page.prefixes)

    def open_reader(self, name, generation):
        return EmulatorReader(self, name, generation)

    def open_appender(self, name):
        return EmulatorAppender(self, name)


class EmulatorReader:
    """BidiReadObject pins the blob at the stream's open; ReadObject opens per read."""

    def __init__(self, seam: EmulatorSeam, name: str, generation: int) -> None:
        self.seam, self.name, self.generation, self.blob = seam, name, generation, None

    async def read(self, offset, length):
        seam = self.seam
        try:
            if not seam.bucket.zonal:
                _, blob = seam.call(seam.store.open_reader, seam.name, self.name, self.generation)
                return blob.read(offset, max(0, min(length, blob.size() - offset)))
            if self.blob is None:
                _, self.blob = seam.call(seam.store.open_reader, seam.name, self.name, self.generation)
            if offset > self.blob.size():
                raise StorageError("past the end", code=Code.OUT_OF_RANGE)
            return self.blob.read(offset, min(length, self.blob.size() - offset))
        except StorageError:
            self.blob = None
            raise


class EmulatorAppender:
    """BidiWriteObject on the emulator's store: an epoch per writer, appends at the persisted size."""

    def __init__(self, seam: EmulatorSeam, name: str) -> None:
        self.seam, self.name, self.generation, self.epoch = seam, name, 0, 0

    def _record(self, record):
        self.generation, self.epoch = record.generation, record.writer_epoch
        return record

    async def create(self, *, if_generation_match=0, metadata=None):
        seam = self.seam
        return seam.meta(self._record(seam.call(seam.store.create_appendable, seam.name, self.name,
                                                emu.Preconditions(if_generation_match=if_generation_match),
                                                metadata=metadata)))

    async def takeover(self, generation):
        seam = self.seam
        return self._record(seam.call(seam.store.open_appendable, seam.name, self.name, generation)).size

    def _state(self):
        seam = self.seam
        return seam.call(seam.store.writer_state, seam.name, self.name, self.generation, self.epoch)

    async def append(self, data):
        seam = self.seam
        seam.call(seam.store.append, seam.name, self.name, self.generation, self.epoch, self._state().size, data)

    async def flush(self):
        return self._state().size

    async def finalize(self):
        seam = self.seam
        return seam.meta(seam.call(seam.store.finalize, seam.name, self.name, self.generation, self.epoch))

    async def close(self):
        self._state()


class Recorder:
    """Observations of a scenario, generations renamed in order of appearance."""

    def __init__(self) -> None:
        self.seen: list = []
        self.generations: dict[int, int] = {}

    def norm(self, value):
        if isinstance(value, ObjectMeta):
            generation = self.generations.setdefault(value.generation, len(self.generations))
            return ("meta", value.name, generation, value.metageneration, value.size, value.finalized,
                    value.crc32c, dict(value.metadata))
        if isinstance(value, ListPage):
            return ("page", [self.norm(o) for o in value.objects], value.prefixes, bool(value.next_page_token))
        if isinstance(value, (list, tuple)):
            return [self.norm(v) for v in value]
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        return value

    async def __call__(self, awaitable):
        try:
            result = await awaitable
        except StorageError as err:
            self.seen.append(("error", err.code.name if err.code else None))
            return None
        self.seen.append(self.norm(result))
        return result

    def note(self, value) -> None:
        self.seen.append(self.norm(value))


async def scenario_objects(store, kind, rec):
    first = await rec(write(store, "a", b"one", if_generation_match=0))
    await rec(write(store, "a", b"two", if_generation_match=0))
    second = await rec(write(store, "a", b"three", if_generation_match=first.generation))
    rec.note(second.generation > first.generation)
    await rec(store.get_object("a"))
    await rec(store.get_object("a", first.generation))
    await rec(store.update_metadata("a", second.generation, {"k": "v", "gcsfuse_mtime": "2024-01-02T03:04:05Z"}))
    rec.note((await store.get_object("a")).mtime_ns)
    await rec(store.update_metadata("a", first.generation, {"k": "w"}))
    await rec(store.update_metadata("a", second.generation, {"k": "w"}, if_metageneration_match=1))
    await rec(store.update_metadata("a", second.generation, {"k": "w"}, if_metageneration_match=2))
    await rec(write(store, "c", b"c"))
    await rec(store.move_object("a", "b", if_source_generation_match=first.generation))
    await rec(store.move_object("a", "c", if_generation_match=0))
    moved = await rec(store.move_object("a", "b", if_source_generation_match=second.generation, if_generation_match=0))
    rec.note(moved.generation > second.generation)
    await rec(store.move_object("a", "d"))
    await rec(store.get_object("a"))
    await rec(store.delete_object("a"))
    await rec(store.delete_object("b", if_generation_match=second.generation))
    await rec(store.delete_object("b", if_generation_match=moved.generation))
    await rec(store.get_object("b"))
    await rec(write(store, "bad\nname", b""))


async def scenario_listing(store, kind, rec):
    for name in ("a/1", "a/2", "a/b/c", "b", "c/", "c/d", "e/f/g", "é"):
        await write(store, name, name.encode())
    await rec(store.create_folder("empty/"))
    for kwargs in ({}, {"include_trailing_delimiter": True}, {"delimiter": ""}, {"start": "a/2", "end": "c/d"},
                   {"delimiter": "", "start": "a/2", "end": "c/d"}, {"end": "b"}):
        await rec(store.list_page("", **kwargs))
    for prefix in ("a/", "c/", "e/", "e/f/", "zz/"):
        await rec(store.list_page(prefix))
    for delimiter, include in (("/", False), ("/", True), ("", False)):
        token = ""
        while True:
            page = await rec(store.list_page("", delimiter=delimiter, page_size=2, page_token=token,
                                             include_trailing_delimiter=include))
            token = page.next_page_token
            if not token:
                break
    for name in ("a", "b", "c", "e/f", "empty", "zzz"):
        await rec(store.stat_name(name))
    await rec(store.list_folders_page(""))
    folders = await rec(store.list_folders_page("", page_size=2))
    if folders:
        await rec(store.list_folders_page("", page_size=2, page_token=folders[1]))
    await rec(store.list_folders_page("a/"))
    await rec(store.list_folders_page("", start="b", end="e/f/"))


async def scenario_folders(store, kind, rec):
    await rec(store.create_folder("x/"))
    await rec(store.create_folder("x/"))
    await rec(store.create_folder("y/z/"))
    before = await rec(write(store, "x/y/obj", b"data"))
    await rec(store.list_page(""))
    await rec(store.delete_folder("x/"))
    await rec(store.rename_folder("x/", "x/in/"))
    await rec(store.rename_folder("x/", "w/"))
    after = await rec(store.get_object("w/y/obj"))
    rec.note(after is not None and after.generation == before.generation)
    await rec(store.get_object("x/y/obj"))
    await rec(store.list_page("w/"))
    await rec(store.list_page(""))
    await rec(store.delete_folder("nope/"))
    await rec(store.delete_folder("w/y/"))
    await rec(store.delete_object("w/y/obj"))
    await rec(store.delete_folder("w/y/"))
    await rec(store.stat_name("w/y"))
    await rec(store.stat_name("w"))


async def scenario_appendable(store, kind, rec):
    first = store.open_appender("dir/log")
    created = await rec(first.create(if_generation_match=0, metadata={"m": "1"}))
    if created is None:
        return  # regional buckets refuse appendable objects
    await rec(first.append(b"hello "))
    await rec(first.flush())
    reader = store.open_reader("dir/log", created.generation)
    await rec(reader.read(0, 100))
    await rec(store.get_object("dir/log"))
    second = store.open_appender("dir/log")
    await rec(second.takeover(created.generation))
    await rec(first.append(b"fenced"))
    await rec(first.flush())
    await rec(second.append(b"world"))
    await rec(second.flush())
    await rec(reader.read(6, 100))
    await rec(second.finalize())
    await rec(store.open_appender("dir/log").takeover(created.generation))
    await rec(store.open_appender("dir/log").create(if_generation_match=0))
    third = store.open_appender("other")
    await rec(third.create())
    await rec(third.append(b"abc"))
    await rec(third.close())
    await rec(store.get_object("other"))
    await rec(store.move_object("other", "moved"))
    await rec(store.open_appender("other").takeover(third.generation))  # moved away
    await rec(store.list_page("", delimiter=""))


async def scenario_readers(store, kind, rec):
    first = await write(store, "r", b"0123456789")
    reader = store.open_reader("r", first.generation)
    await rec(reader.read(3, 4))
    await rec(reader.read(10, 1))
    await rec(reader.read(11, 1))
    await rec(reader.read(0, 2))
    await write(store, "r", b"new")
    await rec(reader.read(0, 2))  # zonal: served from the pinned stream; regional: gone
    await rec(store.open_reader("r", first.generation).read(0, 2))
    await rec(store.open_reader("r", 0).read(0, 100))
    await rec(store.open_reader("missing", 0).read(0, 1))


SCENARIOS = [scenario_objects, scenario_listing, scenario_folders, scenario_appendable, scenario_readers]


@pytest.mark.trio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__.removeprefix("scenario_"))
async def test_conformance_with_the_emulator(scenario, kind):
    observed = {}
    for backend, store in (("memory", MemoryStore("bucket", kind)), ("emulator", EmulatorSeam("bucket", kind))):
        rec = Recorder()
        await scenario(store, kind, rec)
        observed[backend] = rec.seen
    assert observed["memory"] == observed["emulator"]
    assert observed["memory"]
