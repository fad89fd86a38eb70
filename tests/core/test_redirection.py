"""Shell redirection and duplicated descriptors make exactly the uploads they need.

Each test replays the requests the kernel sends for a shell command. bash's
``echo x > existing`` opens the file with ``O_TRUNC`` as descriptor 3, dup2s
it to 1 and closes 3 (a FLUSH), writes through 1 (a WRITE) and closes 1
(a FLUSH, then the RELEASE). Every flush uploads what changed since the last
upload, a truncation alone included, and returns 0 only once the bucket holds
it (close-to-open consistency); a flush with nothing new uploads nothing. On
buckets with appendable objects, the emptied file keeps the stream of the
upload that emptied it, so the write after the first close streams into that
generation: one generation in all. Elsewhere that command makes two.
"""

from __future__ import annotations

import errno
import os

import pytest
import trio
import trio.testing

from rapidmount.storage.errors import StorageCode
from tests.core.conftest import Handle

pytestmark = pytest.mark.trio

TRUNC = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # > file
APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND  # >> file

#: (kind, finalized): an existing object on each kind of bucket; on zonal
#: buckets also an unfinalized (appendable) one, as rapidmount leaves them.
EXISTING = pytest.mark.parametrize("kind,finalized", [("zonal", False), ("zonal", True), ("hns", True),
                                                      ("flat", True)])


def uploads(store) -> int:
    """New generations: whole-object uploads and object creations, of either kind."""
    return store.calls["write_object"] + store.calls["appender.create"]


def appendable(store) -> bool:
    """Objects can be appended to (zonal buckets): an emptied file streams on."""
    return store.kind == "zonal"


def put_existing(store, data: bytes, finalized: bool = True):
    return store.put("f", data, appendable=not finalized)


async def flush(core, handle: Handle) -> None:
    """close(2) of one descriptor of the open file (the kernel's FLUSH)."""
    await core.call(core.fs.flush, handle.fh)


async def release(core, handle: Handle) -> None:
    """The last descriptor of the open file closed (the kernel's RELEASE)."""
    with trio.fail_after(10):
        await core.fs.release(handle.fh)


async def fsync(core, handle: Handle) -> None:
    await core.call(core.fs.fsync, handle.fh)


# ---------------------------------------------------------------- echo x > existing

@EXISTING
async def test_echo_over_an_existing_file_is_one_generation(core, store, finalized):
    old = put_existing(store, b"old contents\n", finalized)
    handle = await core.open("f", TRUNC)  # exec 3>f; dup2(3, 1)
    await flush(core, handle)  # close(3)
    assert uploads(store) == 1 and store.data("f") == b"", "the close returned: the bucket holds the truncation"
    emptied = store.meta("f").generation
    assert emptied != old.generation
    assert (await core.stat("f")).st_size == 0
    assert await core.read_file("f") == b""
    await core.write(handle, b"x\n")  # write(1)
    await flush(core, handle)  # close(1)
    assert store.data("f") == b"x\n"
    generations = 1 if appendable(store) else 2
    assert uploads(store) == generations
    assert (store.meta("f").generation == emptied) == appendable(store), "streamed into the emptied generation"
    generation = store.meta("f").generation
    await release(core, handle)
    assert uploads(store) == generations, "nothing new at the release"
    assert store.meta("f").generation == generation and store.data("f") == b"x\n"
    assert await core.read_file("f") == b"x\n"


@EXISTING
async def test_echo_over_a_file_truncated_by_setattr_is_one_generation(core, store, finalized):
    """Without atomic O_TRUNC the kernel opens, then truncates through the handle."""
    put_existing(store, b"old contents\n", finalized)
    handle = await core.open("f", os.O_WRONLY)
    await core.ftruncate(handle, 0)
    await flush(core, handle)
    assert store.data("f") == b""
    await core.write(handle, b"x\n")
    await flush(core, handle)
    await release(core, handle)
    assert uploads(store) == (1 if appendable(store) else 2) and store.data("f") == b"x\n"


async def test_echo_to_a_new_file(core, store):
    """A new file: created at once on zonal buckets (the writes stream into
    it), uploaded at the first close elsewhere, and then once more with the
    bytes written after that close."""
    handle = await core.open("f", TRUNC)
    await flush(core, handle)
    await core.write(handle, b"x\n")
    await flush(core, handle)
    await release(core, handle)
    assert store.data("f") == b"x\n"
    assert uploads(store) == (1 if store.kind == "zonal" else 2)


