"""Writes and namespace changes through a real FUSE mount, against the emulator.

Zonal (Rapid) buckets stream new files and appends over one BidiWriteObject
stream per handle; everything else (random writes, O_TRUNC, truncate, appends
to finalized objects) is staged in a local file and uploaded with a generation
precondition. Hierarchical (hns) and flat buckets stage and upload with
WriteObject. Every test checks what the bucket holds (``emu.read_object`` /
``emu.object_info``), not only what the mount says.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import io
import os
import pathlib
import random
import re
import shutil
import stat
import subprocess
import tarfile
import time
from dataclasses import dataclass

import google_crc32c
import pytest

from rapidmount.emulator import Emulator
from rapidmount.emulator.store import NotFound
from tests.conftest import make_official_client
from tests.mountutil import HangGuard, after_release, write_all
from tests.mountutil import payload, errno_name, errno_of, assert_errno

MiB = 1 << 20
BUCKET = "write-bucket"  # zonal
HNS = "write-hns"
FLAT = "write-flat"
KINDS = {BUCKET: "zonal", HNS: "hns", FLAT: "flat"}
SYMLINK_KEY = "gcsfuse_symlink_target"
MTIME_KEY = "gcsfuse_mtime"
TEST_TIME_LIMIT = 90.0  # per test; past it the daemons are killed so the test fails instead of hanging


# ---------------------------------------------------------------- helpers

_GUARD = HangGuard(TEST_TIME_LIMIT)
_mount = _GUARD.mount
_hang_guard = _GUARD.autouse_fixture()


def _run(command: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def _close_allowing(fd: int, *allowed: int) -> None:
    """Close ``fd``; a failure is fine only with one of the ``allowed`` errnos."""
    try:
        os.close(fd)
    except OSError as err:
        assert err.errno in allowed, f"close failed with {errno_name(err.errno)}"


def official_read(endpoint: str, bucket: str, name: str) -> bytes:
    """The whole object through Google's AsyncMultiRangeDownloader."""
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    async def scenario() -> bytes:
        client = make_official_client(endpoint)  # bound to this loop
        mrd = await AsyncMultiRangeDownloader.create_mrd(client, bucket, name)
        try:
            buffer = io.BytesIO()
            await mrd.download_ranges([(0, 0, buffer)])
            return buffer.getvalue()
        finally:
            await mrd.close()

    return asyncio.run(scenario())


def official_takeover_append(endpoint: str, bucket: str, name: str, generation: int, data: bytes) -> None:
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter

    async def scenario() -> None:
        writer = AsyncAppendableObjectWriter(make_official_client(endpoint), bucket, name, generation=generation)
        await writer.open()
        await writer.append(data)
        await writer.flush()
        await writer.close()

    asyncio.run(scenario())


def _folder_exists(emu: Emulator, bucket: str, folder: str) -> bool:
    try:
        emu.store.get_folder(bucket, folder)
    except NotFound:
        return False
    return True


def _objects_under(emu: Emulator, bucket: str, prefix: str) -> dict[str, bytes]:
    listing = emu.store.list_objects(bucket, prefix=prefix)
    assert not listing.next_page_token
    return {record.name[len(prefix):]: emu.read_object(bucket, record.name) for record in listing.objects}


def _rfc3339_ns(text: str) -> int:
    match = re.fullmatch(r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)",
                         text.strip())
    assert match, f"{MTIME_KEY} is not RFC 3339: {text!r}"
    zone = "+00:00" if match[4] in ("Z", "z") else match[4]
    seconds = datetime.datetime.fromisoformat(f"{match[1]}T{match[2]}{zone}").timestamp()
    return int(seconds) * 1_000_000_000 + int((match[3] or "0").ljust(9, "0"))


def _make_tree(root: pathlib.Path) -> None:
    """A small tree: empty, tiny, medium and multi-chunk files, nesting, a symlink."""
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "empty.txt").write_bytes(b"")
    (root / "small.txt").write_bytes(b"hello, rapid bucket\n")
    (root / "sub" / "mid.bin").write_bytes(payload(100_003, 11))
    (root / "sub" / "deeper" / "big.bin").write_bytes(payload(3 * MiB + 7, 12))
    for index in range(5):
        (root / "sub" / f"n{index}.txt").write_bytes(b"%d\n" % index * (index + 1))
    os.symlink("sub/mid.bin", root / "link")


def _snapshot(root: pathlib.Path) -> dict[str, tuple]:
    """rel path -> ("dir",) | ("link", target) | ("file", bytes), listing errors raised."""
    out: dict[str, tuple] = {}

    def fail(err: OSError) -> None:
        raise err

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        base = pathlib.Path(dirpath)
        for name in dirnames + filenames:
            path = base / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", path.read_bytes())
    return out


def _assert_tree_in_bucket(emu: Emulator, bucket: str, prefix: str, tree: dict[str, tuple]) -> None:
    for rel, entry in tree.items():
        if entry[0] == "file":
            assert emu.read_object(bucket, prefix + rel) == entry[1], f"object {prefix + rel}"
        elif entry[0] == "link":
            info = emu.object_info(bucket, prefix + rel)
            assert info is not None, f"no symlink object {prefix + rel}"
            assert info["size"] == 0 and info["metadata"].get(SYMLINK_KEY) == entry[1], info


def _temp_files_in_use(pid: int, temp_dir: str) -> list[str]:
    """Files under ``temp_dir``, and the daemon's open file descriptors into it."""
    found = [os.path.join(root, name) for root, _, names in os.walk(temp_dir) for name in names]
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(temp_dir.rstrip("/") + "/"):
                    found.append(f"fd {fd} -> {target}")
    return found


@dataclass
class Workdir:
    """A directory of its own for one test: ``path`` in the mount, ``prefix`` in the bucket."""

    bucket: str
    path: pathlib.Path
    prefix: str
    rel: str

    def obj(self, rel: str) -> str:
        return self.prefix + rel


def _workdir(emu: Emulator, bucket: str, mount_path: pathlib.Path, request) -> Workdir:
    """Made through the mount: a directory made behind its back would stay
    ENOENT for --negative-ttl after anything on the machine listed the
    mount's root, and the test would depend on nobody doing so."""
    rel = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_")
    (mount_path / rel).mkdir()
    return Workdir(bucket, mount_path / rel, rel + "/", rel)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def emu(request_loop):
    with Emulator(buckets=dict(KINDS)) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def mount(emu):
    """Default flags on the zonal bucket (unfinalized on close, 32MiB write buffer)."""
    with _mount(emu, BUCKET, "--retry-deadline", "20") as m:
        yield m


