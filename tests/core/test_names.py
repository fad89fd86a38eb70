"""Name changes: mkdir, rmdir, unlink, symlink, renames of files and
directories, and open files whose name is renamed or unlinked."""

from __future__ import annotations

import errno
import os

import pytest

from tests.core.conftest import MiB, payload

pytestmark = pytest.mark.trio

NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL
MODES = pytest.mark.parametrize("staged", [False, True], ids=["streaming", "staged"])


async def open_new(core, name: str, staged: bool):
    """A new open file; ``staged`` forces the local copy even on a zonal bucket."""
    handle = await core.create(name)
    if staged:
        await core.write(handle, b"x", 5)  # not at the end: staged
        await core.ftruncate(handle, 0)
    return handle


# ---------------------------------------------------------------- plain name changes

async def test_mkdir_and_rmdir(core, store):
    await core.mkdir("d")
    assert await core.listdir() == ["d"]
    if store.kind == "flat":
        assert store.names() == ["d/"]
    else:
        assert store.folder_names() == ["d/"] and store.names() == []
    await core.rmdir("d")
    assert await core.listdir() == [] and store.names() == [] and store.folder_names() == []
    assert await core.errno(core.lookup_path("d")) == errno.ENOENT


async def test_unlink(core, store):
    store.put("d/f", b"x")
    await core.unlink("d/f")
    assert store.meta("d/f") is None
    assert await core.errno(core.lookup_path("d/f")) == errno.ENOENT


async def test_create_then_unlink_before_any_upload(core, store):
    handle = await core.create("f")
    await core.unlink("f")
    await core.close(handle)
    assert store.names() == [] and await core.listdir() == []


async def test_rename_file_replacing_another(core, store):
    store.put("a", b"AAA")
    store.put("d/b", b"B")
    await core.rename("a", "d/b")
    assert store.data("d/b") == b"AAA" and store.meta("a") is None
    assert await core.read_file("d/b") == b"AAA"
    assert await core.errno(core.lookup_path("a")) == errno.ENOENT
    assert await core.listdir() == ["d"]


async def test_rename_of_a_new_file_never_uploaded(core, store):
    handle = await core.create("new")
    await core.write(handle, b"abc")
    await core.rename("new", "moved")  # pending writes go first
    await core.close(handle)
    assert store.names() == ["moved"] and store.data("moved") == b"abc"


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_rename_directory_with_folders(core, store):
    store.put("d/a", b"1")
    store.put("d/sub/b", b"2")
    await core.listdir("d")
    await core.rename("d", "e")
    assert store.names() == ["e/a", "e/sub/b"]
    assert await core.listdir() == ["e"]
    assert await core.read_file("e/sub/b") == b"2"
    assert await core.errno(core.lookup_path("d")) == errno.ENOENT


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_rename_directory_onto_an_empty_one(core, store):
    store.put("d/a", b"1")
    await core.mkdir("e")
    await core.rename("d", "e")
    assert store.names() == ["e/a"] and await core.listdir() == ["e"]


@pytest.mark.parametrize("kind", ["zonal", "hns", "flat"])
@pytest.mark.parametrize("core_options", [{"rename_dir_limit": 10}])
async def test_a_directory_made_again_after_its_rename_holds_nothing_of_the_old_one(core, store):
    """Found by the R3 soak: the names below a renamed directory stayed
    cached under its old path, and showed through a new directory made there."""
    store.put("d/a", b"1")
    store.put("d/sub/b", b"2")
    await core.listdir("d")
    await core.listdir("d/sub")
    assert await core.read_file("d/sub/b") == b"2"
    await core.rename("d", "e")
    await core.mkdir("d")
    for gone in ("d/a", "d/sub", "d/sub/b"):
        assert await core.errno(core.lookup_path(gone)) == errno.ENOENT, gone
    await core.mkdir("d/sub")
    assert await core.listdir("d") == ["sub"] and await core.listdir("d/sub") == []
    assert await core.read_file("e/sub/b") == b"2"


@pytest.mark.parametrize("kind", ["zonal", "hns", "flat"])
async def test_a_directory_made_again_after_rmdir_holds_nothing_of_the_old_one(core, store):
    store.put("d/sub/b", b"2")
    assert await core.read_file("d/sub/b") == b"2"
    await core.unlink("d/sub/b")
    await core.rmdir("d/sub")
    await core.mkdir("d/sub")
    assert await core.errno(core.lookup_path("d/sub/b")) == errno.ENOENT
    assert await core.listdir("d/sub") == []


@pytest.mark.parametrize("kind", ["flat"])
async def test_rename_directory_flat_is_enotsup(core, store):
    store.put("d/a", b"1")
    assert await core.errno(core.rename("d", "e")) == errno.ENOTSUP
    assert store.names() == ["d/a"]