# ---------------------------------------------------------------- a flush with nothing new

async def test_a_flush_with_nothing_new_uploads_nothing(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"AB", 0)
    await flush(core, handle)
    assert uploads(store) == 1 and store.data("f") == b"AB23456789"
    await flush(core, handle)
    await fsync(core, handle)
    await release(core, handle)
    assert uploads(store) == 1


@EXISTING
async def test_append_redirection_is_one_append(core, store, finalized):
    """echo more >> f: open, dup2, close(3), write, close(1)."""
    put_existing(store, b"first\n", finalized)
    handle = await core.open("f", APPEND)
    await flush(core, handle)
    await core.write(handle, b"more\n")
    await flush(core, handle)
    await release(core, handle)
    assert store.data("f") == b"first\nmore\n"
    if store.kind == "zonal" and not finalized:
        assert store.calls["appender.takeover"] == 1 and uploads(store) == 0, "appended in place"
    else:
        assert uploads(store) == 1


@EXISTING
async def test_duplicated_descriptors_upload_what_each_close_adds(core, store, finalized):
    put_existing(store, b"old\n", finalized)
    # exec 3>f; echo a >&3; exec 4>&3; exec 3>&-; echo b >&4; exec 4>&-
    handle = await core.open("f", TRUNC)
    await core.write(handle, b"a\n")
    await flush(core, handle)
    assert uploads(store) == 1 and store.data("f") == b"a\n"
    await core.write(handle, b"b\n")
    await flush(core, handle)
    await release(core, handle)
    assert uploads(store) == 2 and store.data("f") == b"a\nb\n"


@EXISTING
async def test_duplicated_descriptor_closed_before_any_write_uploads_the_truncation(core, store, finalized):
    put_existing(store, b"old\n", finalized)
    # exec 3>f; exec 4>&3; exec 3>&-; echo b >&4; exec 4>&-
    handle = await core.open("f", TRUNC)
    await flush(core, handle)
    assert store.data("f") == b""
    await core.write(handle, b"b\n")
    await flush(core, handle)
    await release(core, handle)
    assert uploads(store) == (1 if appendable(store) else 2) and store.data("f") == b"b\n"


# ---------------------------------------------------------------- a truncation alone

@EXISTING
async def test_a_truncation_alone_is_uploaded_by_its_close(core, store, finalized):
    """: > f, and open(f, "w").close()."""
    old = put_existing(store, b"old contents\n", finalized)
    handle = await core.open("f", TRUNC)
    await flush(core, handle)
    assert uploads(store) == 1 and store.data("f") == b""
    await flush(core, handle)
    assert uploads(store) == 1, "a second close has nothing new"
    assert (await core.fstat(handle)).st_size == 0
    await release(core, handle)
    assert uploads(store) == 1 and store.data("f") == b""
    assert store.meta("f").generation != old.generation
    assert (await core.stat("f")).st_size == 0


async def test_a_truncation_alone_is_uploaded_by_the_close_of_its_handle(core, store):
    store.put("f", b"old")
    first = await core.open("f", TRUNC)
    second = await core.open("f", os.O_RDONLY)
    third = await core.open("f", os.O_WRONLY)
    await core.close(first)
    assert uploads(store) == 1 and store.data("f") == b"" and await core.read(second, 10, 0) == b""
    await core.close(second)
    await core.close(third)
    assert uploads(store) == 1 and store.data("f") == b""


