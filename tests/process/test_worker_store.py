"""WorkerStore, the storage seam over data-plane worker processes, driven from
trio against the emulator: every call crosses to a real worker process,
which makes the gRPC call and puts read bytes in shared memory."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

from rapidmount.storage.errors import StorageCode, StorageError
from rapidmount.storage.seam import ObjectAppender, ObjectReader, ObjectStore
from tests.conftest import FLAT_BUCKET, HNS_BUCKET, ZONAL_BUCKET
from tests.workerstore import make_worker_store, run_with_workers, stat_bools


@pytest.fixture
def make_store(emulator):
    """``make_store(bucket)``: a WorkerStore with one worker process on the emulator."""
    def make(bucket: str, *, deadline: float = 5.0, stall_timeout: float = 10.0):
        return make_worker_store(emulator.endpoint, bucket, deadline=deadline, stall_timeout=stall_timeout)
    return make


def upload_source(data: bytes) -> int | None:
    """A descriptor of an unlinked temporary file holding ``data``, as the core uploads from."""
    if not data:
        return None
    fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR)
    os.write(fd, data)
    return fd


async def _errno_of(call, *args, **kwargs) -> int:
    with pytest.raises(StorageError) as caught:
        await call(*args, **kwargs)
    return caught.value.errno


def test_store_reader_and_appender_implement_the_seam(make_store):
    store = make_store(ZONAL_BUCKET)
    assert isinstance(store, ObjectStore)
    assert isinstance(store.open_reader("x", 1), ObjectReader)
    assert isinstance(store.open_appender("x"), ObjectAppender)
    assert store.bucket == ZONAL_BUCKET and store.layout.bidi_reads and store.layout.folders


def test_get_and_stat_name_use_folders_or_a_prefix_probe(emulator, make_store):
    for bucket in (HNS_BUCKET, FLAT_BUCKET):
        first = emulator.seed(bucket, "d/f", b"12345", metadata={"k": "v"})
        emulator.seed(bucket, "d/f", b"123456")
        store = make_store(bucket)

        async def main():
            meta = await store.get_object("d/f")
            assert (meta.name, meta.size, meta.finalized) == ("d/f", 6, True)
            assert meta.generation != first and await store.get_object("nope") is None
            assert stat_bools(await store.stat_name("d")) == (None, True)
            found, is_dir = stat_bools(await store.stat_name("d/f"))
            assert found.generation == meta.generation and not is_dir
            assert stat_bools(await store.stat_name("absent")) == (None, False)

        run_with_workers(store, main)
    # Only folders answer for an empty directory on an HNS bucket.
    store = make_store(HNS_BUCKET)

    async def folders():
        await store.create_folder("empty/")
        assert stat_bools(await store.stat_name("empty")) == (None, True)

    run_with_workers(store, folders)
    assert emulator.rpc_counts.get("GetFolder", 0) >= 1


def test_listing_includes_folders_as_prefixes_when_the_bucket_has_folders(emulator, make_store):
    emulator.seed(HNS_BUCKET, "a/x", b"x")
    emulator.seed(HNS_BUCKET, "top", b"t")
    emulator.seed(FLAT_BUCKET, "a/x", b"x")
    hns, flat = make_store(HNS_BUCKET), make_store(FLAT_BUCKET)

    async def main():
        await hns.create_folder("empty/")
        page = await hns.list_page("")
        assert [o.name for o in page.objects] == ["top"] and page.prefixes == ["a/", "empty/"]
        objects, prefixes, complete = await hns.list_directory("")
        assert [o.name for o in objects] == ["top"] and prefixes == ["a/", "empty/"] and complete
        objects, prefixes, complete = await hns.list_directory("", delimiter="")
        assert sorted(o.name for o in objects) == ["a/x", "top"] and not prefixes
        folders, token = await hns.list_folders_page("")
        assert {"a/", "empty/"} <= {folder.name for folder in folders} and token == ""
        assert [folder.name for folder in await hns.list_child_folders("")] == ["a/", "empty/"]
        page = await flat.list_page("", page_size=1)
        assert page.prefixes == ["a/"] and page.next_page_token == ""

    run_with_workers([hns, flat], main)


def test_write_object_with_a_generation_precondition(emulator, make_store):
    store = make_store(FLAT_BUCKET)
    data = bytes(range(256)) * 20_000  # several chunks

    async def main():
        meta = await store.write_object("w", upload_source(data), len(data),
                                        if_generation_match=0, metadata={"gcsfuse_mtime": "2024-01-02T03:04:05Z"})
        assert meta.size == len(data) and meta.metadata["gcsfuse_mtime"] == "2024-01-02T03:04:05Z"
        assert await _errno_of(store.write_object, "w", None, 0, if_generation_match=0) == errno.ESTALE
        again = await store.write_object("w", upload_source(b"new"), 3, if_generation_match=meta.generation)
        assert again.generation != meta.generation and again.size == 3
        return again

    run_with_workers(store, main)
    assert emulator.read_object(FLAT_BUCKET, "w") == b"new"
    assert store.rpc_errors.snapshot() == {("WriteObject", "FAILED_PRECONDITION"): 1}


def open_copies(fd: int, pids: list[int]) -> list[int]:
    """The pid of every open descriptor, among those of ``pids``, of the file ``fd`` opens."""
    target = os.fstat(fd)
    found = []
    for pid in pids:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                seen = os.stat(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue  # closed meanwhile
            if (seen.st_dev, seen.st_ino) == (target.st_dev, target.st_ino):
                found.append(pid)
    return found


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_a_staged_file_is_read_by_the_worker_through_the_descriptor_its_call_passes(emulator, make_store, bucket):
    """Appended (zonal) or uploaded whole (WriteObject), a staged file's bytes
    are read by the worker, through a descriptor passed over the socket; once
    the object is written, no copy of that descriptor stays open anywhere."""
    store = make_store(bucket)
    data = os.urandom(5 * 1024 * 1024 + 17)  # several messages of the stream
    fd = upload_source(data)

    async def main():
        if bucket == ZONAL_BUCKET:
            appender = store.open_appender("staged.bin")
            await appender.create(if_generation_match=0)
            await appender.append_file(fd, len(data))
            meta = await appender.finalize()
        else:
            meta = await store.write_object("staged.bin", fd, len(data), if_generation_match=0)
        return meta, open_copies(fd, [os.getpid(), *(worker.pid for worker in store.pool.live())])

    try:
        meta, holders = run_with_workers(store, main)
    finally:
        os.close(fd)
    assert holders == [os.getpid()], "only the caller's own descriptor"
    assert meta.finalized and meta.size == len(data)
    assert emulator.read_object(bucket, "staged.bin") == data


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_an_upload_longer_than_its_staged_file_fails_with_eio(emulator, make_store, bucket):
    store = make_store(bucket)
    fd = upload_source(b"short")

    async def main():
        if bucket == ZONAL_BUCKET:
            appender = store.open_appender("short.bin")
            await appender.create(if_generation_match=0)
            failed = await _errno_of(appender.append_file, fd, 100)
            assert await _errno_of(appender.flush) == failed  # the stream stays failed
            await appender.abort()
            return failed
        return await _errno_of(store.write_object, "short.bin", fd, 100, if_generation_match=0)

    try:
        assert run_with_workers(store, main) == errno.EIO
    finally:
        os.close(fd)
    written = emulator.object_info(bucket, "short.bin")
    assert (written is None) if bucket == FLAT_BUCKET else (written["size"] == 0), written  # not a byte of it


def test_move_with_source_and_destination_preconditions(emulator, make_store):
    source = emulator.seed(ZONAL_BUCKET, "src", b"moving")
    taken = emulator.seed(ZONAL_BUCKET, "taken", b"here")
    store = make_store(ZONAL_BUCKET)

    async def main():
        assert await _errno_of(store.move_object, "src", "dst", if_source_generation_match=source + 1) == errno.ESTALE
        assert await _errno_of(store.move_object, "src", "taken", if_generation_match=0) == errno.ESTALE
        assert await _errno_of(store.move_object, "src", "taken", if_generation_match=taken + 1) == errno.ESTALE
        moved = await store.move_object("src", "dst", if_source_generation_match=source, if_generation_match=0)
        assert moved.name == "dst" and moved.size == 6
        assert await store.get_object("src") is None
        replaced = await store.move_object("dst", "taken", if_generation_match=taken)
        assert replaced.name == "taken"

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "taken") == b"moving"


def test_update_metadata_with_a_metageneration_precondition(emulator, make_store):
    generation = emulator.seed(ZONAL_BUCKET, "m", b"x", metadata={"keep": "1"})
    store = make_store(ZONAL_BUCKET)

    async def main():
        meta = await store.get_object("m")
        assert await _errno_of(store.update_metadata, "m", generation, {"a": "b"},
                               if_metageneration_match=meta.metageneration + 1) == errno.ESTALE
        updated = await store.update_metadata("m", generation, {"a": "b"},
                                              if_metageneration_match=meta.metageneration)
        assert dict(updated.metadata) == {"keep": "1", "a": "b"}
        assert updated.metageneration == meta.metageneration + 1
        # A replaced generation is refused too.
        assert await _errno_of(store.update_metadata, "m", generation + 1, {"a": "c"}) in (errno.ESTALE,
                                                                                            errno.ENOENT)

    run_with_workers(store, main)


def test_delete_with_a_precondition(emulator, make_store):
    generation = emulator.seed(FLAT_BUCKET, "gone", b"x")
    store = make_store(FLAT_BUCKET)

    async def main():
        assert await _errno_of(store.delete_object, "gone", if_generation_match=generation + 1) == errno.ESTALE
        await store.delete_object("gone", if_generation_match=generation)
        assert await store.get_object("gone") is None
        assert await _errno_of(store.delete_object, "gone") == errno.ENOENT

    run_with_workers(store, main)
    assert store.rpc_errors.snapshot() == {("DeleteObject", "FAILED_PRECONDITION"): 1,
                                           ("DeleteObject", "NOT_FOUND"): 1, ("GetObject", "NOT_FOUND"): 1}


def test_folders_create_rename_delete(make_store):
    store = make_store(HNS_BUCKET)

    async def main():
        await store.create_folder("a/")
        await store.create_folder("a/b/")
        await store.rename_folder("a/", "z/")
        assert stat_bools(await store.stat_name("a")) == (None, False)
        assert stat_bools(await store.stat_name("z/b")) == (None, True)
        await store.delete_folder("z/b/")
        assert stat_bools(await store.stat_name("z/b")) == (None, False)

    run_with_workers(store, main)


def test_appender_create_append_flush_and_takeover_fencing(emulator, make_store):
    store = make_store(ZONAL_BUCKET)

    async def main():
        first = store.open_appender("log")
        assert not first.stream_open
        meta = await first.create(metadata={"owner": "me"})
        assert meta is not None and meta.metadata["owner"] == "me" and not meta.finalized
        assert first.generation == meta.generation and first.stream_open
        await first.append(b"hello ")
        await first.append(b"world")
        assert await first.flush() == 11
        assert emulator.read_object(ZONAL_BUCKET, "log") == b"hello world"
        # The name is taken now.
        assert await _errno_of(store.open_appender("log").create) == errno.ESTALE

        second = store.open_appender("log")
        assert await second.takeover(first.generation) == 11
        # The first writer was fenced off: its next flush fails, for good.
        await first.append(b"!")
        assert await _errno_of(first.flush) == errno.ESTALE
        await first.abort()

        await second.append(b", again")
        final = await second.finalize()
        assert final.finalized and final.size == 18
        await second.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "log") == b"hello world, again"
    assert store.stream_events.write["open"] >= 2


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_reader_reads_ranges_and_a_replaced_generation_is_estale(emulator, make_store, bucket):
    data = bytes(range(256)) * 64
    generation = emulator.seed(bucket, "r", data)
    store = make_store(bucket)

    async def main():
        reader = store.open_reader("r", generation)
        assert not reader.stream_open  # no stream before the first read
        assert bytes(await reader.read(10, 100)) == data[10:110]
        assert bytes(await reader.read(len(data) - 5, 100)) == data[-5:]  # short at the end
        assert reader.stream_open == store.layout.bidi_reads
        await reader.close()
        emulator.seed(bucket, "r", b"replaced")
        stale = store.open_reader("r", generation)
        assert await _errno_of(stale.read, 0, 10) == errno.ESTALE
        await stale.close()
        await stale.close()  # closing twice is harmless

    run_with_workers(store, main)
    if store.layout.bidi_reads:
        assert store.stream_events.read["open"] >= 2


def test_range_reader_resumes_a_broken_stream_and_counts_it(emulator, make_store):
    data = bytes(range(256)) * 4096  # 1 MiB
    generation = emulator.seed(FLAT_BUCKET, "big", data)
    emulator.add_fault("broken-read:after=300000")
    store = make_store(FLAT_BUCKET)

    async def main():
        reader = store.open_reader("big", generation)
        assert bytes(await reader.read(0, len(data))) == data

    run_with_workers(store, main)
    assert store.stream_events.read["reconnect"] == 1
    assert store.rpc_errors.snapshot() == {("ReadObject", "UNAVAILABLE"): 1}


def test_unary_calls_retry_transient_failures_until_the_deadline(emulator, make_store):
    emulator.seed(FLAT_BUCKET, "o", b"x")
    store = make_store(FLAT_BUCKET, deadline=0.3)

    async def main():
        emulator.add_fault("unavailable:method=GetObject,count=2")
        assert (await store.get_object("o")).size == 1
        emulator.add_fault("outage:method=GetObject")
        with pytest.raises(StorageError, match="retry deadline exceeded") as caught:
            await store.get_object("o")
        assert caught.value.errno == errno.EIO and caught.value.code is StorageCode.UNAVAILABLE

    run_with_workers(store, main)
    assert store.rpc_errors.snapshot()[("GetObject", "UNAVAILABLE")] >= 3


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_read_objects_whole_and_composed_return_failures_in_place(emulator, make_store, bucket):
    blobs = {f"s/{i}": bytes([i]) * (100 + i) for i in range(5)}
    generations = dict(zip(blobs, emulator.seed_many(bucket, blobs)))
    store = make_store(bucket)
    items = [(name, generations[name], len(blob)) for name, blob in blobs.items()]
    items.append(("s/0", generations["s/0"] + 1, 10))  # a generation that never was
    names = iter(range(1000))

    async def main():
        whole = await store.read_objects_whole(items, concurrency=4)
        composed = await store.read_objects_composed(
            [(name, generation, size, None) for name, generation, size in items], concurrency=4,
            temporary_name=lambda: f"tmp/{next(names)}")
        leftovers = await store.list_page("tmp/")
        assert not leftovers.objects  # temporary composites are deleted
        return whole, composed

    whole, composed = run_with_workers(store, main)
    for answers in (whole, composed):
        assert [bytes(a) for a in answers[:5]] == list(blobs.values())
        assert isinstance(answers[5], StorageError) and answers[5].errno == errno.ESTALE


def test_range_reader_gives_up_on_a_stalled_stream(emulator, make_store):
    """The stall timeout reaches the second reader class too (it had none)."""
    generation = emulator.seed(FLAT_BUCKET, "slow", b"x" * 100)
    store = make_store(FLAT_BUCKET, deadline=0.3, stall_timeout=0.05)
    emulator.set_latency(250)

    async def main():
        with pytest.raises(StorageError, match=r"retry deadline exceeded \(no data for 0.05s\)") as caught:
            await store.open_reader("slow", generation).read(0, 100)
        assert caught.value.errno == errno.EIO

    run_with_workers(store, main)
    assert store.stream_events.read["reconnect"] >= 1


def test_appender_resumes_after_a_broken_stream_and_follows_a_redirect(emulator, make_store):
    store = make_store(ZONAL_BUCKET)
    data = bytes(range(256)) * 16384  # 4 MiB: two full chunks
    emulator.add_fault("redirect-write:token=elsewhere")
    emulator.add_fault("broken-write:after=1000000")

    async def main():
        appender = store.open_appender("resumed")
        await appender.create()
        await appender.append(data[:3_000_000])
        await appender.append(data[3_000_000:])
        assert await appender.flush() == len(data)
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "resumed") == data
    assert store.stream_events.write["redirect"] == 1 and store.stream_events.write["reconnect"] >= 2


def _run_then_close(store, main, *descriptors: int) -> None:
    """``main`` with the store's workers; then the descriptors (the pipe standing in for /dev/fuse) are closed."""
    try:
        run_with_workers(store, main)
    finally:
        for fd in descriptors:
            os.close(fd)


