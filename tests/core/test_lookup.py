"""Lookups and listings: files, implicit directories, folders, shadowing, hidden names."""

from __future__ import annotations

import errno
import stat

import pytest

from rapidmount.superblock.names import EntryKind
from tests.core.conftest import KINDS

pytestmark = pytest.mark.trio


async def test_file_attributes(core, store):
    store.put("dir/file.txt", b"hello")
    attrs = await core.stat("dir/file.txt")
    assert stat.S_ISREG(attrs.st_mode) and attrs.st_mode & 0o777 == 0o644
    assert attrs.st_size == 5 and attrs.st_nlink == 1 and attrs.st_blocks == 1
    assert (await core.lookup_path("dir/file.txt")).kind is EntryKind.FILE


async def test_implicit_directory(core, store):
    store.put("a/b/c", b"x")
    for path in ("a", "a/b"):
        attrs = await core.stat(path)
        assert stat.S_ISDIR(attrs.st_mode) and attrs.st_size == 4096 and attrs.st_nlink == 2
    assert await core.listdir("a") == ["b"]
    assert await core.listdir("a/b") == ["c"]


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_empty_folder_is_an_empty_directory(core, store):
    await store.create_folder("empty/")
    assert stat.S_ISDIR((await core.stat("empty")).st_mode)
    assert await core.listdir("empty") == []
    assert await core.listdir() == ["empty"]


@pytest.mark.parametrize("kind", ["flat"])
async def test_placeholder_object_is_an_empty_directory(core, store):
    store.put("empty/", b"")
    assert stat.S_ISDIR((await core.stat("empty")).st_mode)
    assert await core.listdir("empty") == []
    assert await core.listdir() == ["empty"]


@pytest.mark.parametrize("listed_first", [False, True], ids=["lookup", "listing"])
async def test_directory_wins_over_file(core, store, listed_first):
    store.put("x", b"a file")
    store.put("x/inner", b"y")
    if listed_first:
        assert await core.listdir() == ["x"]  # one entry, the directory
    inode = await core.lookup_path("x")
    assert inode.kind is EntryKind.DIR
    assert await core.listdir("x") == ["inner"]
    assert await core.listdir() == ["x"]


@pytest.mark.parametrize("name", ["a//b", "/lead", "./dot", "d/../up", "nul\0byte", "long/" + "n" * 256])
async def test_hidden_names_are_not_listed(core, store, name):
    store.put("visible", b"v")
    store.put(name, b"hidden")
    listing = await core.listdir()
    assert "visible" in listing
    for entry in listing:
        for sub in (await core.listdir(entry) if entry != "visible" else []):
            assert len(sub.encode()) <= 255 and sub not in ("", ".", "..") and "\0" not in sub


async def test_hidden_long_name_lookup_is_enametoolong(core, store):
    store.put("n" * 256, b"x")
    assert await core.errno(core.lookup_path("n" * 256)) == errno.ENAMETOOLONG
    assert await core.listdir() == []


async def test_dot_and_dotdot(core, store):
    store.put("d/f", b"x")
    d = await core.lookup_path("d")
    assert (await core.fs.lookup(d.ino, b".")).ino == d.ino
    assert (await core.fs.lookup(d.ino, b"..")).ino == 1
    fh = await core.fs.opendir(d.ino)
    names = [name async for name, _, _ in core.fs.readdir(fh, 0)]
    core.fs.releasedir(fh)
    assert names == [".", "..", "f"]


async def test_missing_name_is_enoent(core, store):
    store.put("d/f", b"x")
    assert await core.errno(core.lookup_path("nope")) == errno.ENOENT
    assert await core.errno(core.lookup_path("d/nope")) == errno.ENOENT
    assert await core.errno(core.lookup_path("nope/deeper")) == errno.ENOENT


