"""Which opens bypass the kernel's page cache: write-only opens, and every open while one is open.

The table is ``CacheModes`` in core/handles.py; these tests drive it through
the filesystem core's ``open``, ``create`` and ``release``, as the kernel does.
The mount tests (tests/mount/test_direct_writes.py) show the kernel's side.
"""

from __future__ import annotations

import errno
import os

import pytest

from rapidmount.core.errors import FSError
from tests.core.conftest import payload, start_core

pytestmark = pytest.mark.trio


def _direct(core, handle) -> bool:
    return core.fs.handles.file(handle.fh).direct_io


async def test_a_write_only_open_is_direct_and_so_is_every_open_while_it_is(core, store):
    store.put("f", b"x" * 10)
    writer = await core.open("f", os.O_WRONLY | os.O_APPEND)
    reader = await core.open("f")
    both = await core.open("f", os.O_RDWR)
    second = await core.open("f", os.O_WRONLY)
    assert [_direct(core, h) for h in (writer, reader, both, second)] == [True] * 4
    await core.write(writer, b"y" * 5)
    assert await core.read(reader, offset=0) == b"x" * 10 + b"y" * 5
    for handle in (writer, second):
        await core.close(handle)
    still = await core.open("f")
    assert _direct(core, still), "the read-write open writes around the cache too"
    await core.close(both)
    later = await core.open("f")
    assert not _direct(core, later), "no writer around the cache is open any more"
    for handle in (reader, still, later):
        await core.close(handle)
    assert store.data("f") == b"x" * 10 + b"y" * 5


async def test_created_write_only_files_are_direct_and_read_write_ones_are_not(core, store):
    writer = await core.create("new", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    both = await core.create("rw", os.O_RDWR | os.O_CREAT | os.O_EXCL)
    assert _direct(core, writer) and not _direct(core, both)
    await core.write(writer, payload(3000))
    await core.close(writer)
    await core.close(both)
    assert store.data("new") == payload(3000)


async def test_a_write_only_open_while_another_open_uses_the_cache_uses_it_too(core, store):
    store.put("f", b"x" * 10)
    reader = await core.open("f")
    writer = await core.open("f", os.O_WRONLY | os.O_APPEND)
    assert not _direct(core, reader) and not _direct(core, writer)
    await core.close(reader)
    other = await core.open("f")
    assert not _direct(core, other), "the writer uses the cache: so may every other open"
    await core.close(writer)
    await core.close(other)


async def test_o_direct_opens_are_direct_and_leave_the_other_opens_as_they_are(core, store):
    store.put("f", b"x" * 10)
    reader = await core.open("f")
    direct = await core.open("f", os.O_RDONLY | os.O_DIRECT)
    assert _direct(core, direct) and not _direct(core, reader)
    await core.close(reader)
    writer = await core.open("f", os.O_WRONLY | os.O_APPEND | os.O_DIRECT)
    other = await core.open("f")
    assert _direct(core, writer) and not _direct(core, other), "as the kernel always had it with O_DIRECT"
    for handle in (direct, writer, other):
        await core.close(handle)


@pytest.mark.parametrize("kind", ["zonal"])
async def test_with_no_direct_writes_every_open_but_o_direct_uses_the_cache(nursery, store):
    core = await start_core(nursery, store, no_direct_writes=True)
    writer = await core.open("f", os.O_WRONLY | os.O_CREAT)
    reader = await core.open("f")
    assert not _direct(core, writer) and not _direct(core, reader)
    await core.close(reader)
    await core.close(writer)


@pytest.mark.parametrize("kind", ["zonal"])
async def test_a_write_only_open_that_fails_leaves_no_direct_writer_behind(core, store, monkeypatch):
    store.put("f", b"x" * 10)

    async def refused(inode, truncate):
        raise FSError(errno.EIO)

    monkeypatch.setattr(core.fs.writes, "opened", refused)
    with pytest.raises(FSError):
        await core.open("f", os.O_WRONLY | os.O_TRUNC)
    monkeypatch.undo()
    assert (await core.lookup_path("f")).open_count == 0, "the failed open still counts as open"
    reader = await core.open("f")
    assert not _direct(core, reader), "the failed open still counted as an open writer"
    await core.close(reader)


async def test_a_writer_stops_making_opens_direct_at_a_flush_until_it_writes_again(core, store):
    """close() of a writer's descriptor sends FLUSH at once and RELEASE later:
    an open that comes between them is not made direct (its shared mmap would
    fail). The same handle writing again, through another descriptor, makes
    the next opens direct again."""
    writer = await core.open("f", os.O_WRONLY | os.O_CREAT)
    await core.write(writer, b"a" * 100)
    await core.call(core.fs.flush, writer.fh)  # a close(); its RELEASE is still to come
    between = await core.open("f")
    assert not _direct(core, between)
    await core.write(writer, b"b" * 100, offset=100)  # a dup'd descriptor writes on
    after = await core.open("f")
    assert _direct(core, after)
    for handle in (between, after, writer):
        await core.close(handle)
    assert store.data("f") == b"a" * 100 + b"b" * 100