@pytest.mark.parametrize("kind", ["flat"])
@pytest.mark.parametrize("core_options", [{"rename_dir_limit": 3}])
async def test_rename_directory_flat_within_the_limit(core, store):
    for name in ("d/", "d/a", "d/sub/b"):
        store.put(name, b"")
    await core.rename("d", "e")
    assert store.names() == ["e/", "e/a", "e/sub/b"]
    store.put("e/c", b"")
    store.put("e/d", b"")
    assert await core.errno(core.rename("e", "f")) == errno.ENOTSUP, "more objects than the limit"


# ---------------------------------------------------------------- open files renamed

@MODES
async def test_renamed_while_open_keeps_every_byte(core, store, staged):
    first, second = payload(3 * MiB + 5, 1), payload(MiB + 77, 2)
    handle = await open_new(core, "c2", staged)
    await core.write(handle, first)
    await core.fsync(handle)
    await core.rename("c2", "c2.new")
    await core.write(handle, second)
    await core.fsync(handle)
    assert store.data("c2.new") == first + second, "fsync after the rename"
    await core.close(handle)
    assert store.data("c2.new") == first + second
    assert store.meta("c2") is None, "close must not bring the old name back"
    assert await core.read_file("c2.new") == first + second
    assert await core.listdir() == ["c2.new"]


@MODES
async def test_renamed_with_unsynced_writes(core, store, staged):
    handle = await open_new(core, "f", staged)
    await core.write(handle, b"before|")
    await core.rename("f", "g")
    await core.write(handle, b"after|")
    await core.close(handle)
    assert store.names() == ["g"] and store.data("g") == b"before|after|"


@MODES
async def test_renamed_while_open_through_two_handles(core, store, staged):
    one = await open_new(core, "two", staged)
    await core.write(one, b"one|")
    await core.rename("two", "two.moved")
    two = await core.open("two.moved", os.O_WRONLY | os.O_APPEND)
    await core.write(two, b"two|")
    await core.write(one, b"three|", 8)  # at the end, where the other handle left it
    await core.fsync(one)
    await core.close(two)
    await core.close(one)
    assert store.data("two.moved") == b"one|two|three|"
    assert store.meta("two") is None


async def test_reader_opened_before_a_rename_reads_on(core, store):
    data = payload(6 * MiB + 3, 3)
    store.put("r", data)
    handle = await core.open("r")
    head = await core.read(handle, MiB)
    await core.rename("r", "r.moved")
    assert head + await core.read(handle) == data


# ---------------------------------------------------------------- open files unlinked

@MODES
async def test_unlinked_while_open_accepts_writes_and_uploads_nothing(core, store, staged):
    handle = await open_new(core, "tmp", staged)
    await core.write(handle, b"before|")
    await core.fsync(handle)
    await core.unlink("tmp")
    assert not await core.exists("tmp")
    await core.write(handle, b"after|")
    await core.fsync(handle)
    assert await core.read(handle, 100, 0) == b"before|after|", "the open file still holds every byte"
    assert (await core.fstat(handle)).st_size == len(b"before|after|")
    await core.close(handle)
    assert store.meta("tmp") is None, "an unlinked file must not reappear"
    assert await core.listdir() == []


@MODES
async def test_unlinked_while_open_through_two_handles(core, store, staged):
    one = await open_new(core, "gone", staged)
    await core.write(one, b"a")
    two = await core.open("gone", os.O_WRONLY | os.O_APPEND)
    await core.unlink("gone")
    await core.write(two, b"b")
    await core.write(one, b"c")  # at its own position, 1: over the "b"
    assert await core.read(one, 10, 0) == b"ac"
    await core.close(two)
    await core.close(one)
    assert store.meta("gone") is None
    await core.write_file("gone", b"new")  # the name is free again: a new object
    assert store.data("gone") == b"new"


async def test_unlinked_existing_object_while_open(core, store):
    store.put("f", b"0123456789")
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"AB", 0)
    await core.unlink("f")
    await core.write(handle, b"C", 10)
    assert await core.read(handle, 100, 0) == b"AB23456789C"
    await core.close(handle)
    assert store.names() == []


@MODES
async def test_rename_onto_a_file_open_for_writing(core, store, staged):
    """The replaced file loses its name as by unlink: its handle goes on, uploads nothing."""
    victim = await open_new(core, "a", staged)
    await core.write(victim, b"victim|")
    store.put("b", b"B")
    await core.rename("b", "a")
    await core.write(victim, b"more|")
    await core.fsync(victim)
    assert await core.read(victim, 100, 0) == b"victim|more|"
    await core.close(victim)
    assert store.names() == ["a"] and store.data("a") == b"B"
    assert await core.read_file("a") == b"B"
