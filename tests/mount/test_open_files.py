"""Open files follow POSIX when their name changes: renamed files keep every
later write under the new name, unlinked ones accept writes and vanish.

Each case runs on the zonal bucket (streaming appends) and with staged
writes (a regional bucket, or a random write on the zonal one), through one
handle and through two.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import pathlib
import queue
import threading
import time

import pytest

from tests.mountutil import payload
from tests.mount.test_write import (  # noqa: F401 (fixtures)
    BUCKET, FLAT, HNS, KINDS, _hang_guard, emu, mount_per_bucket)

MiB = 1 << 20


bucket_mount, work = mount_per_bucket([BUCKET, FLAT, HNS])


def _open_for_write(work, emu, name: str, staged: bool) -> int:
    """A descriptor of a new file; ``staged`` forces the local copy even on the zonal bucket."""
    fd = os.open(work.path / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    if staged and KINDS[work.bucket] == "zonal":
        os.pwrite(fd, b"x", 5)  # a write past the end is not an append: the file is staged
        os.ftruncate(fd, 0)
    return fd


@pytest.mark.parametrize("staged", [False, True], ids=["streaming", "staged"])
def test_renamed_while_open_keeps_every_byte(emu, work, staged):
    first, second = payload(3 * MiB + 5, 1), payload(MiB + 77, 2)
    fd = _open_for_write(work, emu, "c2", staged)
    try:
        os.write(fd, first)
        os.fsync(fd)
        os.rename(work.path / "c2", work.path / "c2.new")
        os.write(fd, second)
        os.fsync(fd)
        assert emu.read_object(work.bucket, work.obj("c2.new")) == first + second, "fsync after the rename"
    finally:
        os.close(fd)
    assert emu.read_object(work.bucket, work.obj("c2.new")) == first + second
    assert emu.object_info(work.bucket, work.obj("c2")) is None, "close must not bring the old name back"
    assert (work.path / "c2.new").read_bytes() == first + second
    assert sorted(os.listdir(work.path)) == ["c2.new"]


@pytest.mark.parametrize("staged", [False, True], ids=["streaming", "staged"])
def test_renamed_while_open_through_two_handles(emu, work, staged):
    fd1 = _open_for_write(work, emu, "two", staged)
    try:
        os.write(fd1, b"one|")
        os.rename(work.path / "two", work.path / "two.moved")
        fd2 = os.open(work.path / "two.moved", os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd2, b"two|")
            os.pwrite(fd1, b"three|", 8)  # at the end, where fd2 left it
            os.fsync(fd1)
        finally:
            os.close(fd2)
    finally:
        os.close(fd1)
    assert emu.read_object(work.bucket, work.obj("two.moved")) == b"one|two|three|"
    assert emu.object_info(work.bucket, work.obj("two")) is None


@pytest.mark.parametrize("staged", [False, True], ids=["streaming", "staged"])
def test_unlinked_while_open_accepts_writes_and_uploads_nothing(emu, work, staged):
    fd = _open_for_write(work, emu, "tmp", staged)
    try:
        os.write(fd, b"before|")
        os.fsync(fd)
        os.unlink(work.path / "tmp")
        assert not (work.path / "tmp").exists()
        os.write(fd, b"after|")
        os.fsync(fd)
        assert os.pread(fd, 100, 0) == b"before|after|", "the open file still holds every byte"
        assert os.fstat(fd).st_size == len(b"before|after|")
    finally:
        os.close(fd)
    assert emu.object_info(work.bucket, work.obj("tmp")) is None, "an unlinked file must not reappear"
    assert os.listdir(work.path) == []


@pytest.mark.parametrize("staged", [False, True], ids=["streaming", "staged"])
def test_unlinked_while_open_through_two_handles(emu, work, staged):
    fd1 = _open_for_write(work, emu, "gone", staged)
    os.write(fd1, b"a")
    fd2 = os.open(work.path / "gone", os.O_WRONLY | os.O_APPEND)
    try:
        os.unlink(work.path / "gone")
        os.write(fd2, b"b")
        os.write(fd1, b"c")
    finally:
        os.close(fd2)
        os.close(fd1)
    assert emu.object_info(work.bucket, work.obj("gone")) is None
    # The name is free again: a new file there is a new object.
    (work.path / "gone").write_bytes(b"new")
    assert emu.read_object(work.bucket, work.obj("gone")) == b"new"


def test_reader_opened_before_a_rename_reads_on(emu, work):
    data = payload(6 * MiB + 3, 3)
    emu.seed(work.bucket, work.obj("r"), data)
    with open(work.path / "r", "rb", buffering=0) as reader:
        head = reader.read(MiB)
        os.rename(work.path / "r", work.path / "r.moved")
        rest = reader.read()
    assert head + rest == data


def test_a_read_on_its_way_while_the_file_is_renamed_gets_its_bytes(emu, work):
    """The reader waits on a slow stream when the rename comes: the read that
    waits and every later one get the file's bytes, not EBADF."""
    data = payload(16 * MiB + 5, 4)
    emu.seed(work.bucket, work.obj("slow"), data)
    fd = os.open(work.path / "slow", os.O_RDONLY)
    emu.set_stream_bandwidth(8 * MiB)
    try:
        head = os.read(fd, 2 * MiB)  # the first block; the next is on its way
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reader = queue.SimpleQueue()
            rest = pool.submit(_read_to_end, fd, reader)
            _wait_in_read(reader.get(timeout=60))
            os.rename(work.path / "slow", work.path / "slow.moved")
            emu.set_stream_bandwidth(None)
            assert head + rest.result(timeout=120) == data
    finally:
        emu.set_stream_bandwidth(None)
        os.close(fd)


