"""The core test level: the filesystem core driven directly over MemoryStore.

No FUSE, no gRPC, no root. :class:`Core` stands in for the kernel: it
resolves paths with ``lookup`` component by component, calls ``create``
only for a name the lookup did not find (O_CREAT), sends ``flush`` then
``release`` at close, and keeps a file position per handle as ``write(2)``
does. Every core call runs under a deadline: the store never blocks, so a
call that does not return in time is a hang in the core, and fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass

import pytest
import trio

from rapidmount.core import Filesystem, FSError
from rapidmount.core.settings import CoreSettings
from rapidmount.emulator.memory_store import MemoryStore
from rapidmount.superblock.inodes import ROOT_INODE, Inode
from rapidmount.superblock.names import EntryKind
from tests.clock import FakeClock

KINDS = ["zonal", "hns", "flat"]
MiB = 1 << 20
CALL_DEADLINE = 10.0  # seconds; MemoryStore answers at once, so only a hang reaches it


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ at every offset of one pattern period."""
    pattern = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(65_521))
    return (pattern * (size // len(pattern) + 1))[:size]


@dataclass
class Handle:
    fh: int
    path: str
    ino: int
    flags: int
    pos: int = 0


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


class Core:
    """A path-level driver over a running :class:`Filesystem`."""

    def __init__(self, fs: Filesystem, store: MemoryStore) -> None:
        self.fs = fs
        self.store = store

    # -- plumbing ------------------------------------------------------------------------------

    @staticmethod
    async def call(fn, *args):
        with trio.fail_after(CALL_DEADLINE):
            return await fn(*args)

    @staticmethod
    async def errno(awaitable) -> int | None:
        """The errno the awaited call failed with, or None if it succeeded."""
        try:
            with trio.fail_after(CALL_DEADLINE):
                await awaitable
        except FSError as err:
            return err.errno
        return None

    async def parent_of(self, path: str) -> tuple[Inode, bytes]:
        parts = _split(path)
        parent = self.fs.inode(ROOT_INODE)
        for part in parts[:-1]:
            parent = await self.call(self.fs.lookup, parent.ino, part.encode("utf-8", "surrogateescape"))
        return parent, parts[-1].encode("utf-8", "surrogateescape")

    async def lookup_path(self, path: str | bytes) -> Inode:
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        inode = self.fs.inode(ROOT_INODE)
        for part in _split(path):
            inode = await self.call(self.fs.lookup, inode.ino, part.encode("utf-8", "surrogateescape"))
        return inode

    # -- attributes ------------------------------------------------------------------------------

    async def stat(self, path: str):
        inode = await self.lookup_path(path)
        return self.fs.attributes_of(await self.call(self.fs.getattr, inode.ino))

    async def fstat(self, handle: Handle):
        return self.fs.attributes_of(await self.call(self.fs.getattr, handle.ino))

    async def exists(self, path: str) -> bool:
        try:
            await self.lookup_path(path)
        except FSError as err:
            if err.errno == errno.ENOENT:
                return False
            raise
        return True

    # -- files -----------------------------------------------------------------------------------

    async def open(self, path: str, flags: int = os.O_RDONLY) -> Handle:
        """open(2) as the kernel runs it: lookup, then open, or create for a new name."""
        parent, name = await self.parent_of(path)
        try:
            inode = await self.call(self.fs.lookup, parent.ino, name)
        except FSError as err:
            if err.errno != errno.ENOENT or not flags & os.O_CREAT:
                raise
            fh, inode = await self.call(self.fs.create, parent.ino, name, flags)
            return Handle(fh, path, inode.ino, flags)
        if flags & os.O_CREAT and flags & os.O_EXCL:
            raise FSError(errno.EEXIST)  # the kernel's answer for a name it found
        if flags & os.O_DIRECTORY and inode.kind is not EntryKind.DIR:
            raise FSError(errno.ENOTDIR)  # the kernel's answer, too
        fh, _, _ = await self.call(self.fs.open, inode.ino, flags)
        return Handle(fh, path, inode.ino, flags)

    async def create(self, path: str, flags: int = os.O_RDWR | os.O_CREAT | os.O_EXCL) -> Handle:
        return await self.open(path, flags | os.O_CREAT)

    async def write(self, handle: Handle, data: bytes, offset: int | None = None) -> int:
        """pwrite(2) at ``offset``, else write(2) at the handle's position (the end for O_APPEND)."""
        if not data:  # the kernel answers a zero-length write itself
            if handle.flags & os.O_ACCMODE == os.O_RDONLY:
                raise FSError(errno.EBADF)
            return 0
        positioned = offset is None
        if positioned:
            if handle.flags & os.O_APPEND:
                handle.pos = (await self.fstat(handle)).st_size
            offset = handle.pos
        written = 0
        for start in range(0, len(data), MiB):  # the kernel sends at most 1 MiB per request
            written += await self.call(self.fs.write, handle.fh, offset + start, data[start:start + MiB])
        if positioned:
            handle.pos = offset + written
        return written

    async def read(self, handle: Handle, size: int = 1 << 40, offset: int | None = None) -> bytes:
        """pread(2) at ``offset`` (else at the position), in kernel-sized requests, to EOF or ``size``."""
        start = handle.pos if offset is None else offset
        out = bytearray()
        while len(out) < size:
            want = min(128 * 1024, size - len(out))
            chunk = bytes(await self.call(self.fs.read, handle.fh, start + len(out), want))
            out += chunk
            if len(chunk) < want:
                break
        if offset is None:
            handle.pos = start + len(out)
        return bytes(out)

    async def fsync(self, handle: Handle) -> None:
        await self.call(self.fs.fsync, handle.fh)

    async def close(self, handle: Handle) -> None:
        """close(2): flush (its error is returned), then release (always)."""
        try:
            await self.call(self.fs.flush, handle.fh)
        finally:
            with trio.fail_after(CALL_DEADLINE):
                await self.fs.release(handle.fh)

    async def ftruncate(self, handle: Handle, size: int) -> None:
        await self.call(self.fs.truncate, handle.ino, size, handle.fh)

    async def truncate(self, path: str, size: int) -> None:
        inode = await self.lookup_path(path)
        await self.call(self.fs.truncate, inode.ino, size)

    async def read_file(self, path: str) -> bytes:
        handle = await self.open(path)
        try:
            return await self.read(handle)
        finally:
            await self.close(handle)

    async def write_file(self, path: str, data: bytes, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> None:
        handle = await self.open(path, flags)
        try:
            await self.write(handle, data)
        finally:
            await self.close(handle)

    # -- names -----------------------------------------------------------------------------------

    async def mkdir(self, path: str) -> Inode:
        parent, name = await self.parent_of(path)
        return await self.call(self.fs.mkdir, parent.ino, name)

    async def rmdir(self, path: str) -> None:
        parent, name = await self.parent_of(path)
        await self.call(self.fs.rmdir, parent.ino, name)

    async def unlink(self, path: str) -> None:
        parent, name = await self.parent_of(path)
        await self.call(self.fs.unlink, parent.ino, name)

    async def rename(self, old: str, new: str, flags: int = 0) -> None:
        old_parent, old_name = await self.parent_of(old)
        new_parent, new_name = await self.parent_of(new)
        await self.call(self.fs.rename, old_parent.ino, old_name, new_parent.ino, new_name, flags)

    async def symlink(self, path: str, target: str) -> Inode:
        parent, name = await self.parent_of(path)
        return await self.call(self.fs.symlink, parent.ino, name, target.encode())

    async def readlink(self, path: str) -> str:
        inode = await self.lookup_path(path)
        return await self.call(self.fs.readlink, inode.ino)

    async def listdir(self, path: str = "") -> list[str]:
        """readdir(3) of a directory, without ``.`` and ``..``."""
        inode = await self.lookup_path(path)
        fh = await self.call(self.fs.opendir, inode.ino)
        names = []
        try:
            with trio.fail_after(CALL_DEADLINE):
                async for name, child, _ in self.fs.readdir(fh, 0):
                    if name not in (".", ".."):
                        self.fs.entry_returned(child.ino)
                        names.append(name)
        finally:
            self.fs.releasedir(fh)
        return names


class FullDisk:
    """A temp dir where staged copies may grow by ``room`` bytes in all.

    ``how``: "reservations" refuses a ``posix_fallocate`` past the room (as
    tmpfs, ext4 and xfs do); "short writes" has no reservations and writes
    what fits, then refuses (a short ``pwrite``, then ENOSPC).
    """

    def __init__(self, room: int, how: str) -> None:
        self.room = room
        self.how = how
        self._pwrite = os.pwrite

    def _growth(self, fd: int, end: int) -> int:
        return max(0, end - os.fstat(fd).st_size)

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        if self.how == "short writes":
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        growth = self._growth(fd, offset + length)
        if growth > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= growth
        os.ftruncate(fd, max(os.fstat(fd).st_size, offset + length))

    def pwrite(self, fd: int, data, offset: int) -> int:
        if self.how == "short writes":
            fits = os.fstat(fd).st_size + self.room - offset
            if fits <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = memoryview(data)[:fits]
            self.room -= self._growth(fd, offset + len(data))
        return self._pwrite(fd, data, offset)


@contextlib.contextmanager
def full_temp_dir(room: int, how: str = "reservations"):
    """While the block runs, staged copies have ``room`` bytes to grow (see :class:`FullDisk`)."""
    disk = FullDisk(room, how)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "posix_fallocate", disk.posix_fallocate)
        patch.setattr(os, "pwrite", disk.pwrite)
        yield disk


def settings_of(**values) -> CoreSettings:
    """The core's settings with these values; a listing is trusted as long as
    the metadata unless told otherwise, as with the mount's flags."""
    if "metadata_ttl" in values:
        values.setdefault("listing_ttl", values["metadata_ttl"])
    return CoreSettings(**values)


async def start_core(nursery: trio.Nursery, store: MemoryStore, *, clock: FakeClock | None = None,
                     **values) -> Core:
    """A mount of ``store`` with these settings, whose TTLs and refusal
    windows run on ``clock`` (time stands still unless the test advances it)."""
    fs = Filesystem(settings_of(**values), store, uid=os.getuid(), gid=os.getgid(), clock=clock or FakeClock())
    fs.attach(nursery)
    return Core(fs, store)


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def store(kind) -> MemoryStore:
    return MemoryStore(kind=kind)


@pytest.fixture
def clock() -> FakeClock:
    """The time of the ``core`` and ``other`` mounts."""
    return FakeClock()


@pytest.fixture
def core_options() -> dict:
    """Settings of the ``core`` fixture (``CoreSettings`` fields); override it in a module or with parametrize."""
    return {}


@pytest.fixture
async def core(nursery, store, clock, core_options):
    core = await start_core(nursery, store, clock=clock, **core_options)
    yield core
    with trio.fail_after(CALL_DEADLINE):
        await core.fs.close_all()


@pytest.fixture
def other(nursery, store, clock):
    """A factory of a second mount of the same bucket: ``await other(**settings)``."""
    async def make(**values) -> Core:
        return await start_core(nursery, store, clock=clock, **values)
    return make