@pytest.fixture
def work(emu, mount, request) -> Workdir:
    return _workdir(emu, BUCKET, mount.path, request)


def mount_per_bucket(buckets: list[str], ids: list[str] | None = None):
    """(``bucket_mount``, ``work``) fixtures: one mount per bucket of ``buckets``
    for a whole module, and a work directory of its own per test."""

    @pytest.fixture(scope="module", params=buckets, ids=ids)
    def bucket_mount(request, emu):
        with _mount(emu, request.param, "--retry-deadline", "20") as m:
            yield request.param, m

    @pytest.fixture
    def work(emu, bucket_mount, request):
        bucket, m = bucket_mount
        return _workdir(emu, bucket, m.path, request)

    return bucket_mount, work


@pytest.fixture(scope="module", params=["hns", "flat"])
def nonzonal(request, emu):
    bucket = {"hns": HNS, "flat": FLAT}[request.param]
    with _mount(emu, bucket, "--retry-deadline", "20") as m:
        yield bucket, m


# ---------------------------------------------------------------- tools: cp, dd, tar, rsync

def test_cp_of_a_large_file(mount, emu, work, tmp_path):
    data = payload(5 * MiB + 12_345, 1)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    target = work.path / "copied.bin"
    _run(["cp", str(source), str(target)])
    assert os.stat(target).st_size == len(data)
    assert emu.read_object(BUCKET, work.obj("copied.bin")) == data
    assert official_read(emu.endpoint, BUCKET, work.obj("copied.bin")) == data
    info = emu.object_info(BUCKET, work.obj("copied.bin"))
    assert info["finalized"] is False, "close must leave the object appendable by default"
    assert target.read_bytes() == data


def test_dd_with_conv_fsync(mount, emu, work, tmp_path):
    target = work.path / "random.bin"
    _run(["dd", "if=/dev/urandom", f"of={target}", "bs=1M", "count=20", "conv=fsync"])
    persisted = emu.read_object(BUCKET, work.obj("random.bin"))
    assert len(persisted) == 20 * MiB
    assert os.stat(target).st_size == 20 * MiB
    assert target.read_bytes() == persisted
    # The same with bytes known in advance: dd writes exactly them.
    data = payload(20 * MiB + 4097, 2)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    _run(["dd", f"if={source}", f"of={work.path / 'known.bin'}", "bs=1M", "conv=fsync"])
    assert emu.read_object(BUCKET, work.obj("known.bin")) == data


def test_tar_extract_of_a_small_tree(mount, emu, work, tmp_path):
    local = tmp_path / "tree"
    _make_tree(local)
    tarball = tmp_path / "tree.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(local, arcname="tree")
    # -m: no mtimes (utime on directories is not part of the specified behaviour).
    _run(["tar", "-x", "-z", "-m", "-f", str(tarball), "-C", str(work.path)])
    expected = _snapshot(local)
    assert _snapshot(work.path / "tree") == expected
    _assert_tree_in_bucket(emu, BUCKET, work.obj("tree/"), expected)


def test_rsync_archive_of_a_small_tree(mount, emu, work, tmp_path):
    rsync = shutil.which("rsync")
    assert rsync, "rsync is not installed: this test needs it (apt-get install rsync)"
    local = tmp_path / "tree"
    _make_tree(local)
    target = work.path / "synced"
    # rsync writes each file to a temporary name, sets its mode, owner and
    # mtime, then renames it into place. Directory mtimes are not specified.
    _run([rsync, "-a", "--omit-dir-times", f"{local}/", f"{target}/"])
    expected = _snapshot(local)
    assert _snapshot(target) == expected, "rsync left a different tree (or temporary files)"
    _assert_tree_in_bucket(emu, BUCKET, work.obj("synced/"), expected)
    # The mtimes were stored: a second run finds nothing to transfer.
    again = _run([rsync, "-a", "--omit-dir-times", "-i", f"{local}/", f"{target}/"])
    transfers = [line for line in again.stdout.splitlines() if line[:2] in (">f", "<f", "cL")]
    assert transfers == [], f"rsync transferred again (mtime or size not kept): {transfers}"


# ---------------------------------------------------------------- streaming appends (zonal)

def test_appends_across_several_opens(mount, emu, work):
    path = work.path / "log.txt"
    name = work.obj("log.txt")
    parts = [payload(size, 20 + i) for i, size in enumerate([10, 3 * MiB + 1, 1, 70_000])]
    expected = b""
    generation = None
    emu.reset_rpc_counts()
    for part in parts:
        with open(path, "ab") as f:
            f.write(part)
        expected += part
        assert os.stat(path).st_size == len(expected)
        assert emu.read_object(BUCKET, name) == expected
        info = emu.object_info(BUCKET, name)
        assert info["finalized"] is False
        if generation is None:
            generation = info["generation"]
        assert info["generation"] == generation, "an append to an unfinalized object must take it over, " \
                                                 "not upload a new generation"
    counts = emu.rpc_counts
    # One stream per handle at most (a handle whose release is still pending may lend its stream).
    assert 1 <= counts.get("BidiWriteObject", 0) <= len(parts), f"one stream per writing handle: {counts}"
    assert counts.get("WriteObject", 0) == 0, counts
    assert path.read_bytes() == expected
    assert official_read(emu.endpoint, BUCKET, name) == expected


def test_fsynced_bytes_are_visible_to_the_official_client_before_close(mount, emu, work):
    path = work.path / "stream.bin"
    name = work.obj("stream.bin")
    emu.reset_rpc_counts()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    written = b""
    try:
        for index, size in enumerate([1000, 2 * MiB + 3, 500_000]):
            chunk = payload(size, 30 + index)
            write_all(fd, chunk)
            written += chunk
            (os.fdatasync if index == 2 else os.fsync)(fd)
            assert emu.read_object(BUCKET, name) == written, f"after sync #{index + 1}"
            assert official_read(emu.endpoint, BUCKET, name) == written, f"after sync #{index + 1}"
    finally:
        os.close(fd)
    info = emu.object_info(BUCKET, name)
    assert info["size"] == len(written) and info["finalized"] is False
    assert emu.rpc_counts.get("BidiWriteObject", 0) == 1, "one stream for the handle's whole life"


