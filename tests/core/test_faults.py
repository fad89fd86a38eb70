"""Storage failures injected with ``fail_next``: each surfaces as its errno,
at once (the store does not retry, and the core must not wait), and a
stateless operation works again when the fault is gone."""

from __future__ import annotations

import errno
import os

import pytest

from rapidmount.core.namespace import REFUSAL_SECONDS
from rapidmount.storage.errors import StorageCode
from tests.core.conftest import MiB, payload

pytestmark = pytest.mark.trio

Code = StorageCode
ERRNO = {
    Code.UNAVAILABLE: errno.EIO, Code.INTERNAL: errno.EIO, Code.DEADLINE_EXCEEDED: errno.EIO,
    Code.RESOURCE_EXHAUSTED: errno.EIO, Code.UNKNOWN: errno.EIO, Code.DATA_LOSS: errno.EIO,
    Code.NOT_FOUND: errno.ENOENT, Code.ALREADY_EXISTS: errno.EEXIST, Code.PERMISSION_DENIED: errno.EACCES,
    Code.UNAUTHENTICATED: errno.EACCES, Code.FAILED_PRECONDITION: errno.ESTALE,
    Code.INVALID_ARGUMENT: errno.EINVAL, Code.OUT_OF_RANGE: errno.EINVAL, Code.UNIMPLEMENTED: errno.ENOTSUP,
    Code.CANCELLED: errno.EINTR,
}


async def _setup(core, store):
    store.put("f", b"0123456789")
    store.put("big", payload(5 * MiB))
    store.put("d/x", b"")
    await core.mkdir("empty")


# name -> (store method(s) to fail, action, does the call name a generation)
async def _read(core):
    return await core.read(await core.open("big"), 100, 0)


async def _mkdir(core):
    await core.mkdir("new")


async def _symlink(core):
    await core.symlink("l", "t")


async def _utime(core):
    await core.fs.set_mtime((await core.lookup_path("f")).ino, 10**18)


async def _getattr(core):
    inode = await core.lookup_path("f")
    core.fs.namespace.meta.invalidate("f")  # the cached metadata would answer
    await core.call(core.fs.getattr, inode.ino)


OPERATIONS = {
    "lookup": (["stat_name"], lambda c: c.stat("f"), False),
    "getattr": (["get_object"], _getattr, False),
    "readdir": (["list_directory"], lambda c: c.listdir("d"), False),
    "read": (["reader.read"], _read, True),
    "mkdir": (["create_folder", "write_object"], _mkdir, False),
    "rmdir": (["list_page"], lambda c: c.rmdir("empty"), False),
    "unlink": (["delete_object"], lambda c: c.unlink("f"), False),
    "rename": (["move_object"], lambda c: c.rename("f", "g"), False),
    "symlink": (["write_object"], _symlink, False),
    "utime": (["update_metadata"], _utime, True),
    "truncate": (["write_object", "appender.create"], lambda c: c.truncate("f", 2), False),
}


# Every status on two operations; a representative few on the others.
SOME = [Code.UNAVAILABLE, Code.NOT_FOUND, Code.PERMISSION_DENIED, Code.FAILED_PRECONDITION, Code.INVALID_ARGUMENT]
CASES = [(operation, code) for operation in OPERATIONS
         for code in (ERRNO if operation in ("lookup", "read") else SOME)]


@pytest.mark.parametrize("operation, code", CASES, ids=[f"{o}-{c.name}" for o, c in CASES])
async def test_fault_surfaces_as_its_errno_and_passes(core, store, clock, operation, code):
    methods, action, pinned = OPERATIONS[operation]
    await _setup(core, store)
    for method in methods:
        store.fail_next(method, code, times=100)
    expected = errno.ESTALE if pinned and code == Code.NOT_FOUND else ERRNO[code]
    if operation == "truncate" and store.kind == "zonal" and code == Code.ALREADY_EXISTS:
        expected = errno.EEXIST
    if operation == "mkdir" and store.kind == "flat" and code == Code.FAILED_PRECONDITION:
        expected = errno.EEXIST  # the placeholder (if_generation_match=0) exists: so does the directory
    assert await core.errno(action(core)) == expected
    if expected == errno.ESTALE and operation in ("unlink", "rename", "utime", "truncate"):
        # Linux retries a path call that failed with ESTALE once, after a fresh
        # lookup: that retry is refused too, without a request.
        calls = sum(store.calls.values())
        assert await core.errno(action(core)) == errno.ESTALE
        assert sum(store.calls.values()) - calls <= 2, "at most the retry's lookup"
        clock.advance(REFUSAL_SECONDS)  # the refusal window passes
    store.clear_faults()
    await core.call(action, core)  # the fault is gone: it works