def _take(fd: int, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        got += os.read(fd, n - len(got))
    return bytes(got)


def test_a_block_whose_store_covers_it_goes_only_to_the_kernel_and_its_worker_holds_it_until_stored(emulator):
    """A pipe stands in for /dev/fuse: a store larger than the pipe waits in
    its write, as a store waits on a page a READ holds. Meanwhile the block's
    bytes come from the worker (``copy``); once the store is made, they are
    the kernel's alone (``copy`` gives None: read them again)."""
    from rapidmount.storage.seam import KernelOnly, PageStore

    MiB = 1 << 20
    data = os.urandom(3 * MiB)
    emulator.seed(ZONAL_BUCKET, "held.bin", data)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, page_store_buffer=8 * MiB)
    read_end, write_end = os.pipe()

    async def main():
        store.pool.share_fuse_fd(write_end)
        reader = store.open_reader("held.bin", 0)
        for attempt in range(1000):  # until the descriptor reached the worker (till then stores are "unready")
            whole = PageStore(7, 0, 0, MiB, ticket=2 * attempt + 1)
            partial = PageStore(7, 0, MiB + 4096, 2 * MiB, ticket=2 * attempt + 2)  # a tripwire's: no first page
            landed = await reader.read_blocks(0, [MiB, MiB], [whole, partial])
            if not isinstance(landed[0], bytes | memoryview):
                break
        assert isinstance(landed[0], KernelOnly) and len(landed[0]) == MiB
        assert bytes(landed[1]) == data[MiB:2 * MiB], "a block its store does not cover is in the arena"
        assert bytes(await landed[0].copy()) == data[:MiB], "held while its store waits"
        # The stores go out in order: once a later one is out, the first is made.
        [later] = await reader.read_blocks(2 * MiB, [MiB], [PageStore(7, 0, 2 * MiB, 3 * MiB, ticket=10_000)])
        out = [_take(read_end, 40 + MiB), _take(read_end, 40 + MiB - 4096), _take(read_end, 40 + MiB)]
        assert [piece[40:] for piece in out] == [data[:MiB], data[MiB + 4096:2 * MiB], data[2 * MiB:]]
        assert await landed[0].copy() is None, "made: the kernel's alone"
        assert (store.page_stores.held_copies, store.page_stores.held_misses) == (1, 1)
        await reader.close()

    _run_then_close(store, main, read_end, write_end)