def test_write_at_eof_takes_over_the_unfinalized_object(mount, emu, work):
    head, tail = payload(300_001, 40), payload(2 * MiB + 9, 41)
    generation = emu.seed(BUCKET, work.obj("tail.bin"), head, finalize=False)
    with open(work.path / "tail.bin", "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(tail)
    info = emu.object_info(BUCKET, work.obj("tail.bin"))
    assert emu.read_object(BUCKET, work.obj("tail.bin")) == head + tail
    assert info["generation"] == generation and info["finalized"] is False


@pytest.mark.parametrize("other", ["second-mount", "official-client"])
def test_takeover_by_another_writer_gives_estale(mount, emu, work, other):
    path = work.path / "shared.log"
    name = work.obj("shared.log")
    a_synced = payload(700_000, 50)
    b_first, b_second = payload(400_000, 51), payload(123_456, 52)
    fd_a = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd_a, a_synced)
        os.fsync(fd_a)
        if other == "official-client":
            official_takeover_append(emu.endpoint, BUCKET, name, emu.object_info(BUCKET, name)["generation"],
                                     b_first + b_second)
        else:
            with _mount(emu, BUCKET, "--retry-deadline", "20") as second:
                fd_b = os.open(second.path / work.rel / "shared.log", os.O_WRONLY | os.O_APPEND)
                try:
                    write_all(fd_b, b_first)
                    os.fsync(fd_b)
                    assert emu.read_object(BUCKET, name) == a_synced + b_first
                    _check_fenced(fd_a)
                    write_all(fd_b, b_second)
                finally:
                    os.close(fd_b)
        if other == "official-client":
            _check_fenced(fd_a)
    finally:
        _close_allowing(fd_a, errno.ESTALE, errno.EIO)
    assert emu.read_object(BUCKET, name) == a_synced + b_first + b_second, \
        "the first writer's fsync'd bytes, then the second writer's, nothing else"


def _check_fenced(fd_a: int) -> None:
    """The fenced writer's next write or fsync fails with ESTALE."""
    with pytest.raises(OSError) as info:
        write_all(fd_a, b"late bytes from the fenced writer")
        os.fsync(fd_a)
    assert info.value.errno == errno.ESTALE, f"expected ESTALE, got {errno_name(info.value.errno)}"


# ---------------------------------------------------------------- staged writes (zonal)

def _model_write(model: bytearray, offset: int, data: bytes) -> None:
    if offset > len(model):
        model.extend(bytes(offset - len(model)))
    model[offset:offset + len(data)] = data


def test_random_writes_are_staged_and_read_back(mount, emu, work):
    name = work.obj("random.bin")
    base = payload(3 * MiB + 100, 60)
    generation = emu.seed(BUCKET, name, base)
    model = bytearray(base)
    rng = random.Random(60)
    fd = os.open(work.path / "random.bin", os.O_RDWR)
    try:
        for _ in range(40):
            offset = rng.randrange(0, len(model) + 10_000)
            chunk = rng.randbytes(rng.choice([1, 100, 4096, 70_000, 600_000]))
            assert os.pwrite(fd, chunk, offset) == len(chunk)
            _model_write(model, offset, chunk)
            probe = rng.randrange(0, len(model))
            assert os.pread(fd, 8192, probe) == bytes(model[probe:probe + 8192]), "read-your-writes"
        assert os.fstat(fd).st_size == len(model)
        with open(work.path / "random.bin", "rb") as other:
            assert other.read() == bytes(model), "another handle sees the staged bytes"
        assert emu.read_object(BUCKET, name) == base, "nothing is uploaded before fsync or close"
        os.fsync(fd)
        assert emu.read_object(BUCKET, name) == bytes(model)
        synced = emu.object_info(BUCKET, name)
        assert synced["generation"] != generation, "a staged upload is a new generation"
        os.pwrite(fd, b"after fsync", 5)
        _model_write(model, 5, b"after fsync")
    finally:
        os.close(fd)
    assert emu.read_object(BUCKET, name) == bytes(model)
    assert (work.path / "random.bin").read_bytes() == bytes(model)


@pytest.mark.parametrize("finalized", [True, False], ids=["finalized", "unfinalized"])
def test_o_trunc_of_an_existing_object(mount, emu, work, finalized):
    old, new = payload(2 * MiB + 1, 70), payload(12_345, 71)
    generation = emu.seed(BUCKET, work.obj("t.bin"), old, finalize=finalized)
    with open(work.path / "t.bin", "wb") as f:
        f.write(new)
    assert emu.read_object(BUCKET, work.obj("t.bin")) == new
    assert emu.object_info(BUCKET, work.obj("t.bin"))["generation"] != generation
    assert os.stat(work.path / "t.bin").st_size == len(new)
    # O_TRUNC and nothing written: an empty object. A truncation alone is not
    # uploaded by the flush of close() but by the release the kernel sends
    # right after close() returned (so that `echo x > file`, which closes a
    # duplicate descriptor before it writes, makes one generation): wait for it.
    emu.seed(BUCKET, work.obj("emptied.bin"), old, finalize=finalized)
    open(work.path / "emptied.bin", "wb").close()
    assert os.stat(work.path / "emptied.bin").st_size == 0, "this mount sees the truncation at once"
    assert after_release(lambda: emu.object_info(BUCKET, work.obj("emptied.bin"))["size"] == 0)
    assert os.stat(work.path / "emptied.bin").st_size == 0


@pytest.mark.parametrize("finalized", [True, False], ids=["finalized", "unfinalized"])
def test_truncate_shrinks_and_grows(mount, emu, work, finalized):
    name = work.obj("cut.bin")
    data = payload(MiB + 5, 80)
    generation = emu.seed(BUCKET, name, data, finalize=finalized)
    path = work.path / "cut.bin"
    # truncate(path) has no handle to close: it is uploaded before it returns.
    os.truncate(path, 1000)
    assert os.stat(path).st_size == 1000
    assert emu.read_object(BUCKET, name) == data[:1000]
    assert emu.object_info(BUCKET, name)["generation"] != generation
    os.truncate(path, 5000)
    assert emu.read_object(BUCKET, name) == data[:1000] + bytes(4000)
    assert path.read_bytes() == data[:1000] + bytes(4000)
    # ftruncate on an open handle: visible at once; a truncation alone is
    # uploaded by the release that follows close, by fsync, or with a write.
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 10)
        assert os.fstat(fd).st_size == 10
        assert os.pread(fd, 100, 0) == data[:10]
    finally:
        os.close(fd)
    assert os.stat(path).st_size == 10
    assert after_release(lambda: emu.read_object(BUCKET, name) == data[:10])
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 7)
        os.fsync(fd)
        assert emu.read_object(BUCKET, name) == data[:7], "fsync uploads a truncation alone"
    finally:
        os.close(fd)


