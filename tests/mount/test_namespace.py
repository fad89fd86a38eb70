"""Namespace behaviour and mount options, through real mounts."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import time

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import mounted
from tests.polling import until

BUCKET = "ns-bucket"


@pytest.fixture(scope="module")
def emu(request_loop):
    with Emulator(buckets={BUCKET: "zonal", "ns-flat": "flat"}) as emulator:
        emulator.seed(BUCKET, "data/train/a.bin", b"a" * 1000)
        emulator.seed(BUCKET, "data/train/b.bin", b"b" * 2000)
        emulator.seed(BUCKET, "data/eval/c.bin", b"c" * 10)
        emulator.seed(BUCKET, "top.txt", b"top\n")
        emulator.seed(BUCKET, "link-to-top", b"", metadata={"gcsfuse_symlink_target": "top.txt"})
        emulator.seed("ns-flat", "x/y/z.txt", b"zzz")
        emulator.seed("ns-flat", "empty-dir/", b"")
        yield emulator


def test_only_dir_mounts_a_prefix(emu):
    with mounted(emu.endpoint, BUCKET, "--only-dir", "data/train") as m:
        assert sorted(os.listdir(m.path)) == ["a.bin", "b.bin"]
        assert (m.path / "b.bin").read_bytes() == b"b" * 2000
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "top.txt")


def test_owner_and_modes(emu):
    with mounted(emu.endpoint, BUCKET, "--uid", "1234", "--gid", "4321", "--file-mode", "0600",
                 "--dir-mode", "0750") as m:
        f = os.stat(m.path / "top.txt")
        d = os.stat(m.path / "data")
        assert (f.st_uid, f.st_gid, stat.S_IMODE(f.st_mode)) == (1234, 4321, 0o600)
        assert (d.st_uid, d.st_gid, stat.S_IMODE(d.st_mode)) == (1234, 4321, 0o750)
        assert stat.S_ISREG(f.st_mode) and stat.S_ISDIR(d.st_mode)
        assert f.st_size == 4
        assert abs(f.st_mtime - time.time()) < 3600


def test_read_only_mount_refuses_changes(emu):
    with mounted(emu.endpoint, BUCKET, "-o", "ro") as m:
        assert (m.path / "top.txt").read_bytes() == b"top\n"
        for action in (lambda: open(m.path / "top.txt", "ab"), lambda: open(m.path / "new.txt", "wb"),
                       lambda: os.mkdir(m.path / "newdir"), lambda: os.unlink(m.path / "top.txt")):
            with pytest.raises(OSError) as info:
                action()
            assert info.value.errno == errno.EROFS
        assert "ro" in subprocess.run(["findmnt", "-no", "OPTIONS", str(m.path)], capture_output=True,
                                      text=True).stdout.split(",")


def test_symlinks_from_gcsfuse_metadata(emu):
    with mounted(emu.endpoint, BUCKET) as m:
        link = m.path / "link-to-top"
        assert os.path.islink(link)
        assert os.readlink(link) == "top.txt"
        assert link.read_bytes() == b"top\n"


def test_flat_bucket_implicit_and_placeholder_dirs(emu):
    with mounted(emu.endpoint, "ns-flat") as m:
        assert sorted(os.listdir(m.path)) == ["empty-dir", "x"]
        assert (m.path / "x/y/z.txt").read_bytes() == b"zzz"
        assert os.listdir(m.path / "empty-dir") == []
        assert (m.path / "x" / "y").is_dir()


def test_hns_empty_folder_shows_up(emu):
    emu.store.create_folder(BUCKET, "empty-folder/")
    with mounted(emu.endpoint, BUCKET) as m:
        assert "empty-folder" in os.listdir(m.path)
        assert (m.path / "empty-folder").is_dir()
        assert os.listdir(m.path / "empty-folder") == []


def test_metadata_ttl_and_new_generations(emu):
    """A changed object shows up once the TTL passed; a handle keeps its generation.
    (When exactly: tests/core/test_lookup.py, on a fake clock.)"""
    emu.seed(BUCKET, "changing.txt", b"version one\n")
    with mounted(emu.endpoint, BUCKET, "--metadata-ttl", "1", "--negative-ttl", "1") as m:
        path = m.path / "changing.txt"
        assert path.read_bytes() == b"version one\n"
        with open(path, "rb") as pinned:
            emu.seed(BUCKET, "changing.txt", b"version two, longer\n")
            until(lambda: path.read_bytes() == b"version two, longer\n", 20, "the new version")
            # The old handle still reads the generation it opened, or fails
            # cleanly with ESTALE once that generation is gone; never a mix.
            try:
                assert pinned.read() == b"version one\n"
            except OSError as err:
                assert err.errno == errno.ESTALE
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "appears-later.txt")
        emu.seed(BUCKET, "appears-later.txt", b"hi")
        until((m.path / "appears-later.txt").exists, 20, "the new name")
        assert (m.path / "appears-later.txt").read_bytes() == b"hi"


def test_metadata_ttl_forever_serves_cached_view(emu):
    emu.seed(BUCKET, "immutable.txt", b"frozen")
    with mounted(emu.endpoint, BUCKET, "--metadata-ttl", "-1") as m:
        assert os.stat(m.path / "immutable.txt").st_size == 6
        emu.reset_rpc_counts()
        for _ in range(20):
            assert os.stat(m.path / "immutable.txt").st_size == 6
        assert emu.rpc_counts.get("GetObject", 0) == 0


def test_tailing_a_growing_unfinalized_object_with_o_direct(emu):
    """O_DIRECT readers see bytes appended by another writer after they opened."""
    import asyncio

    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter
    from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient

    async def append_later(writer, data):
        await writer.append(data)
        await writer.flush()

    async def open_writer():
        # The client's channel binds to the loop it is created on.
        client = AsyncGrpcClient(credentials=AnonymousCredentials(),
                                 client_options=ClientOptions(api_endpoint=emu.endpoint))
        writer = AsyncAppendableObjectWriter(client, BUCKET, "growing.log")
        await writer.open()
        return writer

    loop = asyncio.new_event_loop()
    try:
        writer = loop.run_until_complete(open_writer())
        loop.run_until_complete(append_later(writer, b"line 1\n"))
        with mounted(emu.endpoint, BUCKET, "--metadata-ttl", "0") as m:
            fd = os.open(m.path / "growing.log", os.O_RDONLY | os.O_DIRECT)
            try:
                assert os.pread(fd, 4096, 0) == b"line 1\n"
                loop.run_until_complete(append_later(writer, b"line 2\n"))
                assert os.pread(fd, 4096, 7) == b"line 2\n"
                assert os.pread(fd, 4096, 0) == b"line 1\nline 2\n"
            finally:
                os.close(fd)
            assert os.stat(m.path / "growing.log").st_size == 14
        loop.run_until_complete(writer.close())
    finally:
        loop.close()


def test_kernel_cache_kept_across_opens_while_generation_unchanged(emu):
    emu.seed(BUCKET, "cached.bin", os.urandom(1 << 20))
    with mounted(emu.endpoint, BUCKET) as m:
        (m.path / "cached.bin").read_bytes()
        emu.reset_rpc_counts()
        (m.path / "cached.bin").read_bytes()
        assert emu.rpc_counts.get("BidiReadObject", 0) == 0


def test_listing_has_dot_entries_and_stable_inodes(emu):
    with mounted(emu.endpoint, BUCKET) as m:
        listed = subprocess.run(["ls", "-a", str(m.path / "data")], capture_output=True, text=True).stdout.split()
        assert listed[:2] == [".", ".."] and sorted(listed[2:]) == ["eval", "train"]
        first = os.stat(m.path / "data/train/a.bin").st_ino
        os.listdir(m.path / "data/train")
        assert os.stat(m.path / "data/train/a.bin").st_ino == first
        assert os.stat(m.path / "data").st_ino != first