def test_a_read_straight_from_the_stream_is_answered_by_its_worker_as_it_lands(emulator):
    """A pipe stands in for /dev/fuse: with a ``ReadAnswer``, the worker writes
    the READ's reply (header and exactly its part of the bytes read) and says
    so; the bytes still come back. Without one, or before the worker has the
    descriptor, nothing is written and ``sent`` stays False."""
    from rapidmount.shared.fuse_codec import reply_header
    from rapidmount.fuse.destinations import ReadAnswer

    data = os.urandom(256 * 1024)
    emulator.seed(ZONAL_BUCKET, "direct.bin", data)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)

    def written() -> bytes:
        try:
            return os.read(read_end, 1 << 20)
        except BlockingIOError:
            return b""

    async def main():
        reader = store.open_reader("direct.bin", 0)
        early = ReadAnswer(41)
        assert bytes(await reader.read(0, 4096, reply=early)) == data[:4096]
        assert not early.sent and written() == b"", "no /dev/fuse yet: the FUSE process answers"
        store.pool.share_fuse_fd(write_end)
        for attempt in range(1000):  # until the descriptor reached the worker
            reply = ReadAnswer(42 + attempt)
            got = await reader.read(8192, 4096, reply=reply)
            if reply.sent:
                break
            assert written() == b""
        assert reply.sent and bytes(got) == data[8192:12288]
        assert written() == reply_header(reply.unique, 4096) + data[8192:12288]
        assert bytes(await reader.read(100, 5000)) == data[100:5100]
        assert written() == b"", "no READ to answer"
        # At the object's end: the reply is the bytes there are.
        tail = ReadAnswer(7)
        assert bytes(await reader.read(len(data) - 1000, 4096, reply=tail)) == data[-1000:]
        assert tail.sent and written() == reply_header(7, 1000) + data[-1000:]
        # A READ within a block read for it: its part of the block.
        part = ReadAnswer(8, skip=4096, length=8192)
        assert bytes(await reader.read(65536, 65536, reply=part)) == data[65536:131072]
        assert part.sent and written() == reply_header(8, 8192) + data[65536 + 4096:65536 + 12288]
        # A part the bytes read do not hold all of (a block cut short): left to the FUSE process.
        beyond = ReadAnswer(9, skip=512, length=4096)
        assert bytes(await reader.read(len(data) - 2048, 4096, reply=beyond)) == data[-2048:]
        assert not beyond.sent and written() == b""
        await reader.close()

    _run_then_close(store, main, read_end, write_end)


