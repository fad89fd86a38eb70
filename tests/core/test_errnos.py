"""One case per row of the "Operation → errno" table of docs/semantics.md.

Each row is an async function ``(core, store) -> errno | None`` and the
result the table gives. Rows the kernel answers by itself (O_DIRECTORY,
O_EXCL on a known name, mknod, fallocate, locks, xattrs) are checked as far
as the core and its FUSE adapter take part in them.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

import pyfuse3
import pytest
import trio

from rapidmount.core import FSError
from rapidmount.shared import fuse_abi as abi
from rapidmount.fuse.init import Wants
from rapidmount.fuse.operations import Operations
from rapidmount.fuse.reference import FuseOperations
from rapidmount.fuse.stats import OperationStats
from rapidmount.storage.errors import StorageCode
from tests.core.conftest import KINDS, MiB, full_temp_dir, payload, start_core

Code = StorageCode
LONG = "n" * 256
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2

@dataclass
class Row:
    doc: str  # the row's text in the table
    run: object  # async (core, store) -> errno or None
    expected: int | None
    kinds: tuple = tuple(KINDS)
    options: dict = field(default_factory=dict)


ROWS: list[Row] = []


def row(doc: str, expected: int | None, *, kinds=tuple(KINDS), **options):
    def register(fn):
        ROWS.append(Row(doc, fn, expected, tuple(kinds), options))
        return fn
    return register


async def err(awaitable) -> int | None:
    try:
        with trio.fail_after(10):
            await awaitable
    except FSError as exc:
        return exc.errno
    return None


async def first_errno(*awaitables) -> int | None:
    """The errno of the first of these calls that fails (the later ones are not made)."""
    for awaitable in awaitables:
        result = await err(awaitable)
        if result is not None:
            for rest in awaitables:
                rest.close()
            return result
    return None


async def streaming(core, name="s", data=b"durable|"):
    handle = await core.create(name)
    await core.write(handle, data)
    await core.fsync(handle)
    return handle


async def staged(core, store, name="f"):
    store.put(name, b"0123456789")
    handle = await core.open(name, os.O_RDWR)
    await core.write(handle, b"XY", 2)
    return handle


# ---------------------------------------------------------------- lookup and stat

@row("stat/lstat/lookup, existing name", None)
async def _(core, store):
    store.put("d/f", b"x")
    await core.stat("d/f")
    await core.stat("d")


@row("stat/lookup, missing name", errno.ENOENT)
async def _(core, store):
    return await err(core.stat("missing"))


@row("stat/lookup, name longer than 255 bytes", errno.ENAMETOOLONG)
async def _(core, store):
    return await err(core.fs.lookup(1, LONG.encode()))


@row("stat/lookup, name not valid UTF-8", errno.ENOENT)
async def _(core, store):
    return await err(core.fs.lookup(1, b"bad-\xff"))


@row("lookup through a regular file", errno.ENOTDIR)
async def _(core, store):
    store.put("file.txt", b"x")
    return await err(core.stat("file.txt/x"))


@row("stat/lookup, storage unreachable past the retry deadline", errno.EIO)
async def _(core, store):
    store.fail_next("stat_name", Code.UNAVAILABLE)
    return await err(core.stat("x"))


@row("any operation, access denied by storage", errno.EACCES)
async def _(core, store):
    store.put("f", b"x")
    results = set()
    for method, action in [("stat_name", lambda: core.stat("g")),
                           ("list_directory", lambda: core.listdir()),
                           ("reader.read", lambda: core.read_file("f")),
                           ("delete_object", lambda: core.unlink("f"))]:
        store.fail_next(method, Code.PERMISSION_DENIED)
        results.add(await err(action()))
    return results.pop() if len(results) == 1 else results


@row("any operation, no access token to be had past --retry-deadline", errno.EIO)
async def _(core, store):
    # The client reports a token failure as UNAVAILABLE, then EIO at the deadline.
    store.put("f", b"x")
    await core.stat("f")
    store.fail_next("list_directory", Code.UNAVAILABLE)
    return await err(core.listdir())


# ---------------------------------------------------------------- readdir and open

@row("readdir", None)
async def _(core, store):
    store.put("b", b"")
    store.put("a/x", b"")
    fh = await core.fs.opendir(1)
    names = [name async for name, _, _ in core.fs.readdir(fh, 0)]
    core.fs.releasedir(fh)
    assert names == [".", "..", "a", "b"]


@row("open with O_RDONLY, O_WRONLY or O_RDWR, with or without O_APPEND or O_TRUNC", None)
async def _(core, store):
    store.put("f", b"abc")
    for access in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):
        for extra in (0, os.O_APPEND, os.O_TRUNC):
            await core.close(await core.open("f", access | extra))


@row("open of a directory for writing", errno.EISDIR)
async def _(core, store):
    store.put("d/f", b"")
    return await err(core.open("d", os.O_WRONLY))


@row("open with O_DIRECTORY of a file", errno.ENOTDIR)
async def _(core, store):
    # The kernel refuses O_DIRECTORY of a file itself; the core's part is opendir.
    store.put("f", b"")
    inode = await core.lookup_path("f")
    return await err(core.fs.opendir(inode.ino))


@row("open with O_CREAT, new name", None)
async def _(core, store):
    await core.close(await core.open("new", os.O_WRONLY | os.O_CREAT))
    assert await core.listdir() == ["new"]


@row("open with O_CREAT and O_EXCL, existing name", errno.EEXIST)
async def _(core, store):
    store.put("f", b"")
    # The kernel answers for a name it knows; the core's create refuses too.
    return await err(core.fs.create(1, b"f", os.O_RDWR | os.O_CREAT | os.O_EXCL))


@row("open with O_CREAT, name made elsewhere that the mount cached as missing (zonal)", errno.EEXIST,
     kinds=["zonal"])
async def _(core, store):
    assert await err(core.stat("n")) == errno.ENOENT
    store.put("n", b"theirs")
    return await err(core.fs.create(1, b"n", os.O_RDWR | os.O_CREAT))


@row("open with O_CREAT, name made elsewhere that the mount cached as missing (other buckets)",
     errno.ESTALE, kinds=["hns", "flat"])
async def _(core, store):
    assert await err(core.stat("n")) == errno.ENOENT
    store.put("n", b"theirs")
    fh, _ = await core.fs.create(1, b"n", os.O_RDWR | os.O_CREAT)
    await core.fs.write(fh, 0, b"mine")
    result = await err(core.fs.flush(fh))
    await core.fs.release(fh)
    assert store.data("n") == b"theirs"
    return result


@row("create, mkdir, symlink or rename to a name longer than 255 bytes", errno.ENAMETOOLONG)
async def _(core, store):
    store.put("f", b"")
    results = {await err(core.fs.create(1, LONG.encode(), os.O_RDWR | os.O_CREAT)),
               await err(core.mkdir(LONG)), await err(core.symlink(LONG, "t")),
               await err(core.rename("f", LONG))}
    return results.pop() if len(results) == 1 else results


@row("create, mkdir, symlink or rename to a name not valid UTF-8", errno.EINVAL)
async def _(core, store):
    store.put("f", b"")
    bad = b"bad-\xfe"
    results = {await err(core.fs.create(1, bad, os.O_RDWR | os.O_CREAT)), await err(core.fs.mkdir(1, bad)),
               await err(core.fs.symlink(1, bad, b"t")), await err(core.fs.rename(1, b"f", 1, bad))}
    assert store.names() == ["f"]
    return results.pop() if len(results) == 1 else results


@row("create, mkdir, symlink or rename to a name holding CR or LF", errno.EINVAL)
async def _(core, store):
    store.put("f", b"")
    results = set()
    for bad in (b"a\nb", b"a\rb"):
        results |= {await err(core.fs.create(1, bad, os.O_RDWR | os.O_CREAT)), await err(core.fs.mkdir(1, bad)),
                    await err(core.fs.symlink(1, bad, b"t")), await err(core.fs.rename(1, b"f", 1, bad))}
    assert store.names() == ["f"]
    return results.pop() if len(results) == 1 else results


# ---------------------------------------------------------------- read

@row("read at or past end of file", None)
async def _(core, store):
    store.put("f", b"abc")
    handle = await core.open("f")
    assert await core.read(handle, 10, 3) == b"" and await core.read(handle, 10, 99) == b""


@row("read, pinned generation gone and not cached", errno.ESTALE)
async def _(core, store):
    store.put("f", payload(5 * MiB))
    handle = await core.open("f")
    store.put("f", b"new")
    return await err(core.read(handle, 100, 4 * MiB))


@row("read, failures past --retry-deadline", errno.EIO)
async def _(core, store):
    store.put("f", payload(5 * MiB))
    handle = await core.open("f")
    store.fail_next("reader.read", Code.UNAVAILABLE, times=100)  # prefetches fail too
    result = await err(core.read(handle, 100, 0))
    store.clear_faults()
    assert await core.read(handle, 100, 0) == payload(100), "the next read tries again"
    return result


@row("read, CRC32C mismatch", errno.EIO)
async def _(core, store):
    # The client retries mismatches; one that outlasts the deadline reaches the core as a
    # failed read (MemoryStore has no checksum faults: DATA_LOSS stands for it).
    store.put("f", payload(5 * MiB))
    handle = await core.open("f")
    store.fail_next("reader.read", Code.DATA_LOSS, times=100)  # prefetches fail too
    return await err(core.read(handle, 100, 0))


@row("read racing with the release of its handle", errno.EBADF)
async def _(core, store):
    store.put("f", payload(5 * MiB))
    handle = await core.open("f")
    results = []

    async def reader():
        results.append(await err(core.fs.read(handle.fh, 0, 128 * 1024)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await core.fs.release(handle.fh)  # runs before the read's first checkpoint completes
    assert results[0] in (None, errno.EBADF), "a racing read either finished first or is EBADF"
    return await err(core.fs.read(handle.fh, 0, 1))


# ---------------------------------------------------------------- write, fsync, close

@row("write on a handle open for writing", None)
async def _(core, store):
    handle = await core.create("f")
    assert await core.write(handle, b"abc") == 3
    await core.close(handle)


@row("write on a handle opened read-only", errno.EBADF)
async def _(core, store):
    store.put("f", b"abc")
    handle = await core.open("f")
    return await err(core.write(handle, b"x", 0))


@row("write, streaming writer taken over by another client", errno.ESTALE, kinds=["zonal"])
async def _(core, store):
    handle = await streaming(core)
    store.append_external("s", b"theirs")
    return await first_errno(core.write(handle, b"more"), core.fsync(handle))


@row("write, read, fsync, close after a streaming write failed", errno.EIO, kinds=["zonal"])
async def _(core, store):
    handle = await streaming(core)
    store.fail_next("appender.append", Code.UNAVAILABLE)
    first = await err(core.write(handle, b"more"))
    later = {await err(core.write(handle, b"x")), await err(core.read(handle, 5, 0)),
             await err(core.fsync(handle)), await err(core.close(handle))}
    assert later == {first}, later
    assert await core.read_file("s") == b"durable|", "every handle closed: the file works again"
    return first


@row("write of a staged file, --temp-dir full", errno.ENOSPC)
async def _(core, store):
    handle = await staged(core, store)
    with full_temp_dir(0):
        return await err(core.write(handle, b"more", 10))


@row("write, fsync, close after a staged write was refused for room", errno.ENOSPC)
async def _(core, store):
    old = store.put("f", b"0123456789")
    handle = await core.open("f", os.O_WRONLY | os.O_TRUNC)
    with full_temp_dir(0):
        first = await err(core.write(handle, b"more"))
    later = {await err(core.write(handle, b"x")), await err(core.fsync(handle)), await err(core.close(handle))}
    assert later == {first}, later
    assert store.meta("f").generation == old.generation and store.data("f") == b"0123456789", "nothing uploaded"
    return first


@row("write, truncate, ftruncate, unlink that must copy an object into a full --temp-dir", errno.ENOSPC)
async def _(core, store):
    old = store.put("f", b"0123456789", appendable=store.kind == "zonal")
    handle = await core.open("f", os.O_RDWR)
    with full_temp_dir(4):
        results = {await err(core.write(handle, b"X", 2)), await err(core.ftruncate(handle, 5)),
                   await err(core.truncate("f", 5))}
        if store.kind == "zonal":
            await core.write(handle, b"+", 10)  # streams: an unlink must copy it
            results.add(await err(core.unlink("f")))
            old = store.meta("f")
    await core.fsync(handle)  # nothing staged: nothing to upload
    await core.close(handle)
    assert store.meta("f").generation == old.generation
    (result,) = results
    return result


@row("fsync, fdatasync, close of a writing handle", None)
async def _(core, store):
    handle = await core.create("f")
    await core.write(handle, b"abc")
    await core.fsync(handle)
    assert store.data("f") == b"abc"
    await core.close(handle)


@row("fsync, fdatasync, close, bucket unreachable past --retry-deadline", errno.EIO)
async def _(core, store):
    handle = await staged(core, store)
    store.fail_next("appender.create" if store.kind == "zonal" else "write_object", Code.UNAVAILABLE)
    result = await err(core.fsync(handle))
    if store.kind == "zonal":
        stream = await streaming(core)
        store.fail_next("appender.flush", Code.UNAVAILABLE)
        assert await err(core.fsync(stream)) == errno.EIO
    return result


@row("fsync, fdatasync, close, CRC32C of the persisted bytes differs", errno.EIO, kinds=["zonal"])
async def _(core, store):
    # The client's flush compares CRC32Cs and fails for good: DATA_LOSS stands for it.
    handle = await streaming(core)
    await core.write(handle, b"more")
    store.fail_next("appender.flush", Code.DATA_LOSS)
    return await err(core.fsync(handle))


@row("fsync, fdatasync, close, staged file whose object another client replaced or deleted", errno.ESTALE)
async def _(core, store):
    replaced = await staged(core, store, "r")
    store.put("r", b"theirs")
    deleted = await staged(core, store, "d")
    store.delete_external("d")
    results = {await err(core.fsync(replaced)), await err(core.close(deleted))}
    assert store.data("r") == b"theirs" and store.meta("d") is None
    return results.pop() if len(results) == 1 else results


@row("fsync, fdatasync, close, streamed object taken over by another client", errno.ESTALE, kinds=["zonal"])
async def _(core, store):
    handle = await streaming(core)
    await core.write(handle, b"pending")
    store.append_external("s", b"theirs")
    return await first_errno(core.fsync(handle))


@row("fsync, fdatasync, close, streamed object deleted or renamed by another client", errno.ESTALE,
     kinds=["zonal"])
async def _(core, store):
    deleted = await streaming(core, "del")
    await core.write(deleted, b"more")
    store.delete_external("del")
    renamed = await streaming(core, "ren")
    await core.write(renamed, b"more")
    await store.move_object("ren", "elsewhere")  # another client renames it
    results = {await err(core.fsync(deleted)), await err(core.close(renamed))}
    return results.pop() if len(results) == 1 else results


@row("fsync, fdatasync, close of a read-only handle; fsync of a directory", None)
async def _(core, store):
    store.put("f", b"abc")
    handle = await core.open("f")
    await core.fsync(handle)
    await core.close(handle)
    fh = await core.fs.opendir(1)
    await core.fs.flush(fh)  # a directory handle: nothing to do
    core.fs.releasedir(fh)


# ---------------------------------------------------------------- truncate, utime, chmod

@row("truncate, ftruncate of a file", None)
async def _(core, store):
    store.put("f", b"0123456789")
    await core.truncate("f", 3)
    handle = await core.open("f", os.O_RDWR)
    await core.ftruncate(handle, 1)
    await core.close(handle)
    assert store.data("f") == b"0"


@row("truncate of a path, object replaced elsewhere", errno.ESTALE)
async def _(core, store):
    store.put("f", b"0123456789")
    await core.stat("f")
    store.put("f", b"theirs")
    return await err(core.truncate("f", 2))


@row("truncate of a directory", errno.EISDIR)
async def _(core, store):
    store.put("d/f", b"")
    return await err(core.truncate("d", 0))


@row("utime of a file or directory", None)
async def _(core, store):
    store.put("d/f", b"x")
    f, d = await core.lookup_path("d/f"), await core.lookup_path("d")
    await core.fs.set_mtime(f.ino, 1_600_000_000_123_456_000)
    await core.fs.set_mtime(d.ino, 1_500_000_000_000_000_000)
    assert store.meta("d/f").mtime_ns == 1_600_000_000_123_456_000
    assert (await core.stat("d/f")).st_mtime_ns == 1_600_000_000_123_456_000
    assert (await core.stat("d")).st_mtime_ns == 1_500_000_000_000_000_000
    assert store.meta("d/").metadata["gcsfuse_mtime"] == "2017-07-14T02:40:00.000000000Z"  # in its placeholder


@row("utime of the root of a mount of the whole bucket", None)
async def _(core, store):
    await core.fs.set_mtime(1, 1_500_000_000_000_000_000)
    assert (await core.stat("")).st_mtime_ns == 1_500_000_000_000_000_000
    assert store.names() == []  # nothing in the bucket can hold it


@row("utime, object replaced elsewhere", errno.ESTALE)
async def _(core, store):
    store.put("f", b"x")
    inode = await core.lookup_path("f")
    store.put("f", b"theirs")
    return await err(core.fs.set_mtime(inode.ino, 1_600_000_000_000_000_000))


@row("chmod of a file with --preserve-mode", None, preserve_mode=True)
async def _(core, store):
    store.put("f", b"x")
    inode = await core.lookup_path("f")
    await core.fs.chmod(inode.ino, 0o700)
    assert store.meta("f").metadata["mode"] == "100700"
    assert (await core.stat("f")).st_mode == stat.S_IFREG | 0o700


@row("chmod, chown", None)
async def _(core, store):
    store.put("f", b"x")
    inode = await core.lookup_path("f")
    await core.fs.chmod(inode.ino, 0o755)  # without --preserve-mode: no effect, as in gcsfuse
    core.fs.chown(inode.ino)
    assert (await core.stat("f")).st_mode == stat.S_IFREG | 0o644


# ---------------------------------------------------------------- unlink, mkdir, rmdir

@row("unlink of a new file not yet uploaded (non-zonal bucket)", None, kinds=["hns", "flat"])
async def _(core, store):
    handle = await core.create("new")
    await core.write(handle, b"never uploaded")
    calls = sum(store.calls.values())
    await core.unlink("new")
    assert sum(store.calls.values()) == calls, "nothing to delete in the bucket"
    await core.close(handle)
    assert store.names() == []


@row("write, fsync, close of a file this mount renamed or unlinked while open", None)
async def _(core, store):
    renamed = await core.create("r")
    await core.write(renamed, b"one|")
    await core.rename("r", "r2")
    await core.write(renamed, b"two|")
    unlinked = await core.create("u")
    await core.write(unlinked, b"gone|")
    await core.unlink("u")
    await core.write(unlinked, b"still accepted|")
    result = await first_errno(core.fsync(renamed), core.fsync(unlinked), core.close(renamed),
                               core.close(unlinked))
    assert store.data("r2") == b"one|two|" and sorted(store.names()) == ["r2"]
    return result


@row("unlink of a file or symlink", None)
async def _(core, store):
    store.put("f", b"x")
    await core.symlink("l", "f")
    await core.unlink("f")
    await core.unlink("l")
    assert store.names() == []


@row("unlink, missing name", errno.ENOENT)
async def _(core, store):
    return await err(core.unlink("missing"))


@row("unlink of a directory", errno.EISDIR)
async def _(core, store):
    await core.mkdir("d")
    return await err(core.unlink("d"))


@row("unlink, object replaced elsewhere", errno.ESTALE)
async def _(core, store):
    store.put("f", b"x")
    await core.stat("f")
    store.put("f", b"theirs")
    result = await err(core.unlink("f"))
    assert store.data("f") == b"theirs"
    return result


@row("mkdir, new name", None)
async def _(core, store):
    await core.mkdir("d")
    await core.mkdir("d/e")
    assert await core.listdir("d") == ["e"]


@row("mkdir, existing name", errno.EEXIST)
async def _(core, store):
    store.put("f", b"")
    await core.mkdir("d")
    results = {await err(core.mkdir("f")), await err(core.mkdir("d"))}
    return results.pop() if len(results) == 1 else results


@row("rmdir of an empty directory", None)
async def _(core, store):
    await core.mkdir("d")
    await core.rmdir("d")
    assert await core.listdir() == []


@row("rmdir of a non-empty directory (hidden names count)", errno.ENOTEMPTY)
async def _(core, store):
    store.put("d/f", b"")
    store.put("h/" + LONG, b"")  # h lists as empty
    assert await core.listdir("h") == []
    results = {await err(core.rmdir("d")), await err(core.rmdir("h"))}
    return results.pop() if len(results) == 1 else results


@row("rmdir of a file", errno.ENOTDIR)
async def _(core, store):
    store.put("f", b"")
    return await err(core.rmdir("f"))


# ---------------------------------------------------------------- rename

@row("rename of a file, replacing a file or not", None)
async def _(core, store):
    store.put("a", b"A")
    store.put("b", b"B")
    await core.rename("a", "c")
    await core.rename("c", "b")
    assert store.names() == ["b"] and store.data("b") == b"A"


@row("rename of a file onto a directory", errno.EISDIR)
async def _(core, store):
    store.put("f", b"")
    await core.mkdir("d")
    return await err(core.rename("f", "d"))


@row("rename of a directory onto a file", errno.ENOTDIR)
async def _(core, store):
    store.put("f", b"")
    await core.mkdir("d")
    return await err(core.rename("d", "f"))


@row("rename of a directory onto a non-empty directory", errno.ENOTEMPTY, rename_dir_limit=10)
async def _(core, store):
    store.put("d/a", b"")
    store.put("e/b", b"")
    return await err(core.rename("d", "e"))


@row("rename of a directory, hierarchical namespace", None, kinds=["zonal", "hns"])
async def _(core, store):
    store.put("d/a", b"")
    await core.rename("d", "e")
    assert store.names() == ["e/a"]


@row("rename of a directory, flat bucket", errno.ENOTSUP, kinds=["flat"])
async def _(core, store):
    store.put("d/a", b"")
    store.put("d/b", b"")
    result = await err(core.rename("d", "e"))
    limited = await start_core(core.nursery, store, rename_dir_limit=2)
    await limited.rename("d", "e")
    assert store.names() == ["e/a", "e/b"]
    return result


@row("rename, source replaced elsewhere", errno.ESTALE)
async def _(core, store):
    store.put("f", b"x")
    await core.stat("f")
    store.put("f", b"theirs")
    return await err(core.rename("f", "g"))


@row("rename, new file not yet uploaded (non-zonal bucket)", None, kinds=["hns", "flat"])
async def _(core, store):
    # The table says ENOENT; since e804ad2 the core finds its own new file and uploads it
    # first, as open files renamed keep their bytes (tests/mount/test_open_files.py).
    handle = await core.create("new")
    await core.write(handle, b"abc")
    await core.rename("new", "moved")
    await core.close(handle)
    assert store.names() == ["moved"]


@row("rename with RENAME_NOREPLACE or RENAME_EXCHANGE", errno.EINVAL)
async def _(core, store):
    store.put("a", b"")
    store.put("b", b"")
    results = {await err(core.rename("a", "b", RENAME_NOREPLACE)), await err(core.rename("a", "b", RENAME_EXCHANGE))}
    assert store.names() == ["a", "b"]
    return results.pop() if len(results) == 1 else results


# ---------------------------------------------------------------- symlinks, links, the rest

@row("symlink, new name", None)
async def _(core, store):
    await core.symlink("l", "target")


@row("symlink, existing name", errno.EEXIST)
async def _(core, store):
    store.put("f", b"")
    return await err(core.symlink("f", "target"))


@row("readlink of a symlink", None)
async def _(core, store):
    await core.symlink("l", "../out/side")
    assert await core.readlink("l") == "../out/side"


@row("readlink of anything else", errno.EINVAL)
async def _(core, store):
    store.put("d/f", b"")
    results = {await err(core.readlink("d/f")), await err(core.readlink("d"))}
    return results.pop() if len(results) == 1 else results


@row("link", errno.EPERM)
async def _(core, store):
    async def link():
        core.fs.link()
    return await err(link())


@row("mknod, mkfifo", errno.ENOSYS)
async def _(core, store):
    # Neither FUSE layer serves MKNOD: the own loop answers ENOSYS, as pyfuse3's default does.
    assert abi.Opcode.MKNOD not in Operations(core.fs).table
    try:
        await FuseOperations(core.fs, OperationStats()).mknod(1, b"fifo", stat.S_IFIFO | 0o644, 0, None)
    except pyfuse3.FUSEError as exc:
        return exc.errno
    return None


@row("statfs", None)
async def _(core, store):
    values = core.fs.statfs()
    assert values["f_bsize"] == 1 << 20 and values["f_namemax"] == 255 and values["f_blocks"] == 1 << 40


@row("flock, fcntl locks", None)
async def _(core, store):
    # No lock operations reach the daemon: the kernel handles them locally
    # (INIT asks for neither POSIX_LOCKS nor FLOCK_LOCKS).
    assert not any(hasattr(FuseOperations, name) for name in ("getlk", "setlk", "flock"))
    assert not {abi.Opcode.GETLK, abi.Opcode.SETLK, abi.Opcode.SETLKW} & set(Operations(core.fs).table)
    assert not Wants(max_write=1 << 20, max_readahead=1 << 20).optional & (abi.POSIX_LOCKS | abi.FLOCK_LOCKS)


@row("access with W_OK", None)
async def _(core, store):
    store.put("f", b"")
    core.fs.access((await core.lookup_path("f")).ino, os.W_OK)


@row("any change on a mount made with -o ro", errno.EROFS, read_only=True)
async def _(core, store):
    store.put("f", b"x")
    return await err(core.unlink("f"))  # every change: tests/core/test_read_only.py


# Rows that the kernel answers alone, before rapidmount sees the call, or
# that the data-plane workers hold below the core: each names the test that
# holds it, on real mounts or real worker processes.
KERNEL_ROWS = {
    # pyfuse3 has no fallocate operation, and rapidmount none of the xattr
    # ones: the kernel gets ENOSYS and answers EOPNOTSUPP (ENOTSUP) itself.
    "fallocate": "tests/mount/test_errnos.py::test_fallocate_is_eopnotsupp",
    "getxattr, listxattr, setxattr, removexattr": "tests/mount/test_errnos.py::test_extended_attributes_are_enotsup",
    "open with O_CREAT, new name on a zonal bucket, while its data-plane worker dies (a crash, a hang, or "
    "past --worker-memory-limit)":
        "tests/process/test_changes_survive_worker_loss.py::"
        "test_a_create_made_again_after_its_worker_died_takes_its_own_object_over",
    "unlink, rename, chmod or utime while its data-plane worker dies":
        "tests/process/test_changes_survive_worker_loss.py::test_a_delete_made_again_after_its_worker_died_succeeds",
    "any operation by another user, mount without allow_other":
        "tests/mount/test_permissions.py::test_without_allow_other_nothing_changes",
    "any operation the modes forbid, by another user of an allow_other mount":
        "tests/mount/test_permissions.py::test_allow_other_refuses_what_the_modes_forbid",
    # The kernel maps a direct_io handle's pages itself where INIT granted
    # FUSE_DIRECT_IO_ALLOW_MMAP, and refuses a shared mapping elsewhere.
    "mmap with MAP_SHARED of a direct handle (O_DIRECT, or opened while a writer that bypasses the page cache "
    "is open)":
        "tests/mount/test_direct_writes.py::"
        "test_a_shared_mmap_of_a_direct_handle_works_where_the_kernel_allows_it_and_a_private_one_works",
}


def _cases():
    for entry in ROWS:
        for kind in entry.kinds:
            yield pytest.param(entry, kind, id=f"{entry.doc}-{kind}")


@pytest.mark.trio
@pytest.mark.parametrize("entry, kind", list(_cases()))
async def test_errno_row(nursery, store, entry: Row, kind):
    core = await start_core(nursery, store, **entry.options)
    core.nursery = nursery
    result = await entry.run(core, store)
    assert result == entry.expected, (f"{entry.doc}: expected {errno.errorcode.get(entry.expected)}, "
                                      f"got {errno.errorcode.get(result, result)}")
    with trio.fail_after(10):
        await core.fs.close_all()


def test_every_row_of_the_table_has_a_case():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "semantics.md")).read()
    table = text.split("## Operation → errno", 1)[1]
    cells = [line.split("|")[1].strip().replace("`", "") for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| operation")]
    mine = {entry.doc.removesuffix(" (zonal)").removesuffix(" (other buckets)") for entry in ROWS}
    assert sorted(mine | KERNEL_ROWS.keys()) == sorted(cells)


def test_every_kernel_row_names_a_real_mount_test():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for doc, node in KERNEL_ROWS.items():
        path, name = node.split("::")
        with open(os.path.join(root, path)) as source:
            assert f"def {name}(" in source.read(), f"{doc}: {node} does not exist"