def _read_to_end(fd: int, started: queue.SimpleQueue | None = None) -> bytes:
    if started is not None:
        started.put(threading.get_native_id())
    pieces = []
    while piece := os.read(fd, MiB):
        pieces.append(piece)
    return b"".join(pieces)


def _wait_in_read(tid: int) -> None:
    """Until thread ``tid`` of this process waits in the kernel on a FUSE
    read: its READ sent, or the pages a READ of the kernel's readahead fills."""
    deadline = time.monotonic() + 60
    stack = pathlib.Path(f"/proc/self/task/{tid}/stack")
    while not ("fuse" in (text := stack.read_text()) or "folio_wait" in text):
        assert time.monotonic() < deadline, f"the read never reached the mount: {text}"
        time.sleep(0.001)


def test_a_folder_renamed_again_and_again_while_a_thread_writes_below_it_keeps_every_byte(emu, work):
    """Writes that come while the bucket moves the folder (and the object
    below it, open for writing) wait for the move, then go to the moved
    object: none is answered and then dropped. (The kernel itself keeps a
    write and a rename of the same file apart, not of a folder above it.)"""
    import threading

    flat = KINDS[work.bucket] == "flat"  # without --rename-dir-limit, refused: the bytes stay where they are
    chunks = [payload(256 * 1024 + index, index) for index in range(160)]
    names = ["r0", "r1"]
    os.mkdir(work.path / names[0])
    fd = os.open(work.path / names[0] / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    done = threading.Event()

    def write() -> None:
        try:
            for chunk in chunks:
                os.write(fd, chunk)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    renames = 0
    try:
        while not done.is_set() and not flat:
            os.rename(work.path / names[renames % 2], work.path / names[(renames + 1) % 2])
            renames += 1
        if flat:
            with pytest.raises(OSError) as refused:
                os.rename(work.path / names[0], work.path / names[1])
            assert refused.value.errno == errno.ENOTSUP
        writer.join()
        os.fsync(fd)
    finally:
        done.wait()
        os.close(fd)
    final = names[renames % 2] + "/f"
    assert flat or renames >= 2, "the writer finished before the renames began"
    assert emu.read_object(work.bucket, work.obj(final)) == b"".join(chunks), f"after {renames} renames"
    assert (work.path / final).read_bytes() == b"".join(chunks)