@pytest.mark.parametrize("change", ["delete", "move"])
def test_a_stream_opened_after_the_name_lost_the_generation_leaves_its_ranges_to_the_open_one(emulator, change):
    """The reader's first stream pinned the generation and goes on reading it
    after the object is deleted or moved; another stream, due for a range a
    span (32 MiB) into the object while the first carries two ranges, opens
    after that and finds nothing under the name (NOT_FOUND). Its range goes to
    the open stream, and no stream opens for the reader any more."""
    import trio

    from rapidmount.dataplane.streams import DEFAULT_SPAN

    piece = 1 << 16
    data = os.urandom(DEFAULT_SPAN + 4 * piece)
    generation = emulator.seed(ZONAL_BUCKET, "going", data)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, read_streams=4)
    got: dict[int, bytes] = {}

    async def main():
        reader = store.open_reader("going", generation)
        assert bytes(await reader.read(0, 4096)) == data[:4096]
        if change == "delete":
            await store.delete_object("going", if_generation_match=generation)
        else:
            await store.move_object("going", "gone-to", if_source_generation_match=generation)

        async def read(offset: int) -> None:
            got[offset] = bytes(await reader.read(offset, piece))

        offsets = range(DEFAULT_SPAN, len(data), piece)
        for _ in range(2):
            async with trio.open_nursery() as nursery:
                for offset in offsets:  # the third finds the first stream with two ranges
                    nursery.start_soon(read, offset)
            assert got == {offset: data[offset:offset + piece] for offset in offsets}
        assert reader.streams == 1
        await reader.close()

    run_with_workers(store, main)
    assert store.rpc_errors.snapshot() == {("BidiReadObject", "NOT_FOUND"): 1}
