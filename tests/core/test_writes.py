"""The write state machine: streaming appends (zonal), takeovers, O_APPEND,
staged copies, truncation and upload preconditions."""

from __future__ import annotations

import errno
import logging
import os
import threading

import pytest
import trio
import trio.testing

from rapidmount.storage.errors import StorageCode
from tests.core.conftest import MiB, payload

pytestmark = pytest.mark.trio

RW = os.O_RDWR
NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL

zonal = pytest.mark.parametrize("kind", ["zonal"])


def uploads(store) -> int:
    """Whole-object uploads and object creations, of either kind."""
    return store.calls["write_object"] + store.calls["appender.create"]


# ---------------------------------------------------------------- streaming (zonal)

@zonal
async def test_new_file_streams(core, store):
    data = payload(5 * MiB + 17)
    handle = await core.create("f")
    assert store.meta("f").size == 0 and not store.meta("f").finalized, "an appendable object at once"
    await core.write(handle, data[:3 * MiB])
    assert len(store.data("f")) == 2 * MiB, "whole chunks persist while writing"
    await core.write(handle, data[3 * MiB:])
    assert (await core.fstat(handle)).st_size == len(data)
    await core.fsync(handle)
    assert store.data("f") == data
    await core.close(handle)
    meta = store.meta("f")
    assert meta.size == len(data) and not meta.finalized
    assert store.calls["write_object"] == 0 and store.calls["appender.create"] == 1
    assert await core.read_file("f") == data


@zonal
@pytest.mark.parametrize("core_options", [{"finalize_on_close": True}])
async def test_finalize_on_close(core, store):
    await core.write_file("f", b"done", NEW)
    assert store.meta("f").finalized and store.data("f") == b"done"


@zonal
async def test_streaming_reads_own_writes(core, store):
    writer = await core.create("f")
    await core.write(writer, b"hello ")
    reader = await core.open("f")
    await core.write(writer, b"world")
    assert await core.read(reader, 100, 0) == b"hello world"
    assert (await core.stat("f")).st_size == 11
    await core.close(writer)
    await core.close(reader)


@zonal
async def test_takeover_by_another_writer_is_sticky_estale(core, store):
    handle = await core.create("f")
    await core.write(handle, b"durable|")
    await core.fsync(handle)
    store.append_external("f", b"theirs|")
    first = await core.errno(core.write(handle, b"lost|"))
    if first is None:  # the write may be buffered: then fsync reports it
        first = await core.errno(core.fsync(handle))
    assert first == errno.ESTALE
    assert await core.errno(core.write(handle, b"x")) == errno.ESTALE
    assert await core.errno(core.fsync(handle)) == errno.ESTALE
    assert await core.errno(core.read(handle, 10, 0)) == errno.ESTALE
    assert await core.errno(core.close(handle)) == errno.ESTALE
    assert store.data("f") == b"durable|theirs|"
    # Once every writing handle is closed, the file works again.
    assert await core.read_file("f") == b"durable|theirs|"


@zonal
async def test_o_append_to_unfinalized_object_continues_at_the_buckets_end(core, store):
    store.put("log", b"abc", appendable=True)
    assert (await core.stat("log")).st_size == 3
    store.append_external("log", b"def")  # the mount still believes 3 bytes
    handle = await core.open("log", os.O_WRONLY | os.O_APPEND)
    await core.write(handle, b"ghi")
    await core.close(handle)
    assert store.data("log") == b"abcdefghi"
    assert store.calls["appender.takeover"] == 1 and uploads(store) == 0, "appended in place"
    assert not store.meta("log").finalized


@zonal
async def test_append_at_end_takes_over_in_place(core, store):
    meta = store.put("log", b"abc", appendable=True)
    handle = await core.open("log", RW)
    await core.write(handle, b"def", 3)
    await core.close(handle)
    assert store.data("log") == b"abcdef" and store.meta("log").generation == meta.generation


@zonal
async def test_plain_write_at_a_stale_end_stages_the_current_bytes(core, store):
    store.put("log", b"abc", appendable=True)
    await core.stat("log")
    store.append_external("log", b"def")
    handle = await core.open("log", RW)
    await core.write(handle, b"XYZ", 3)  # at the end the mount knew, not the bucket's
    await core.close(handle)
    assert store.data("log") == b"abcXYZ"


@zonal
async def test_append_to_finalized_object_stages(core, store):
    old = store.put("fin", b"abc")
    handle = await core.open("fin", os.O_WRONLY | os.O_APPEND)
    await core.write(handle, b"d")
    await core.close(handle)
    assert store.data("fin") == b"abcd" and store.meta("fin").generation != old.generation
    assert store.calls["appender.takeover"] == 0