def test_append_to_a_finalized_object_is_staged(mount, emu, work):
    name = work.obj("sealed.log")
    old, new, more = b"sealed line\n" * 1000, payload(2 * MiB + 77, 90), b"more\n"
    generation = emu.seed(BUCKET, name, old, finalize=True)
    fd = os.open(work.path / "sealed.log", os.O_WRONLY | os.O_APPEND)
    try:
        write_all(fd, new)
        assert os.fstat(fd).st_size == len(old) + len(new)
        os.fsync(fd)
        assert emu.read_object(BUCKET, name) == old + new
        assert emu.object_info(BUCKET, name)["generation"] != generation
        write_all(fd, more)
    finally:
        os.close(fd)
    assert emu.read_object(BUCKET, name) == old + new + more
    assert (work.path / "sealed.log").read_bytes() == old + new + more


def test_read_your_writes_on_the_writing_handle_and_others(mount, emu, work):
    path = work.path / "ryw.bin"
    part1, part2 = payload(1_500_000, 100), payload(900_000, 101)
    with open(path, "w+b") as f:  # a new file: streamed
        f.write(part1)
        f.flush()
        f.seek(0)
        assert f.read() == part1
        with open(path, "rb") as other:
            assert other.read() == part1, "another handle sees unsynced bytes"
        f.seek(0, os.SEEK_END)
        f.write(part2)
        f.flush()
        assert os.pread(f.fileno(), len(part2), len(part1)) == part2
        with open(path, "rb") as other:
            assert other.read() == part1 + part2
    assert emu.read_object(BUCKET, work.obj("ryw.bin")) == part1 + part2
    # A staged handle (r+b, overwrite in the middle): other handles see it too.
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"X" * 5000)
        f.flush()
        expected = part1[:1000] + b"X" * 5000 + (part1 + part2)[6000:]
        with open(path, "rb") as other:
            assert other.read() == expected
        f.seek(0)
        assert f.read() == expected
    assert emu.read_object(BUCKET, work.obj("ryw.bin")) == expected


def test_size_grows_while_writing_and_stat_after_close(mount, emu, work):
    path = work.path / "growing.bin"
    os.listdir(work.path)  # a cached listing must not hide the new file
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    total = 0
    try:
        for index, size in enumerate([1, 4096, MiB, 2 * MiB + 1]):
            chunk = payload(size, 110 + index)
            write_all(fd, chunk)
            total += size
            assert os.fstat(fd).st_size == total
            assert os.stat(path).st_size == total
            assert "growing.bin" in os.listdir(work.path)
            listed = {entry.name: entry.stat().st_size for entry in os.scandir(work.path)}
            assert listed["growing.bin"] == total, "a listing (READDIRPLUS) must not undo the size"
            assert os.stat(path).st_size == total
            assert os.pread(fd, size, total - size) == chunk, "read-your-writes after a listing"
    finally:
        os.close(fd)
    assert os.stat(path).st_size == total, "stat right after close"
    entries = {entry.name: entry.stat().st_size for entry in os.scandir(work.path)}
    assert entries["growing.bin"] == total
    assert emu.object_info(BUCKET, work.obj("growing.bin"))["size"] == total


@pytest.mark.parametrize("how", ["pwrite", "o_trunc", "ftruncate"])
@pytest.mark.parametrize("reported_at", ["fsync", "close"])
def test_staged_upload_over_a_changed_object_gives_estale(mount, emu, work, how, reported_at):
    name = work.obj("contested.bin")
    emu.seed(BUCKET, name, payload(500_000, 120))
    theirs = payload(333_333, 121)
    path = work.path / "contested.bin"
    if how == "o_trunc":
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        write_all(fd, b"mine")
    else:
        fd = os.open(path, os.O_RDWR)
        if how == "pwrite":
            os.pwrite(fd, b"mine", 1234)
        else:
            os.ftruncate(fd, 77)
    emu.seed(BUCKET, name, theirs)  # another client replaces the object meanwhile
    if reported_at == "fsync":
        try:
            assert_errno(lambda: os.fsync(fd), errno.ESTALE, "fsync over a changed object")
        finally:
            _close_allowing(fd, errno.ESTALE, errno.EIO)
    else:
        assert_errno(lambda: os.close(fd), errno.ESTALE, "close over a changed object")
    assert emu.read_object(BUCKET, name) == theirs, "never a silent overwrite"


# ---------------------------------------------------------------- options

@pytest.fixture(scope="module")
def temp_dir(tmp_path_factory):
    return os.path.realpath(tmp_path_factory.mktemp("staging"))


@pytest.fixture(scope="module")
def staging_mount(emu, temp_dir):
    with _mount(emu, BUCKET, "--temp-dir", temp_dir, "--retry-deadline", "20") as m:
        yield m


