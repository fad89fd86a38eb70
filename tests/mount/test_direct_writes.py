"""Write-only opens bypass the kernel's page cache, and every open of their file does too.

Through the page cache, the kernel copies each WRITE into page-cache pages
before it sends it: pages nobody reads (the next open of the file drops
them), which cost the writer a fresh page per 4 KiB. So a write-only open is
direct while no open of its file uses the cache, and while it is open,
every other open of the file is direct as well, so no reader caches a page
the writer is changing. ``cachestat(2)`` counts a file's pages in the
kernel's page cache; each test reads it on a real mount.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os

import pytest

from tests.mount.test_write import BUCKET, _hang_guard, _mount, _workdir, emu, mount  # noqa: F401 (fixtures)
from tests.mountutil import after_release, payload, write_all

MiB = 1 << 20
_CACHESTAT = 451  # the same number on x86_64 and arm64 (Linux 6.5 and later)
_libc = ctypes.CDLL(None, use_errno=True)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def cached_pages(fd: int) -> int | None:
    """Pages of ``fd``'s file in the kernel's page cache; None on a kernel
    without cachestat(2) (before 6.5), where the tests check the bytes alone."""
    whole, stat = _Range(0, 0), _Stat()
    if _libc.syscall(_CACHESTAT, fd, ctypes.byref(whole), ctypes.byref(stat), 0) != 0:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:
            return None
        raise OSError(code, os.strerror(code))
    return stat.nr_cache


def assert_no_pages(fd: int) -> None:
    assert cached_pages(fd) in (0, None)


def assert_pages(fd: int, at_least: int = 1) -> None:
    pages = cached_pages(fd)
    assert pages is None or pages >= at_least, pages


@pytest.fixture
def work(emu, mount, request):  # noqa: F811
    return _workdir(emu, BUCKET, mount.path, request)


def _write_in_pieces(fd: int, data: bytes, piece: int = MiB) -> None:
    for start in range(0, len(data), piece):
        write_all(fd, data[start:start + piece])


@pytest.mark.parametrize("how", ["create", "truncate", "append"])
def test_a_write_only_open_puts_none_of_its_bytes_in_the_page_cache(mount, emu, work, how):  # noqa: F811
    path = work.path / "out.bin"
    first = payload(3 * MiB + 123, 1)
    if how != "create":
        path.write_bytes(first)
    flags = {"create": os.O_CREAT | os.O_EXCL, "truncate": os.O_TRUNC, "append": os.O_APPEND}[how]
    data = payload(8 * MiB + 4097, 2)
    fd = os.open(path, os.O_WRONLY | flags)
    try:
        _write_in_pieces(fd, data)
        assert_no_pages(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    expected = first + data if how == "append" else data
    assert emu.read_object(BUCKET, work.obj("out.bin")) == expected
    assert path.read_bytes() == expected


def test_read_write_opens_still_write_through_the_page_cache(mount, emu, work):  # noqa: F811
    data = payload(4 * MiB, 3)
    fd = os.open(work.path / "rw.bin", os.O_RDWR | os.O_CREAT)
    try:
        _write_in_pieces(fd, data)
        assert_pages(fd, len(data) // 4096)
        assert os.pread(fd, len(data), 0) == data
    finally:
        os.close(fd)


def test_with_no_direct_writes_a_write_only_open_writes_through_the_page_cache(emu):  # noqa: F811
    with _mount(emu, BUCKET, "--no-direct-writes") as m:
        path = m.path / "cached-writes.bin"
        data = payload(4 * MiB, 4)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            _write_in_pieces(fd, data)
            assert_pages(fd, len(data) // 4096)
        finally:
            os.close(fd)
        assert emu.read_object(BUCKET, "cached-writes.bin") == data


def test_while_a_write_only_handle_is_open_every_open_of_its_file_reads_around_the_cache(mount, emu, work):  # noqa: F811
    """A reader opened after the writer caches nothing, so it sees every
    append at once, a partial last page included (the pages a cached reader
    would have kept past the old end of the file)."""
    path = work.path / "log.txt"
    writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    written = b""
    try:
        reader = os.open(path, os.O_RDONLY)
        try:
            for line in range(200):
                record = f"line {line} ".encode() * (1 + line % 37) + b"\n"  # sizes that end mid-page
                write_all(writer, record)
                written += record
                assert os.pread(reader, len(written) + 4096, 0) == written, f"after line {line}"
            assert_no_pages(reader)
            os.fsync(writer)
            with open(path, "r+b") as both:  # read-write, opened while the writer is: around the cache too
                assert both.read() == written
                assert_no_pages(both.fileno())
        finally:
            os.close(reader)
    finally:
        os.close(writer)
    assert after_release(lambda: emu.read_object(BUCKET, work.obj("log.txt")) == written)
    # The writer gone, a new reader uses the page cache again, and finds the file whole.
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, len(written) + 1, 0) == written
        assert_pages(fd)
    finally:
        os.close(fd)


def test_a_write_only_open_while_a_reader_caches_the_file_writes_through_the_cache(mount, emu, work):  # noqa: F811
    """The reader came first and holds pages: the writer updates them as it
    writes, so the reader sees an overwrite and an append at once."""
    path = work.path / "shared.bin"
    first = payload(MiB + 1000, 5)
    path.write_bytes(first)
    reader = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(reader, len(first) + 1, 0) == first
        cached = cached_pages(reader)
        assert_pages(reader)
        writer = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            tail = payload(2 * MiB, 6)
            write_all(writer, tail)
            assert cached is None or cached_pages(reader) > cached, "the writer's pages went to the page cache"
            assert os.pread(reader, len(first) + len(tail) + 1, 0) == first + tail
        finally:
            os.close(writer)
    finally:
        os.close(reader)
    assert after_release(lambda: emu.read_object(BUCKET, work.obj("shared.bin")) == first + tail)


def test_o_direct_opens_stay_direct(mount, emu, work):  # noqa: F811
    path = work.path / "direct.bin"
    data = payload(2 * MiB, 7)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, len(data), 0) == data
        assert_no_pages(fd)
    finally:
        os.close(fd)


def _shared_mmap_of_direct_handles(mount) -> bool:
    """Whether the kernel granted FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6 and later)."""
    granted = [line for line in mount.log().splitlines() if "granted " in line and "FUSE 7." in line]
    assert granted, "the mount logs what INIT granted"
    return "DIRECT_IO_ALLOW_MMAP" in granted[0].split("granted ")[1].split(";")[0]


def _shared_mapping_reads(fd: int, data: bytes, allowed: bool) -> None:
    """A MAP_SHARED mapping of a direct handle: the exact bytes where the
    kernel allows it, else ENODEV."""
    if not allowed:
        with pytest.raises(OSError) as refused:
            mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ)
        assert refused.value.errno == errno.ENODEV
        return
    with mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ) as shared:
        assert hashlib.sha256(shared).digest() == hashlib.sha256(data).digest()


def test_a_shared_mmap_of_a_direct_handle_works_where_the_kernel_allows_it_and_a_private_one_works(
        mount, emu, work):  # noqa: F811
    path = work.path / "mapped.bin"
    data = payload(3 * 4096 + 10, 8)
    path.write_bytes(data)
    writer = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        fd = os.open(path, os.O_RDONLY)  # direct: a write-only handle of the file is open
        try:
            _shared_mapping_reads(fd, data, _shared_mmap_of_direct_handles(mount))
            with mmap.mmap(fd, len(data), mmap.MAP_PRIVATE, mmap.PROT_READ) as private:
                # hashlib lets go of the GIL while it reads the pages: the emulator
                # answering their READs runs in this process
                assert hashlib.sha256(private).digest() == hashlib.sha256(data).digest()
        finally:
            os.close(fd)
    finally:
        os.close(writer)
    fd = os.open(path, os.O_RDONLY)  # the writer gone: cached, and shared mappings work again
    try:
        with mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ) as shared:
            assert hashlib.sha256(shared).digest() == hashlib.sha256(data).digest()
    finally:
        os.close(fd)


def test_a_closed_descriptor_of_a_writer_lets_the_next_opens_use_the_cache_until_it_writes_again(mount, emu, work):  # noqa: F811
    """close() sends FLUSH at once and RELEASE later, in the background: an
    open right after a writer's close must get a handle whose shared mmap
    works (np.save, then np.load(mmap_mode="r")). Closing one of two
    descriptors of the writer stands for a RELEASE that has not come yet."""
    path = work.path / "saved.npy"
    data = payload(2 * 4096 + 123, 9)
    writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        write_all(writer, data)
        os.close(os.dup(writer))  # a FLUSH; the open file, and its handle, live on
        fd = os.open(path, os.O_RDONLY)
        try:
            with mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ) as shared:
                assert hashlib.sha256(shared).digest() == hashlib.sha256(data).digest()
        finally:
            os.close(fd)
        write_all(writer, b"more")  # the handle writes again: opens from now on are direct
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(fd, len(data) + 10, 0) == data + b"more"  # direct: the write is seen at once
            _shared_mapping_reads(fd, data + b"more", _shared_mmap_of_direct_handles(mount))
        finally:
            os.close(fd)
    finally:
        os.close(writer)
