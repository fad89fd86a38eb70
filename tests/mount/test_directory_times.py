"""Directory times through real mounts: ``rsync -a`` twice, across a remount,
changes nothing the second time, and a directory shows its folder's time,
not the time the mount started."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import time

import pytest

from rapidmount.emulator import Emulator
from rapidmount.workers.client.storage import record_from_object
from rapidmount.emulator.convert import folder_proto
from rapidmount.emulator.resources import object_message
from rapidmount.storage.model import MTIME_METADATA_KEY, parse_mtime
from tests.mountutil import HangGuard

ZONAL = "dirtimes-zonal"
FLAT = "dirtimes-flat"
TEST_TIME_LIMIT = 120.0  # per test; past it the daemons are killed so the test fails instead of hanging
#: the source tree's directories, and the time each was last changed (years ago)
DIRECTORIES = {"": 1_000_000_000_000_000_000, "a": 1_100_000_000_111_111_111, "a/b": 1_200_000_000_222_222_222,
               "a/b/c": 1_300_000_000_333_333_333, "a/b/c/d": 1_310_000_000_444_444_444,
               "e": 1_400_000_000_555_555_555, "e/empty": 1_500_000_000_666_666_666}

_GUARD = HangGuard(TEST_TIME_LIMIT)
_hang_guard = _GUARD.autouse_fixture()


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={ZONAL: "zonal", FLAT: "flat"}) as emulator:
        yield emulator


def _rsync(*args: str) -> str:
    rsync = shutil.which("rsync")
    assert rsync, "rsync is not installed: this test needs it (apt-get install rsync)"
    result = subprocess.run([rsync, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"rsync {args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _source_tree(root: pathlib.Path) -> None:
    """Files at several depths, an empty directory; every time set, deepest first."""
    for number, directory in enumerate(DIRECTORIES):
        path = root / directory
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(path, 0o755)
        if directory != "e/empty":
            (path / f"file{number}.txt").write_bytes(b"x" * (number * 100))
            os.chmod(path / f"file{number}.txt", 0o644)
            os.utime(path / f"file{number}.txt", ns=(DIRECTORIES[directory] + 7,) * 2)
    for directory in sorted(DIRECTORIES, key=len, reverse=True):
        os.utime(root / directory, ns=(DIRECTORIES[directory],) * 2)


@pytest.mark.parametrize("bucket", [ZONAL, FLAT])
def test_rsync_twice_across_a_remount_changes_nothing(emu, tmp_path, bucket):
    source = tmp_path / "source"
    _source_tree(source)
    with _GUARD.mount(emu, bucket) as first:
        target = first.path / "tree"
        _rsync("-a", f"{source}/", f"{target}/")
        assert {d: os.stat(target / d).st_mtime_ns for d in DIRECTORIES} == DIRECTORIES
        os.mkdir(first.path / "made")  # no time set on it: its folder's (or placeholder's) time shows
    for directory, mtime_ns in DIRECTORIES.items():  # kept in each directory's placeholder object
        placeholder = emu.object_info(bucket, f"tree/{directory}/".replace("//", "/"))
        assert placeholder is not None and placeholder["size"] == 0, directory
        assert parse_mtime(placeholder["metadata"][MTIME_METADATA_KEY]) == mtime_ns, directory

    remounted_at = time.time_ns()
    with _GUARD.mount(emu, bucket) as second:
        target = second.path / "tree"
        assert {d: os.stat(target / d).st_mtime_ns for d in DIRECTORIES} == DIRECTORIES
        changes = _rsync("-a", "--itemize-changes", f"{source}/", f"{target}/")
        assert changes == "", f"the second rsync changed what the first one made:\n{changes}"
        assert ".d..t......" not in changes

        made = os.stat(second.path / "made")
        if bucket == ZONAL:  # the folder's update time
            expected = folder_proto(emu.store.get_folder(bucket, "made/")).update_time.ToNanoseconds()
        else:  # the placeholder's
            expected = record_from_object(object_message(emu.store.find_object(bucket, "made/"))).mtime_ns
        assert (made.st_mtime_ns, made.st_ctime_ns) == (expected, expected)
        assert made.st_mtime_ns < remounted_at, "a directory showed the time the mount started"