async def test_ftruncate_alone_is_uploaded_at_each_close(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.ftruncate(handle, 4)
    await flush(core, handle)
    assert uploads(store) == 1 and store.data("f") == b"0123"
    await core.ftruncate(handle, 6)  # ftruncate that grows the file, too
    await flush(core, handle)
    assert uploads(store) == 2 and store.data("f") == b"0123\0\0"
    await release(core, handle)
    assert uploads(store) == 2 and await core.read_file("f") == b"0123\0\0"


async def test_fsync_uploads_a_truncation_alone(core, store):
    store.put("f", b"old contents")
    handle = await core.open("f", TRUNC)
    await fsync(core, handle)
    assert uploads(store) == 1 and store.data("f") == b""
    await flush(core, handle)
    await release(core, handle)
    assert uploads(store) == 1


async def test_a_write_after_an_uploaded_truncation_makes_the_next_flush_upload(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"AB", 0)
    await flush(core, handle)
    assert uploads(store) == 1
    await core.ftruncate(handle, 1)
    await flush(core, handle)
    assert uploads(store) == 2 and store.data("f") == b"A"
    await core.write(handle, b"C", 1)
    await flush(core, handle)
    assert uploads(store) == 3 and store.data("f") == b"AC"
    await release(core, handle)
    assert uploads(store) == 3


async def test_a_truncation_after_unflushed_writes_is_uploaded_at_the_flush(core, store):
    """Written bytes are pending: the flush uploads, truncation included."""
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"AB", 0)
    await core.ftruncate(handle, 3)
    await flush(core, handle)
    assert uploads(store) == 1 and store.data("f") == b"AB2"
    await release(core, handle)
    assert uploads(store) == 1


async def test_truncate_of_a_path_open_elsewhere_is_uploaded_at_the_next_flush(core, store):
    """truncate(2) has no close of its own: a writing handle's flush uploads it."""
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_WRONLY)
    await core.truncate("f", 4)
    assert uploads(store) == 0
    await flush(core, handle)
    assert uploads(store) == 1 and store.data("f") == b"0123"
    await release(core, handle)
    assert uploads(store) == 1


@EXISTING
@pytest.mark.parametrize("how", ["o_trunc", "ftruncate"])
async def test_close_of_a_truncation_alone_over_a_changed_object_is_estale(core, store, finalized, how):
    """The close's upload is refused (coreutils ``truncate -s 0`` checks its
    close); not a byte of the other client's object changes, then or later."""
    put_existing(store, b"old", finalized)
    handle = await core.open("f", TRUNC if how == "o_trunc" else os.O_WRONLY)
    if how == "ftruncate":
        await core.ftruncate(handle, 0)
    if finalized:
        store.put("f", b"theirs")
    else:
        store.append_external("f", b" and theirs")  # the generation stays, the size changes
    theirs = store.data("f")
    assert await core.errno(flush(core, handle)) == errno.ESTALE
    assert await core.errno(flush(core, handle)) == errno.ESTALE, "the refusal sticks"
    await release(core, handle)
    assert store.data("f") == theirs
    assert (1, "f") in core.fs.kernel.entries, "the kernel looks the name up again"
    assert await core.read_file("f") == theirs


async def test_a_close_whose_upload_fails_returns_the_error_and_the_release_tries_again(core, store):
    store.put("f", b"old")
    handle = await core.open("f", TRUNC)
    method = "appender.create" if appendable(store) else "write_object"
    store.fail_next(method, StorageCode.PERMISSION_DENIED)  # not retried
    assert await core.errno(flush(core, handle)) == errno.EACCES
    assert store.data("f") == b"old"
    await release(core, handle)
    assert store.data("f") == b""


async def test_a_truncation_uploaded_at_its_close_is_not_undone_by_the_release(core, store):
    """Another client's object after the close is theirs: nothing is pending."""
    store.put("f", b"old")
    handle = await core.open("f", TRUNC)
    await flush(core, handle)
    store.put("f", b"theirs")
    await release(core, handle)
    assert store.data("f") == b"theirs"
    assert await core.read_file("f") == b"theirs"


# ---------------------------------------------------------------- a pending truncation and the names

async def test_rename_before_the_release_carries_the_truncation(core, store):
    store.put("f", b"old contents")
    handle = await core.open("f", TRUNC)
    await flush(core, handle)
    await core.rename("f", "g")  # the kernel may send the release after this
    assert store.meta("f") is None and store.data("g") == b""
    await release(core, handle)
    assert store.data("g") == b"" and store.meta("f") is None


async def test_o_trunc_of_an_object_replaced_elsewhere_keeps_theirs(core, store):
    store.put("f", b"old")
    await core.stat("f")
    handle = await core.open("f", TRUNC)
    store.put("f", b"theirs")
    await core.write(handle, b"mine")
    assert await core.errno(flush(core, handle)) == errno.ESTALE
    await release(core, handle)
    assert store.data("f") == b"theirs"