@zonal
async def test_streaming_becomes_staged_at_a_random_write(core, store):
    handle = await core.create("f")
    await core.write(handle, b"0123456789")
    await core.write(handle, b"AB", 2)
    assert await core.read(handle, 100, 0) == b"01AB456789"
    await core.close(handle)
    assert store.data("f") == b"01AB456789"


# ---------------------------------------------------------------- staged writes

async def test_random_write_stages_and_uploads_a_new_generation(core, store):
    old = store.put("f", b"0123456789")
    handle = await core.open("f", RW)
    await core.write(handle, b"XY", 2)
    await core.write(handle, b"!", 14)  # past the end: a hole of zeros
    assert await core.read(handle, 100, 0) == b"01XY456789\0\0\0\0!"
    assert store.data("f") == b"0123456789", "nothing is sent before fsync"
    await core.fsync(handle)
    assert store.data("f") == b"01XY456789\0\0\0\0!"
    assert store.meta("f").generation != old.generation
    await core.close(handle)


async def test_new_file_on_regional_bucket_is_uploaded_at_close(core, store):
    handle = await core.create("f")
    await core.write(handle, b"abc")
    if store.kind != "zonal":
        assert store.meta("f") is None, "a staged new file is not in the bucket before fsync"
    await core.close(handle)
    assert store.data("f") == b"abc"


async def test_o_trunc_empties_the_object_at_close(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_WRONLY | os.O_TRUNC)
    assert (await core.fstat(handle)).st_size == 0
    await core.close(handle)
    assert store.data("f") == b""


async def test_o_trunc_of_an_empty_file_sends_nothing(core, store):
    store.put("f", b"")
    before = uploads(store)
    await core.close(await core.open("f", os.O_WRONLY | os.O_TRUNC))
    assert uploads(store) == before


async def test_rdonly_o_trunc_does_not_truncate(core, store):
    store.put("f", b"abc")
    await core.close(await core.open("f", os.O_RDONLY | os.O_TRUNC))
    assert store.data("f") == b"abc"


@pytest.mark.parametrize("size", [0, 4, 20])
async def test_truncate_without_an_open_file_uploads_at_once(core, store, size):
    old = store.put("f", b"0123456789")
    await core.truncate("f", size)
    assert store.data("f") == (b"0123456789" + b"\0" * 10)[:size]
    assert store.meta("f").generation != old.generation
    assert (await core.stat("f")).st_size == size


async def test_truncate_to_the_current_size_sends_nothing(core, store):
    store.put("f", b"0123456789")
    await core.stat("f")
    before = uploads(store)
    await core.truncate("f", 10)
    assert uploads(store) == before


