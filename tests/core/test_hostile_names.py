"""Hostile object names over the in-memory store: shown with their bytes, or
hidden with one log line each, never anything outside the mount.

The same names as tests/mount/test_hostile_names.py (fewer of them), walked
through the core as the kernel would (readdir, then lookups), with listings
made on demand and by the metadata prefetch.
"""

from __future__ import annotations

import errno
import logging

import pytest
import trio

from rapidmount.superblock.names import HiddenNames, EntryKind
from tests.core.conftest import CALL_DEADLINE, start_core
from tests.hostilenames import content, expected_view, hostile_names, names_it, refusal

pytestmark = pytest.mark.trio

COUNT = 1000


@pytest.fixture
def warnings(caplog):
    caplog.set_level(logging.WARNING, logger="rapidmount")
    return caplog


def hiding_lines(caplog) -> list[str]:
    return [f"x WARNING {record.name}: {record.getMessage()}" for record in caplog.records
            if record.getMessage().startswith(("hiding ", "more than "))]


async def walk(core) -> tuple[dict[str, bytes], set[str]]:
    """Every file (with its bytes) and directory below the root, as readdir and lookup show them."""
    files: dict[str, bytes] = {}
    directories: set[str] = set()
    pending = [""]
    while pending:
        directory = pending.pop()
        for name in await core.listdir(directory):
            assert name and name not in (".", "..") and "/" not in name and "\x00" not in name, name
            assert len(name.encode()) <= 255, name
            path = f"{directory}/{name}" if directory else name
            inode = await core.lookup_path(path)
            assert inode.path in (core.fs.root_prefix + path, core.fs.root_prefix + path + "/")
            if inode.kind is EntryKind.DIR:
                directories.add(path)
                pending.append(path)
            else:
                files[path] = await core.read_file(path)
    return files, directories


def put_names(store, names: list[str]) -> tuple[list[str], dict[str, int]]:
    """Create the names the service accepts; returns them and every name's index."""
    indexes = {name: index for index, name in enumerate(names)}
    accepted = [name for name in names if refusal(name) is None]
    for name in accepted:
        store.put(name, content(indexes[name], name))
    return accepted, indexes


@pytest.mark.parametrize("prefetch", [False, True], ids=["on-demand", "prefetch"])
async def test_hostile_names_are_shown_or_hidden_once(nursery, store, clock, warnings, prefetch):
    names = hostile_names(COUNT)
    accepted, indexes = put_names(store, names)
    view = expected_view(accepted)
    core = await start_core(nursery, store, clock=clock, prefetch_metadata=prefetch)
    if prefetch:
        with trio.fail_after(CALL_DEADLINE):
            await core.fs.preload.finished.wait()
    files, directories = await walk(core)
    assert view.shown_objects | view.hidden_objects == set(accepted)
    assert directories == view.directories
    assert set(files) == set(view.files)
    assert {path for path, data in files.items()
            if data != content(indexes[view.files[path]], view.files[path])} == set()
    # Every listing again, from the bucket, once every TTL passed: nothing is logged twice.
    calls = store.calls["list_directory"]
    clock.advance(max(core.fs.meta.ttl, core.fs.meta.listing_ttl, core.fs.meta.negative_ttl) + 1)
    assert await walk(core) == (files, directories)
    assert store.calls["list_directory"] - calls == len(directories) + 1  # and the root
    lines = hiding_lines(warnings)
    assert {key: count for key in view.hidden
            if (count := sum(1 for line in lines if names_it(line, key))) != 1} == {}
    assert len(lines) == len(view.hidden)
    await core.fs.close_all()


async def test_hidden_names_longer_than_name_max_are_enametoolong(core, store):
    store.put("d/" + "x" * 256, b"long")
    store.put("d/" + "é" * 128, b"long in UTF-8")
    assert await core.listdir("d") == []
    for name in ("x" * 256, "é" * 128):
        assert await core.errno(core.lookup_path(f"d/{name}")) == errno.ENAMETOOLONG


@pytest.mark.parametrize("kind", ["zonal"])
async def test_prefetch_logs_a_hidden_directory_once_and_keeps_nothing_below_it(nursery, store, warnings):
    """The prefetch listed directories below a hidden segment too, logging
    every one of them ("a/../" and "a/../../" for "a/../../etc/passwd")
    and caching listings nothing can reach."""
    for name in ("a/../../etc/passwd", "a/../x", "a/ok", "b//c/d", "x/./y/z"):
        store.put(name, b"?")
    core = await start_core(nursery, store, prefetch_metadata=True)
    with trio.fail_after(CALL_DEADLINE):
        await core.fs.preload.finished.wait()
    assert sorted(line.partition(": ")[2] for line in hiding_lines(warnings)) == [
        "hiding 'a/../' and every object below it: '.' or '..' segment",
        "hiding 'b//' and every object below it: empty name segment",
        "hiding 'x/./' and every object below it: '.' or '..' segment"]
    for unreachable in ("a/../", "a/../../", "a/../../etc/", "b//", "b//c/", "x/./", "x/./y/"):
        assert core.fs.meta.get_listing(unreachable) is None, unreachable
    assert core.fs.preload.directories_cached == 4  # "", "a/", "b/", "x/"
    assert await walk(core) == ({"a/ok": b"?"}, {"a", "b", "x"})
    assert len(hiding_lines(warnings)) == 3
    await core.fs.close_all()


@pytest.mark.parametrize("kind", ["zonal"])
@pytest.mark.parametrize("core_options", [{"metadata_ttl": 0}])
async def test_more_hidden_names_than_remembered_are_not_logged_at_every_listing(core, store, warnings):
    """Past its bound the memory of logged names forgot the oldest, so a
    directory holding more hidden names than that logged them all again at
    every listing."""
    core.fs.namespace.hidden = HiddenNames(max_entries=50)
    for index in range(80):
        store.put(f"d/{index:02d}/..", b"?")
        store.put(f"d/{index:02d}//x", b"?")
    for _ in range(3):
        assert await core.listdir("d") == [f"{index:02d}" for index in range(80)]
        for index in range(80):
            assert await core.listdir(f"d/{index:02d}") == []
    lines = [line.partition(": ")[2] for line in hiding_lines(warnings)]
    assert len(lines) == 51 and len(set(lines)) == 51
    assert lines[-1] == "more than 50 hidden names: the others are hidden without a log line"