async def test_negative_answer_is_cached(core, store):
    assert await core.errno(core.lookup_path("later")) == errno.ENOENT
    calls = store.calls["stat_name"]
    store.put("later", b"x")  # made elsewhere: invisible while the negative answer is fresh
    assert await core.errno(core.lookup_path("later")) == errno.ENOENT
    assert store.calls["stat_name"] == calls


@pytest.mark.parametrize("core_options", [{"negative_ttl": 0, "metadata_ttl": 0}])
async def test_without_ttls_new_objects_show_at_once(core, store):
    assert await core.errno(core.lookup_path("later")) == errno.ENOENT
    store.put("later", b"x")
    assert (await core.stat("later")).st_size == 1


@pytest.mark.parametrize("core_options", [{"metadata_ttl": 3, "negative_ttl": 10}])
async def test_changes_made_elsewhere_show_once_their_ttl_passed(core, store, clock):
    assert await core.errno(core.lookup_path("later")) == errno.ENOENT
    store.put("later", b"x")
    clock.advance(9.9)
    assert await core.errno(core.lookup_path("later")) == errno.ENOENT  # the negative TTL has not passed
    clock.advance(0.2)
    assert (await core.stat("later")).st_size == 1
    store.put("f", b"version one")
    assert (await core.stat("f")).st_size == 11
    store.put("f", b"version two, longer")
    clock.advance(2.9)
    assert (await core.stat("f")).st_size == 11  # the metadata TTL has not passed
    clock.advance(0.2)
    assert await core.read_file("f") == b"version two, longer"


@pytest.mark.parametrize("core_options", [{"metadata_ttl": 3, "negative_ttl": 30}])
async def test_a_listings_silence_ends_with_the_listing(core, store, clock):
    """A name made elsewhere after a listing stays unseen while the listing is
    fresh, however long the negative TTL is."""
    store.put("d/f", b"x")
    await core.listdir("d")
    store.put("d/late", b"late")
    calls = sum(store.calls.values())
    assert await core.errno(core.lookup_path("d/late")) == errno.ENOENT
    assert sum(store.calls.values()) == calls, "answered from the listing"
    clock.advance(3.1)
    assert await core.read_file("d/late") == b"late"


async def test_listing_is_sorted_and_unique(core, store):
    for name in ("b", "a/x", "a/y", "c", "B", "é"):
        store.put(name, b"1")
    assert await core.listdir() == sorted(["a", "b", "c", "B", "é"], key=lambda n: n.encode())


async def test_lookup_answers_from_a_fresh_listing(core, store):
    store.put("d/f", b"x")
    await core.listdir("d")
    calls = store.calls["stat_name"] + store.calls["get_object"]
    assert (await core.stat("d/f")).st_size == 1
    assert await core.errno(core.lookup_path("d/missing")) == errno.ENOENT
    assert store.calls["stat_name"] + store.calls["get_object"] == calls


async def test_symlink_and_readlink(core, store):
    await core.symlink("link", "some/target")
    inode = await core.lookup_path("link")
    assert inode.kind is EntryKind.SYMLINK
    assert await core.readlink("link") == "some/target"
    attrs = core.fs.attributes_of(inode)
    assert stat.S_ISLNK(attrs.st_mode) and attrs.st_size == len("some/target")
    assert store.meta("link").metadata["gcsfuse_symlink_target"] == "some/target"


async def test_stat_of_a_file_deleted_elsewhere(other, store):
    core = await other(metadata_ttl=0)
    store.put("f", b"abc")
    inode = await core.lookup_path("f")
    store.delete_external("f")
    assert await core.errno(core.call(core.fs.getattr, inode.ino)) == errno.ENOENT


@pytest.mark.parametrize("kind", KINDS)
async def test_overwrite_elsewhere_gives_a_new_inode(other, store, kind):
    core = await other(metadata_ttl=0)
    store.put("f", b"abc")
    first = await core.lookup_path("f")
    store.put("f", b"abcdef")
    second = await core.lookup_path("f")
    assert second.ino != first.ino and second.size == 6
    assert (await core.lookup_path("f")).ino == second.ino  # stable while the generation is