async def test_truncate_with_an_open_file_waits_for_fsync(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", RW)
    await core.ftruncate(handle, 4)
    assert store.data("f") == b"0123456789"
    assert (await core.fstat(handle)).st_size == 4
    assert await core.read(handle, 100, 0) == b"0123"
    await core.fsync(handle)
    assert store.data("f") == b"0123"
    await core.close(handle)


async def test_truncate_of_a_path_replaced_elsewhere_is_estale(core, store):
    store.put("f", b"0123456789")
    await core.stat("f")
    store.put("f", b"theirs")
    assert await core.errno(core.truncate("f", 2)) == errno.ESTALE
    assert store.data("f") == b"theirs"


async def test_staged_upload_refuses_when_another_client_replaced_the_object(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", RW)
    await core.write(handle, b"XY", 2)
    store.put("f", b"theirs")
    assert await core.errno(core.fsync(handle)) == errno.ESTALE
    assert await core.errno(core.write(handle, b"more", 0)) == errno.ESTALE, "the failure sticks"
    assert await core.errno(core.close(handle)) == errno.ESTALE
    assert store.data("f") == b"theirs"


async def test_staged_upload_refuses_when_another_client_deleted_the_object(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", RW)
    await core.write(handle, b"XY", 2)
    store.delete_external("f")
    assert await core.errno(core.close(handle)) == errno.ESTALE
    assert store.meta("f") is None


@zonal
async def test_staged_upload_refuses_after_an_external_append(core, store):
    store.put("u", b"0123456789", appendable=True)
    handle = await core.open("u", RW)
    await core.write(handle, b"XY", 2)  # not at the end: staged
    store.append_external("u", b"theirs")  # the generation stays
    assert await core.errno(core.fsync(handle)) == errno.ESTALE
    await core.errno(core.close(handle))
    assert store.data("u") == b"0123456789theirs"


async def test_nothing_is_uploaded_when_nothing_changed(core, store):
    old = store.put("f", b"abc")
    before = uploads(store)
    for flags in (os.O_WRONLY, RW, os.O_WRONLY | os.O_APPEND):
        handle = await core.open("f", flags)
        await core.fsync(handle)
        await core.close(handle)
    assert uploads(store) == before and store.meta("f").generation == old.generation


async def test_each_fsync_after_more_writes_uploads_again(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", RW)
    await core.write(handle, b"A", 0)
    await core.fsync(handle)
    await core.write(handle, b"B", 1)
    await core.fsync(handle)
    await core.fsync(handle)  # nothing new
    await core.close(handle)
    assert store.data("f") == b"AB23456789"


async def test_two_handles_share_pending_writes(core, store):
    store.put("f", b"0123456789")
    one = await core.open("f", RW)
    two = await core.open("f", RW)
    await core.write(one, b"A", 0)
    assert await core.read(two, 3, 0) == b"A12"
    await core.write(two, b"B", 1)
    await core.fsync(one)  # makes both handles' bytes durable
    assert store.data("f") == b"AB23456789"
    await core.close(one)
    await core.close(two)


async def test_write_on_read_only_handle_is_ebadf(core, store):
    store.put("f", b"abc")
    handle = await core.open("f")
    assert await core.errno(core.write(handle, b"x", 0)) == errno.EBADF
    await core.close(handle)


async def test_failed_staged_upload_does_not_stick(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", RW)
    await core.write(handle, b"XY", 2)
    method = "appender.create" if store.kind == "zonal" else "write_object"
    store.fail_next(method, StorageCode.UNAVAILABLE)
    assert await core.errno(core.fsync(handle)) == errno.EIO
    await core.close(handle)
    assert store.data("f") == b"01XY456789"


async def test_a_slow_temp_dir_holds_only_the_writes_that_need_it(core, store, monkeypatch):
    """The staged file's disk I/O runs beside the event loop: while one write
    waits for --temp-dir, every other operation of the mount goes on."""
    store.put("staged", b"0123456789")
    store.put("other", payload(1000, 2))
    handle = await core.open("staged", RW)
    await core.write(handle, b"X", 0)  # the copy is made
    in_disk, go_on, stalled = threading.Event(), threading.Event(), []
    pwrite = os.pwrite

    def slow_pwrite(fd, data, offset):
        in_disk.set()
        if not go_on.wait(5):
            stalled.append(offset)  # nothing else ran meanwhile to let it go on
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", slow_pwrite)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(core.write, handle, b"Y", 1)
        assert await trio.to_thread.run_sync(in_disk.wait, 5)
        assert await core.read_file("other") == payload(1000, 2)
        assert (await core.stat("staged")).st_size == 10
        go_on.set()
    monkeypatch.setattr(os, "pwrite", pwrite)
    assert not stalled, "the write held the event loop"
    await core.close(handle)
    assert store.data("staged") == b"XY23456789"


@zonal
async def test_a_write_that_waited_for_a_close_goes_where_the_file_is_now(core, store):
    """`echo x > f` from two threads: the close of a duplicate uploads the
    emptied file and keeps its stream, while the write waits for that upload;
    the write then streams, it does not go to the staged copy that is gone."""
    store.put("f", b"0123456789", appendable=True)
    handle = await core.open("f", os.O_WRONLY | os.O_TRUNC)
    created = store.calls["appender.create"]
    held = store.hold("appender.create")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(core.call, core.fs.flush, handle.fh)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(core.write, handle, b"x", 0)
        await trio.testing.wait_all_tasks_blocked()
        held.set()
    await core.close(handle)
    assert store.data("f") == b"x"
    assert store.calls["appender.create"] == created + 1, "one generation"


# ---------------------------------------------------------------- after close: release still uploading

@pytest.mark.parametrize("kind", ["zonal", "flat"])
async def test_rename_and_unlink_after_close_wait_for_the_last_upload(core, store, kind, nursery):
    """rsync's order: write a temporary file, close it, set its mtime, rename
    it into place. The kernel sends the release after close() returned, so the
    rename can overtake the release's upload; it must wait for it, or the
    moved object loses the mtime (regression: rsync found files to send again)."""
    import trio

    from rapidmount.storage.model import MTIME_METADATA_KEY, format_mtime

    method = "appender.close" if kind == "zonal" else "write_object"
    for final in ("moved", None):
        temporary = f".tmp-{final}"
        handle = await core.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        await core.write(handle, b"content")
        await core.call(core.fs.flush, handle.fh)
        gate = store.hold(method)
        releasing = trio.Event()

        async def release():
            await core.fs.release(handle.fh)
            releasing.set()

        nursery.start_soon(release)
        await trio.testing.wait_all_tasks_blocked()
        inode = await core.lookup_path(temporary)
        await core.call(core.fs.set_mtime, inode.ino, 1_700_000_000_123_456_789)
        if final is None:
            nursery.start_soon(core.unlink, temporary)
        else:
            nursery.start_soon(core.rename, temporary, final)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await releasing.wait()
        await trio.testing.wait_all_tasks_blocked()
        if final is None:
            assert store.meta(temporary) is None, "the unlink came after the upload"
        else:
            assert store.meta(temporary) is None and store.data(final) == b"content"
            assert store.meta(final).metadata[MTIME_METADATA_KEY] == format_mtime(1_700_000_000_123_456_789)


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_files_open_below_a_renamed_directory_keep_every_byte_and_follow_it(core, store):
    """Found by R3: renaming a directory moved its objects without the pending
    writes of the files open below it, and their handles went on writing under
    the old name (ESTALE at fsync, the bytes written before the rename lost)."""
    await core.mkdir("d")
    store.put("d/old", payload(5000, 3), appendable=store.layout.appendable_objects)
    writer = await core.open("d/a", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    await core.write(writer, b"one")
    reader = await core.open("d/old")
    await core.rename("d", "e")
    await core.write(writer, b"two")
    await core.fsync(writer)
    await core.close(writer)
    assert store.data("e/a") == b"onetwo" and store.meta("d/a") is None
    assert await core.read(reader) == payload(5000, 3), "a reader goes on reading the moved object"
    await core.close(reader)


@zonal
async def test_unmounting_makes_the_last_uploads_of_open_files_side_by_side(core, store):
    """Found by stopping an R4 run whose service had gone: the unmount flushed
    the open files one after the other, each waiting out --retry-deadline, so
    16 appenders held the stop for 8 minutes."""
    data = {f"f{index}": payload(1000 + index, index) for index in range(4)}
    for name, piece in data.items():
        handle = await core.create(name)
        await core.write(handle, piece)  # left open: the unmount releases it
    held = store.hold("appender.close")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(core.fs.close_all)
        await trio.testing.wait_all_tasks_blocked()
        under_way = store.calls["appender.close"]
        held.set()  # before asserting: a release finishes its upload even when cancelled
    assert under_way == len(data), "every open file's last upload is under way at once"
    assert {name: store.data(name) for name in data} == data


@zonal
async def test_a_streaming_write_s_size_is_seen_while_its_append_is_under_way(core, store, nursery):
    """A WRITE whose bytes a worker reads from a pipe is answered by it before
    the append returns: a stat meanwhile must already see the new size. A
    failed append takes it back (the file has failed)."""
    handle = await core.create("f")
    await core.write(handle, b"x" * 100)
    held = store.hold("appender.append")
    done = trio.Event()

    async def write() -> None:
        await core.write(handle, b"y" * 50)
        done.set()

    nursery.start_soon(write)
    await trio.testing.wait_all_tasks_blocked()
    assert not done.is_set(), "the append waits"
    assert (await core.fstat(handle)).st_size == 150
    held.set()
    await done.wait()
    assert (await core.fstat(handle)).st_size == 150
    await core.fsync(handle)
    assert store.data("f") == b"x" * 100 + b"y" * 50


class _TakenAtOnce:
    """An appender that queues every append at once (``append_now``), as the
    data plane's does for a large WRITE it can hand over without a wait."""

    def __init__(self, monkeypatch) -> None:
        self.taken: list[bytes] = []
        from rapidmount.emulator.memory_store import MemoryAppender

        def append_now(appender, data) -> bool:
            appender._pending += data  # the memory store's own queue: persisted by the next flush
            self.taken.append(bytes(data))
            return True

        monkeypatch.setattr(MemoryAppender, "append_now", append_now)


@zonal
async def test_an_append_taken_at_once_is_written_without_a_wait(core, store, monkeypatch):
    handle = await core.create("f")
    await core.write(handle, b"x" * 100)  # the appender's own call
    taken = _TakenAtOnce(monkeypatch)
    inode = core.fs.inode(handle.ino)
    before = inode.mtime_ns
    written_before = core.fs.writes.stats.bytes_written
    assert core.fs.write_now(handle.fh, 100, b"y" * 50) == 50  # no await: done
    assert taken.taken == [b"y" * 50]
    assert (await core.fstat(handle)).st_size == 150 and inode.mtime_ns >= before
    assert core.fs.writes.stats.bytes_written == written_before + 50
    await core.write(handle, b"z" * 10, 150)  # write() takes the same way first
    assert taken.taken[-1] == b"z" * 10
    await core.fsync(handle)
    assert store.data("f") == b"x" * 100 + b"y" * 50 + b"z" * 10
    await core.close(handle)


@zonal
async def test_a_write_that_needs_a_wait_is_not_taken_at_once(core, store, monkeypatch, nursery):
    """Not at the end, the file held by another operation, failed, or a handle
    that cannot write: ``write_now`` leaves it all to ``write``."""
    handle = await core.create("f")
    await core.write(handle, b"x" * 100)
    taken = _TakenAtOnce(monkeypatch)
    state = core.fs.writes.pending(handle.ino)
    assert core.fs.write_now(handle.fh, 50, b"y") is None  # not an append: write() stages
    async with state.lock:
        assert core.fs.write_now(handle.fh, 100, b"y") is None
    store.put("r", b"abc")
    reader = await core.open("r")
    assert core.fs.write_now(reader.fh, 3, b"y") is None
    assert await core.errno(core.write(reader, b"y", 3)) == errno.EBADF
    assert core.fs.write_now(999, 0, b"y") is None
    assert taken.taken == [] and (await core.fstat(handle)).st_size == 100
    store.append_external("f", b"theirs")  # another writer takes the object over: the next append fails
    await core.errno(core.write(handle, b"lost"))
    await core.errno(core.fsync(handle))
    assert state.failure is not None
    taken.taken.clear()
    assert core.fs.write_now(handle.fh, state.size, b"y") is None
    assert taken.taken == []
    assert await core.errno(core.write(handle, b"y")) == errno.ESTALE  # write() says why


@pytest.mark.parametrize("kind", ["zonal", "hns"])
@pytest.mark.parametrize("renamed", ["file", "folder"])
async def test_a_write_that_comes_while_its_file_is_renamed_is_in_the_moved_object(core, store, kind, renamed,
                                                                                  nursery):
    """A writer goes on while another process renames its file (or the folder
    above it): a WRITE that comes while the bucket moves the object waits for
    the move, then goes to the moved object. None is answered and then dropped."""
    await core.mkdir("d")
    handle = await core.create("d/f")
    await core.write(handle, b"a" * 100)
    old, new = ("d/f", "d/g") if renamed == "file" else ("d", "e")
    gate = store.hold("move_object" if renamed == "file" else "rename_folder")
    moved = trio.Event()

    async def rename() -> None:
        await core.rename(old, new)
        moved.set()

    nursery.start_soon(rename)
    await trio.testing.wait_all_tasks_blocked()  # the move waits in the bucket
    wrote = trio.Event()

    async def write() -> None:
        await core.write(handle, b"b" * 50)
        wrote.set()

    nursery.start_soon(write)
    await trio.testing.wait_all_tasks_blocked()
    assert not wrote.is_set(), "the write waits for the move"
    gate.set()
    await moved.wait()
    await wrote.wait()
    await core.fsync(handle)
    await core.close(handle)
    path = "d/g" if renamed == "file" else "e/f"
    assert store.meta("d/f") is None
    assert store.data(path) == b"a" * 100 + b"b" * 50
    assert await core.read_file(path) == b"a" * 100 + b"b" * 50


@zonal
async def test_a_last_release_that_comes_during_a_rename_closes_nothing_under_the_old_name(core, store, nursery,
                                                                                          caplog):
    """close() returned (its flush persisted every byte), then the kernel's
    release comes while the bucket moves the object: it waits for the move,
    and follows it, so it closes no stream of the name that is gone."""
    handle = await core.create("f")
    await core.write(handle, b"a" * 100)
    await core.call(core.fs.flush, handle.fh)
    gate = store.hold("move_object")
    renamed, released = trio.Event(), trio.Event()

    async def rename() -> None:
        await core.rename("f", "g")
        renamed.set()

    async def release() -> None:
        await core.fs.release(handle.fh)
        released.set()

    nursery.start_soon(rename)
    await trio.testing.wait_all_tasks_blocked()
    nursery.start_soon(release)
    await trio.testing.wait_all_tasks_blocked()
    gate.set()
    await renamed.wait()
    await released.wait()
    assert store.meta("f") is None and store.data("g") == b"a" * 100
    assert await core.read_file("g") == b"a" * 100
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.text