def test_staged_writes_use_the_temp_dir(staging_mount, emu, temp_dir, request):
    work = _workdir(emu, BUCKET, staging_mount.path, request)
    data = payload(MiB, 130)
    emu.seed(BUCKET, work.obj("staged.bin"), data)
    assert _temp_files_in_use(staging_mount.pid, temp_dir) == []
    fd = os.open(work.path / "staged.bin", os.O_RDWR)
    try:
        os.pwrite(fd, b"patch", 4096)
        assert _temp_files_in_use(staging_mount.pid, temp_dir), f"nothing staged in --temp-dir {temp_dir}"
    finally:
        os.close(fd)
    assert emu.read_object(BUCKET, work.obj("staged.bin")) == data[:4096] + b"patch" + data[4101:]
    deadline = time.monotonic() + 10
    while (left := _temp_files_in_use(staging_mount.pid, temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"staged files left behind after close: {left}"


def _finalized_soon(emu: Emulator, bucket: str, name: str, within: float = 10.0) -> dict:
    """FUSE sends the last handle's release after close(2) has returned, so
    finalization (done at release) may land a moment after close."""
    deadline = time.monotonic() + within
    while not (info := emu.object_info(bucket, name))["finalized"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return info


def test_finalize_on_close(mount, emu, work):
    data = payload(3 * MiB + 11, 140)
    head, tail = payload(100_000, 141), payload(2 * MiB + 5, 142)
    emu.seed(BUCKET, work.obj("grown.bin"), head, finalize=False)
    with _mount(emu, BUCKET, "--finalize-on-close") as m:
        base = m.path / work.rel
        fd = os.open(base / "final.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
            assert emu.object_info(BUCKET, work.obj("final.bin"))["finalized"] is False, \
                "fsync persists but does not finalize"
        finally:
            os.close(fd)
        info = _finalized_soon(emu, BUCKET, work.obj("final.bin"))
        assert info["finalized"] is True, "--finalize-on-close: closed but not finalized"
        assert info["crc32c"] == google_crc32c.value(data)
        assert emu.read_object(BUCKET, work.obj("grown.bin")) == head
        with open(base / "grown.bin", "ab") as f:  # takeover, then finalize at close
            f.write(tail)
        info = _finalized_soon(emu, BUCKET, work.obj("grown.bin"))
        assert info["finalized"] is True and info["crc32c"] == google_crc32c.value(head + tail)
        assert emu.read_object(BUCKET, work.obj("grown.bin")) == head + tail
        assert os.stat(base / "final.bin").st_size == len(data)
    assert emu.read_object(BUCKET, work.obj("final.bin")) == data


# ---------------------------------------------------------------- hns and flat buckets

def test_non_zonal_writes_are_staged_and_finalized(nonzonal, emu, request):
    bucket, m = nonzonal
    work = _workdir(emu, bucket, m.path, request)
    first, second = payload(2 * MiB + 3, 150), payload(50_001, 151)
    name = work.obj("n.bin")
    emu.reset_rpc_counts()
    fd = os.open(work.path / "n.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, first)
        assert os.fstat(fd).st_size == len(first)
        os.fsync(fd)
        assert emu.read_object(bucket, name) == first, "fsync uploads"
        assert emu.object_info(bucket, name)["finalized"] is True
        write_all(fd, second)
    finally:
        os.close(fd)
    assert emu.read_object(bucket, name) == first + second
    assert emu.object_info(bucket, name)["finalized"] is True
    counts = emu.rpc_counts
    assert counts.get("WriteObject", 0) >= 2, f"fsync and close upload with WriteObject: {counts}"
    assert counts.get("BidiWriteObject", 0) == 0, counts
    # Appends, random writes, truncate and read-your-writes, all staged.
    with open(work.path / "n.bin", "ab") as f:
        f.write(b"appended")
    expected = bytearray(first + second + b"appended")
    assert emu.read_object(bucket, name) == bytes(expected)
    with open(work.path / "n.bin", "r+b") as f:
        f.seek(777)
        f.write(b"patched")
        f.flush()
        _model_write(expected, 777, b"patched")
        f.seek(0)
        assert f.read() == bytes(expected)
    assert emu.read_object(bucket, name) == bytes(expected)
    os.truncate(work.path / "n.bin", 4096)
    assert emu.read_object(bucket, name) == bytes(expected[:4096])
    assert os.stat(work.path / "n.bin").st_size == 4096
    with open(work.path / "fresh.txt", "w+b") as f:
        f.write(b"read me back")
        f.flush()
        f.seek(0)
        assert f.read() == b"read me back"
    assert emu.read_object(bucket, work.obj("fresh.txt")) == b"read me back"
    assert emu.object_info(bucket, work.obj("fresh.txt"))["finalized"] is True


def test_non_zonal_directories(nonzonal, emu, request):
    bucket, m = nonzonal
    work = _workdir(emu, bucket, m.path, request)
    # Seeded first: objects made behind the mount's back may stay hidden by its cached listing.
    emu.seed(bucket, work.obj("src/a.txt"), b"a")
    emu.seed(bucket, work.obj("src/sub/b.txt"), b"b")
    emu.reset_rpc_counts()
    os.mkdir(work.path / "d")
    if bucket == HNS:
        assert _folder_exists(emu, bucket, work.obj("d/")), "mkdir is CreateFolder"
        assert emu.rpc_counts.get("CreateFolder", 0) == 1
    else:
        assert emu.object_info(bucket, work.obj("d/")) is not None, "mkdir makes a placeholder d/"
    assert_errno(lambda: os.mkdir(work.path / "d"), errno.EEXIST, "mkdir of an existing directory")
    (work.path / "d" / "f.txt").write_bytes(b"inside")
    assert_errno(lambda: os.rmdir(work.path / "d"), errno.ENOTEMPTY, "rmdir of a non-empty directory")
    os.unlink(work.path / "d" / "f.txt")
    os.rmdir(work.path / "d")
    if bucket == HNS:
        assert not _folder_exists(emu, bucket, work.obj("d/"))
    else:
        assert emu.object_info(bucket, work.obj("d/")) is None
    assert "d" not in os.listdir(work.path)
    assert_errno(lambda: os.stat(work.path / "d"), errno.ENOENT, "stat after rmdir")
    # Renaming a directory: RenameFolder on HNS, refused on flat (no --rename-dir-limit).
    emu.reset_rpc_counts()
    if bucket == HNS:
        os.rename(work.path / "src", work.path / "dst")
        assert emu.rpc_counts.get("RenameFolder", 0) == 1
        assert _objects_under(emu, bucket, work.obj("dst/")) == {"a.txt": b"a", "sub/b.txt": b"b"}
        assert _objects_under(emu, bucket, work.obj("src/")) == {}
        assert (work.path / "dst" / "sub" / "b.txt").read_bytes() == b"b"
        assert sorted(os.listdir(work.path)) == ["dst"]
    else:
        assert_errno(lambda: os.rename(work.path / "src", work.path / "dst"), errno.ENOTSUP,
                      "rename of a directory on a flat bucket")
        assert _objects_under(emu, bucket, work.obj("src/")) == {"a.txt": b"a", "sub/b.txt": b"b"}
        assert _objects_under(emu, bucket, work.obj("dst/")) == {}
        assert sorted(os.listdir(work.path)) == ["src"]


def test_flat_rename_dir_limit(emu):
    prefix = "limited/"
    emu.seed(FLAT, prefix + "small/a", b"A")
    emu.seed(FLAT, prefix + "small/sub/b", b"B")
    big = {f"big/{index}": b"%d" % index for index in range(8)}
    for rel, data in big.items():
        emu.seed(FLAT, prefix + rel, data)
    with _mount(emu, FLAT, "--rename-dir-limit", "5") as m:
        root = m.path / "limited"
        os.rename(root / "small", root / "moved")
        assert _objects_under(emu, FLAT, prefix + "moved/") == {"a": b"A", "sub/b": b"B"}
        assert _objects_under(emu, FLAT, prefix + "small/") == {}
        assert (root / "moved" / "sub" / "b").read_bytes() == b"B"
        assert "small" not in os.listdir(root)
        assert_errno(lambda: os.rename(root / "big", root / "big2"), errno.ENOTSUP,
                      "rename of a directory of more than --rename-dir-limit objects")
        assert _objects_under(emu, FLAT, prefix + "big/") == {rel[4:]: data for rel, data in big.items()}
        assert _objects_under(emu, FLAT, prefix + "big2/") == {}


# ---------------------------------------------------------------- namespace (zonal)

def test_unlink(mount, emu, work):
    emu.seed(BUCKET, work.obj("doomed.txt"), b"bye")
    assert "doomed.txt" in os.listdir(work.path)
    os.unlink(work.path / "doomed.txt")
    assert emu.object_info(BUCKET, work.obj("doomed.txt")) is None
    assert "doomed.txt" not in os.listdir(work.path)
    assert_errno(lambda: os.stat(work.path / "doomed.txt"), errno.ENOENT, "stat after unlink")
    assert_errno(lambda: open(work.path / "doomed.txt", "rb"), errno.ENOENT, "open after unlink")
    assert_errno(lambda: os.unlink(work.path / "doomed.txt"), errno.ENOENT, "unlink twice")
    assert_errno(lambda: os.unlink(work.path / "never-was"), errno.ENOENT, "unlink of a missing name")
    # A file written through the mount, too.
    (work.path / "mine.txt").write_bytes(b"mine")
    os.unlink(work.path / "mine.txt")
    assert emu.object_info(BUCKET, work.obj("mine.txt")) is None
    assert os.listdir(work.path) == []


def test_mkdir_and_rmdir_are_folders(mount, emu, work):
    d = work.path / "d"
    emu.reset_rpc_counts()
    os.mkdir(d)
    assert _folder_exists(emu, BUCKET, work.obj("d/"))
    assert emu.rpc_counts.get("CreateFolder", 0) == 1
    assert d.is_dir() and os.listdir(d) == []
    assert_errno(lambda: os.mkdir(d), errno.EEXIST, "mkdir of an existing directory")
    (work.path / "file").write_bytes(b"f")
    assert_errno(lambda: os.mkdir(work.path / "file"), errno.EEXIST, "mkdir over a file")
    assert_errno(lambda: os.mkdir(work.path / "nope" / "x"), errno.ENOENT, "mkdir in a missing directory")
    (d / "inner.txt").write_bytes(b"in")
    assert_errno(lambda: os.rmdir(d), errno.ENOTEMPTY, "rmdir with a file inside")
    os.unlink(d / "inner.txt")
    os.mkdir(d / "sub")
    assert_errno(lambda: os.rmdir(d), errno.ENOTEMPTY, "rmdir with a subdirectory inside")
    os.rmdir(d / "sub")
    os.rmdir(d)
    assert not _folder_exists(emu, BUCKET, work.obj("d/"))
    assert emu.rpc_counts.get("DeleteFolder", 0) >= 2, "rmdir is DeleteFolder"
    assert "d" not in os.listdir(work.path)
    assert_errno(lambda: os.rmdir(d), errno.ENOENT, "rmdir of a missing directory")
    assert_errno(lambda: os.rmdir(work.path / "file"), errno.ENOTDIR, "rmdir of a file")


def test_rename_file_is_an_atomic_move_and_replaces_the_target(mount, emu, work):
    emu.seed(BUCKET, work.obj("src.txt"), b"source")
    emu.seed(BUCKET, work.obj("dst.txt"), b"old destination")
    os.listdir(work.path)
    emu.reset_rpc_counts()
    os.rename(work.path / "src.txt", work.path / "dst.txt")
    counts = emu.rpc_counts
    assert counts.get("MoveObject", 0) == 1, counts
    for rpc in ("DeleteObject", "WriteObject", "BidiWriteObject"):
        assert counts.get(rpc, 0) == 0, f"rename must be one MoveObject: {counts}"
    assert emu.object_info(BUCKET, work.obj("src.txt")) is None
    assert emu.read_object(BUCKET, work.obj("dst.txt")) == b"source"
    assert sorted(os.listdir(work.path)) == ["dst.txt"]
    assert (work.path / "dst.txt").read_bytes() == b"source"
    assert_errno(lambda: os.stat(work.path / "src.txt"), errno.ENOENT, "stat of the old name")
    os.rename(work.path / "dst.txt", work.path / "again.txt")  # to a new name
    assert emu.read_object(BUCKET, work.obj("again.txt")) == b"source"
    assert_errno(lambda: os.rename(work.path / "gone", work.path / "x"), errno.ENOENT, "rename of a missing name")


@pytest.mark.parametrize("writer", ["stream", "staged"])
def test_rename_flushes_pending_writes_first(mount, emu, work, writer):
    data = payload(2 * MiB + 99, 160)
    if writer == "stream":
        fd = os.open(work.path / "pending.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        write_all(fd, data)
        expected = data
    else:
        emu.seed(BUCKET, work.obj("pending.bin"), data)
        fd = os.open(work.path / "pending.bin", os.O_RDWR)
        os.pwrite(fd, b"patched", 10)
        expected = data[:10] + b"patched" + data[17:]
    try:
        os.rename(work.path / "pending.bin", work.path / "renamed.bin")
        assert emu.read_object(BUCKET, work.obj("renamed.bin")) == expected
        assert emu.object_info(BUCKET, work.obj("pending.bin")) is None
    finally:
        os.close(fd)
    assert emu.object_info(BUCKET, work.obj("pending.bin")) is None, "close must not bring the old name back"
    assert emu.read_object(BUCKET, work.obj("renamed.bin")) == expected
    assert sorted(os.listdir(work.path)) == ["renamed.bin"]


def test_rename_directory_is_one_rename_folder(mount, emu, work):
    emu.seed(BUCKET, work.obj("dir/a.txt"), b"a")
    emu.seed(BUCKET, work.obj("dir/sub/b.txt"), b"b")
    emu.store.create_folder(BUCKET, work.obj("dir/empty/"))
    assert sorted(os.listdir(work.path / "dir")) == ["a.txt", "empty", "sub"]
    emu.reset_rpc_counts()
    os.rename(work.path / "dir", work.path / "moved")
    counts = emu.rpc_counts
    assert counts.get("RenameFolder", 0) == 1 and counts.get("MoveObject", 0) == 0, counts
    assert _objects_under(emu, BUCKET, work.obj("moved/")) == {"a.txt": b"a", "sub/b.txt": b"b"}
    assert _objects_under(emu, BUCKET, work.obj("dir/")) == {}
    assert _folder_exists(emu, BUCKET, work.obj("moved/empty/"))
    assert not _folder_exists(emu, BUCKET, work.obj("dir/"))
    assert os.listdir(work.path) == ["moved"]
    assert sorted(os.listdir(work.path / "moved")) == ["a.txt", "empty", "sub"]
    assert (work.path / "moved" / "sub" / "b.txt").read_bytes() == b"b"
    assert_errno(lambda: os.stat(work.path / "dir"), errno.ENOENT, "stat of the old directory")


def test_symlink_is_a_gcsfuse_symlink_object(mount, emu, work):
    link = work.path / "lnk"
    os.symlink("target/of/link.txt", link)
    info = emu.object_info(BUCKET, work.obj("lnk"))
    assert info is not None and info["size"] == 0
    assert info["metadata"].get(SYMLINK_KEY) == "target/of/link.txt"
    assert os.path.islink(link) and os.readlink(link) == "target/of/link.txt"
    assert stat.S_ISLNK(os.lstat(link).st_mode)
    assert "lnk" in os.listdir(work.path)
    assert_errno(lambda: os.symlink("elsewhere", link), errno.EEXIST, "symlink over an existing name")
    (work.path / "real.txt").write_bytes(b"real")
    os.symlink("real.txt", work.path / "to-real")
    assert (work.path / "to-real").read_bytes() == b"real"
    os.unlink(link)
    assert emu.object_info(BUCKET, work.obj("lnk")) is None
    assert not os.path.lexists(link)


def test_chmod_chown_are_no_ops_and_utime_stores_mtime(mount, emu, work):
    emu.seed(BUCKET, work.obj("f.txt"), b"content")
    path = work.path / "f.txt"
    before = os.stat(path)
    os.chmod(path, 0o600)
    os.chown(path, 4321, 4321)
    os.chmod(work.path, 0o700)
    after = os.stat(path)
    assert stat.S_IMODE(after.st_mode) == 0o644, "modes come from --file-mode"
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert stat.S_IMODE(os.stat(work.path).st_mode) == 0o755, "modes come from --dir-mode"
    mtime_ns = 1_600_000_000 * 1_000_000_000
    os.utime(path, ns=(mtime_ns, mtime_ns))
    assert os.stat(path).st_mtime_ns == mtime_ns
    info = emu.object_info(BUCKET, work.obj("f.txt"))
    assert MTIME_KEY in info["metadata"], info["metadata"]
    assert _rfc3339_ns(info["metadata"][MTIME_KEY]) == mtime_ns
    assert emu.read_object(BUCKET, work.obj("f.txt")) == b"content", "utime must not touch the data"
    _run(["touch", str(path)])
    assert abs(os.stat(path).st_mtime - time.time()) < 120


def test_hard_links_are_eperm(mount, emu, work):
    emu.seed(BUCKET, work.obj("f.txt"), b"f")
    assert_errno(lambda: os.link(work.path / "f.txt", work.path / "g.txt"), errno.EPERM, "link")
    assert emu.object_info(BUCKET, work.obj("g.txt")) is None


def test_wrong_kind_errnos(mount, emu, work):
    emu.seed(BUCKET, work.obj("file.txt"), b"f")
    emu.store.create_folder(BUCKET, work.obj("dir/"))
    emu.seed(BUCKET, work.obj("full/x"), b"x")
    d, f = work.path / "dir", work.path / "file.txt"
    assert_errno(lambda: open(d, "wb"), errno.EISDIR, "open(dir, 'wb')")
    assert_errno(lambda: os.open(d, os.O_WRONLY), errno.EISDIR, "open(dir, O_WRONLY)")
    assert_errno(lambda: os.unlink(d), errno.EISDIR, "unlink of a directory")
    assert_errno(lambda: os.rename(f, d), errno.EISDIR, "rename of a file over a directory")
    assert_errno(lambda: os.rename(d, f), errno.ENOTDIR, "rename of a directory over a file")
    over_full = errno_of(lambda: os.rename(d, work.path / "full"))
    assert over_full in (errno.ENOTEMPTY, errno.EEXIST), \
        f"rename of a directory over a non-empty one: {errno_name(over_full)}"  # POSIX allows either
    assert_errno(lambda: open(f / "x", "wb"), errno.ENOTDIR, "create below a file")
    assert_errno(lambda: os.mkdir(f / "x"), errno.ENOTDIR, "mkdir below a file")
    assert_errno(lambda: os.listdir(f), errno.ENOTDIR, "listdir of a file")
    assert_errno(lambda: os.rmdir(f), errno.ENOTDIR, "rmdir of a file")
    assert_errno(lambda: open(work.path / "missing" / "x", "wb"), errno.ENOENT, "create in a missing dir")
    assert_errno(lambda: os.truncate(work.path / "missing.txt", 0), errno.ENOENT, "truncate a missing file")
    assert_errno(lambda: os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL), errno.EEXIST, "O_EXCL on a file")
    assert emu.read_object(BUCKET, work.obj("file.txt")) == b"f"
    assert emu.read_object(BUCKET, work.obj("full/x")) == b"x"


def test_changes_are_visible_at_once(mount, emu, work):
    """Kernel and metadata caches are invalidated by every change made through the mount."""
    assert os.listdir(work.path) == []
    assert_errno(lambda: os.stat(work.path / "new.txt"), errno.ENOENT, "stat before create")
    (work.path / "new.txt").write_bytes(b"new")
    assert os.listdir(work.path) == ["new.txt"]
    assert os.stat(work.path / "new.txt").st_size == 3
    os.mkdir(work.path / "sub")
    assert sorted(os.listdir(work.path)) == ["new.txt", "sub"]
    os.rename(work.path / "new.txt", work.path / "sub" / "moved.txt")
    assert os.listdir(work.path) == ["sub"]
    assert os.listdir(work.path / "sub") == ["moved.txt"]
    assert (work.path / "sub" / "moved.txt").read_bytes() == b"new"
    assert_errno(lambda: os.stat(work.path / "new.txt"), errno.ENOENT, "stat of the old name")
    (work.path / "sub" / "moved.txt").write_bytes(b"rewritten, longer")  # O_TRUNC: a new generation
    assert os.stat(work.path / "sub" / "moved.txt").st_size == len(b"rewritten, longer")
    assert (work.path / "sub" / "moved.txt").read_bytes() == b"rewritten, longer"
    os.unlink(work.path / "sub" / "moved.txt")
    assert os.listdir(work.path / "sub") == []
    assert_errno(lambda: os.stat(work.path / "sub" / "moved.txt"), errno.ENOENT, "stat after unlink")
    os.rmdir(work.path / "sub")
    assert os.listdir(work.path) == []
    assert_errno(lambda: os.stat(work.path / "sub"), errno.ENOENT, "stat after rmdir")
    (work.path / "sub").write_bytes(b"a file where a directory was")
    assert (work.path / "sub").is_file() and (work.path / "sub").read_bytes() == b"a file where a directory was"


def test_read_only_mount_refuses_every_change(emu):
    emu.seed(BUCKET, "ro-area/file.txt", b"keep me")
    emu.store.create_folder(BUCKET, "ro-area/dir/")
    with _mount(emu, BUCKET, "-o", "ro") as m:
        root = m.path / "ro-area"
        f = root / "file.txt"
        changes = {
            "create": lambda: open(root / "new.txt", "wb"),
            "open wb": lambda: open(f, "wb"),
            "open ab": lambda: open(f, "ab"),
            "open r+b": lambda: open(f, "r+b"),
            "mkdir": lambda: os.mkdir(root / "newdir"),
            "rmdir": lambda: os.rmdir(root / "dir"),
            "unlink": lambda: os.unlink(f),
            "rename": lambda: os.rename(f, root / "renamed.txt"),
            "symlink": lambda: os.symlink("file.txt", root / "lnk"),
            "link": lambda: os.link(f, root / "hard"),
            "truncate": lambda: os.truncate(f, 1),
            "chmod": lambda: os.chmod(f, 0o600),
            "chown": lambda: os.chown(f, 1, 1),
            "utime": lambda: os.utime(f, (1, 1)),
        }
        for what, action in changes.items():
            assert_errno(action, errno.EROFS, f"{what} on -o ro")
        assert f.read_bytes() == b"keep me"
    assert emu.read_object(BUCKET, "ro-area/file.txt") == b"keep me"
    assert emu.object_info(BUCKET, "ro-area/new.txt") is None
    assert _folder_exists(emu, BUCKET, "ro-area/dir/")


# ---------------------------------------------------------------- races with other clients

def test_o_append_lands_after_bytes_another_client_appended(emu, mount, work):
    """O_APPEND writes at the bucket's end, not at the end this mount last saw."""
    name = work.obj("shared.log")
    generation = emu.seed(BUCKET, name, b"abc", finalize=False)
    path = work.path / "shared.log"
    assert os.stat(path).st_size == 3  # the mount has now seen size 3
    official_takeover_append(emu.endpoint, BUCKET, name, generation, b"OTHER")
    with open(path, "ab") as f:
        f.write(b"mine")
    assert emu.read_object(BUCKET, name) == b"abcOTHERmine"


def test_staged_rewrite_after_a_concurrent_append_gives_estale(emu, mount, work):
    """Appends keep the generation; a staged upload still notices them."""
    name = work.obj("rewrite.bin")
    generation = emu.seed(BUCKET, name, b"abcdef", finalize=False)
    fd = os.open(work.path / "rewrite.bin", os.O_RDWR)
    try:
        os.pwrite(fd, b"X", 0)  # a random write: staged from "abcdef"
        official_takeover_append(emu.endpoint, BUCKET, name, generation, b"ZZZ")
        with pytest.raises(OSError) as info:
            os.fsync(fd)
        assert info.value.errno == errno.ESTALE
    finally:
        _close_allowing(fd, errno.ESTALE)
    assert emu.read_object(BUCKET, name) == b"abcdefZZZ"


def test_truncate_to_the_same_size_leaves_no_stale_state(emu, work):
    with _mount(emu, BUCKET, "--metadata-ttl", "0") as m:
        name = work.obj("same.txt")
        emu.seed(BUCKET, name, b"abc")
        path = m.path / work.rel / "same.txt"
        os.truncate(path, 3)
        emu.seed(BUCKET, name, b"abcdefg")
        assert os.stat(path).st_size == 7
        assert path.read_bytes() == b"abcdefg"


def test_truncating_a_staged_file_again_keeps_its_staged_bytes(emu, mount, work):
    """A second truncate works on the local copy: it neither rereads the bucket
    (losing staged writes) nor mistakes its own change for another client's."""
    path = work.path / "restaged.bin"
    with open(path, "w+b") as f:
        os.ftruncate(f.fileno(), 1)            # staged from the new (empty) object
        f.seek(0)
        f.write(b"0123456789" * 300)           # staged bytes
        f.flush()
        os.ftruncate(f.fileno(), 5)            # staged again: keep the first 5 staged bytes
        os.fsync(f.fileno())
        assert emu.read_object(BUCKET, work.obj("restaged.bin")) == b"01234"
    with open(path, "ab") as f:
        os.ftruncate(f.fileno(), 1)
        os.ftruncate(f.fileno(), 0)
    assert after_release(lambda: emu.read_object(BUCKET, work.obj("restaged.bin")) == b"")