@pytest.mark.parametrize("kind", ["zonal"])
@pytest.mark.parametrize("code, expected", [(Code.FAILED_PRECONDITION, errno.EEXIST),
                                            (Code.UNAVAILABLE, errno.EIO),
                                            (Code.PERMISSION_DENIED, errno.EACCES)])
async def test_create_on_zonal(core, store, code, expected):
    store.fail_next("appender.create", code)
    assert await core.errno(core.create("f")) == expected
    assert store.names() == []
    await core.close(await core.create("f"))


@pytest.mark.parametrize("kind", ["zonal"])
@pytest.mark.parametrize("method", ["appender.append", "appender.flush"])
@pytest.mark.parametrize("code", [Code.UNAVAILABLE, Code.FAILED_PRECONDITION, Code.PERMISSION_DENIED])
async def test_streaming_fault_sticks_until_closed(core, store, method, code):
    handle = await core.create("s")
    await core.write(handle, b"durable|")
    await core.fsync(handle)
    store.fail_next(method, code)
    first = await core.errno(core.write(handle, b"lost"))
    if first is None:
        first = await core.errno(core.fsync(handle))
    assert first == ERRNO[code]
    for action in (core.write(handle, b"x"), core.read(handle, 4, 0), core.fsync(handle)):
        assert await core.errno(action) == first
    assert await core.errno(core.close(handle)) == first
    assert store.data("s").startswith(b"durable|")
    handle = await core.open("s", os.O_WRONLY | os.O_APPEND)  # a new writer works
    await core.write(handle, b"again")
    await core.close(handle)
    assert store.data("s").endswith(b"again")


@pytest.mark.parametrize("code", [Code.UNAVAILABLE, Code.PERMISSION_DENIED, Code.INTERNAL])
async def test_staged_upload_fault_does_not_stick(core, store, code):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"AB", 0)
    method = "appender.create" if store.kind == "zonal" else "write_object"
    store.fail_next(method, code)
    assert await core.errno(core.fsync(handle)) == ERRNO[code]
    await core.write(handle, b"C", 2)
    await core.fsync(handle)
    await core.close(handle)
    assert store.data("f") == b"ABC3456789"


async def test_upload_failing_at_release_loses_nothing_silently(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"AB", 0)
    method = "appender.create" if store.kind == "zonal" else "write_object"
    store.fail_next(method, Code.UNAVAILABLE, times=2)
    assert await core.errno(core.close(handle)) == errno.EIO  # flush fails; release tries once more
    assert store.data("f") == b"0123456789"
    assert await core.read_file("f") == b"0123456789"


async def test_staging_copy_fault(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    store.fail_next("reader.read", Code.UNAVAILABLE)
    assert await core.errno(core.write(handle, b"AB", 0)) == errno.EIO
    await core.write(handle, b"AB", 0)  # the copy is made again
    await core.close(handle)
    assert store.data("f") == b"AB23456789"


@pytest.mark.parametrize("kind", ["zonal"])
@pytest.mark.parametrize("core_options", [{"cache_block_size": 256 * 1024}])
async def test_a_failed_stream_leaves_the_size_the_bucket_holds(core, store):
    """Appends counted but never stored are not the file's once its writer is
    gone: a reader open across the failure and a new open both end where the
    bucket's bytes end (whole blocks past that end failed with EIO)."""
    handle = await core.create("s")
    await core.write(handle, payload(2 * MiB + 100, 1))
    await core.fsync(handle)
    reader = await core.open("s")
    store.fail_next("appender.flush", Code.FAILED_PRECONDITION)
    await core.write(handle, payload(8_000_000, 2))  # held in part: the flush then fails
    assert await core.errno(core.fsync(handle)) == ERRNO[Code.FAILED_PRECONDITION]
    assert await core.errno(core.close(handle)) == ERRNO[Code.FAILED_PRECONDITION]
    stored = store.data("s")
    assert len(stored) < 2 * MiB + 100 + 8_000_000 - 512 * 1024, "the case needs blocks the bucket never took"
    assert await core.read(reader, 64 * MiB, 0) == stored
    assert await core.read_file("s") == stored
    assert (await core.stat("s")).st_size == len(stored)
