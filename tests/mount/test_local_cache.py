"""The local cache (--cache-dir) through real mounts: bytes, generations,
damage, faults, crashes, eviction, and passthrough granted or refused."""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import pathlib
import re
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard, payload, rapidmount_command

BUCKET = "local-cache"
guard = HangGuard(180)
hang_guard = guard.autouse_fixture()

MiB = 1 << 20
MODES = {"passthrough": (), "daemon": ("--no-passthrough",)}


@pytest.fixture
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


@pytest.fixture
def cache_dir():
    with tempfile.TemporaryDirectory(prefix="rapidmount-cache-") as path:
        yield pathlib.Path(path) / "cache"


def drop_kernel_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as knob:
        knob.write("3\n")


def read(path: pathlib.Path) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def read_mmap(path: pathlib.Path) -> bytes:
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        return bytes(mapped)


def read_direct(path: pathlib.Path, size: int) -> bytes:
    """The file through O_DIRECT, in aligned 1 MiB reads."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buffer = mmap.mmap(-1, MiB)
    out = bytearray()
    try:
        while True:
            count = os.preadv(fd, [buffer], len(out))
            out += buffer[:count]
            if count < MiB:
                return bytes(out)
    finally:
        os.close(fd)
        buffer.close()


def entries(cache: pathlib.Path) -> dict[str, dict]:
    try:
        document = json.loads((cache / "index.json").read_bytes())
    except FileNotFoundError:
        return {}
    return {entry["name"]: entry for entry in document["entries"]}


def wait_for_entry(cache: pathlib.Path, name: str, size: int, limit: float = 30.0) -> dict:
    """Until the cache's index (written within a second of a change) holds ``name`` whole."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        entry = entries(cache).get(name)
        if entry is not None and entry["size"] == size:
            return entry
        time.sleep(0.05)
    pytest.fail(f"{name} never completed in the local cache: {entries(cache)}")


def entry_file(cache: pathlib.Path, name: str) -> pathlib.Path:
    files = {path.name: path for path in (cache / "objects").iterdir()}
    entry = entries(cache)[name]
    digest = hashlib.sha256(f"{entry['bucket']}\0{name}\0{entry['generation']}".encode()).hexdigest()
    return files[digest]


def local_stats(mount) -> dict[str, int]:
    """Stop the daemon; the local cache's counters it logs on the way out."""
    mount.process.send_signal(signal.SIGTERM)
    mount.process.wait(timeout=30)
    match = re.search(r"local cache: CacheStats\(([^)]*)\)", mount.log())
    assert match, mount.log()[-3000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def fs_reads(log: str) -> int:
    match = re.search(r"statistics: FSStats\([^)]*\breads=(\d+)", log)
    assert match, log[-2000:]
    return int(match.group(1))


@pytest.mark.parametrize("mode", list(MODES))
def test_a_copy_gives_the_exact_bytes_through_read_mmap_and_o_direct(emu, cache_dir, mode):
    files = {"d/odd.bin": payload(12 * MiB + 4097, 1), "d/small.bin": payload(100_000, 2)}
    emu.seed_many(BUCKET, files)
    flags = ("--cache-dir", str(cache_dir), *MODES[mode])
    with guard.mount(emu, BUCKET, *flags) as mount:
        for name, data in files.items():  # epoch 1: from the bucket, copied as it is read
            assert read(mount.path / name) == data
        for name, data in files.items():
            wait_for_entry(cache_dir, name, len(data))
    with guard.mount(emu, BUCKET, *flags) as mount:  # a remount: the copies survive
        drop_kernel_cache()
        emu.reset_rpc_counts()
        for name, data in files.items():
            assert read(mount.path / name) == data, name
            assert read_mmap(mount.path / name) == data, name
            assert read_direct(mount.path / name, len(data)) == data, name
        assert emu.rpc_counts.get("BidiReadObject", 0) == 0
        stats = local_stats(mount)
    assert stats["hits"] == 3 * len(files) and stats["misses"] == 0
    if mode == "passthrough":
        # read() and mmap: the kernel read the files itself; O_DIRECT opens are served by the mount
        assert stats["passthrough_opens"] == 2 * len(files), stats
        assert stats["served_bytes"] == sum(len(d) for d in files.values()), stats
    else:
        assert stats["passthrough_opens"] == 0 and stats["daemon_opens"] == 3 * len(files), stats


def test_passthrough_refused_by_the_kernel_leaves_the_mount_serving_the_same_bytes(emu, tmp_path):
    # A cache directory on overlayfs (a container's root file system) is
    # stacked already: the kernel refuses its files as backing files (ELOOP).
    layers = {name: tmp_path / name for name in ("lower", "upper", "work", "merged")}
    for path in layers.values():
        path.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={layers['lower']},upperdir={layers['upper']},workdir={layers['work']}",
                    str(layers["merged"])], check=True)
    try:
        cache_dir = layers["merged"] / "cache"
        data = payload(9 * MiB + 123, 3)
        emu.seed(BUCKET, "model.bin", data)
        with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir)) as mount:
            assert read(mount.path / "model.bin") == data
            wait_for_entry(cache_dir, "model.bin", len(data))
            drop_kernel_cache()
            assert read(mount.path / "model.bin") == data
            assert read_mmap(mount.path / "model.bin") == data
            stats = local_stats(mount)
        assert "the kernel refuses backing files" in mount.log()
        assert stats["passthrough_opens"] == 0 and stats["hits"] == 2 and stats["served_bytes"] >= 2 * len(data)
    finally:
        subprocess.run(["umount", "-l", str(layers["merged"])], check=False)


def test_a_new_generation_from_another_writer_is_never_served_from_the_old_copy(emu, cache_dir):
    old, new = payload(3 * MiB, 4), payload(5 * MiB + 1, 5)
    emu.seed(BUCKET, "shard.bin", old)
    with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir), "--metadata-ttl", "0") as mount:
        assert read(mount.path / "shard.bin") == old
        first = wait_for_entry(cache_dir, "shard.bin", len(old))
        emu.seed(BUCKET, "shard.bin", new)  # another client replaces it
        assert read(mount.path / "shard.bin") == new
        assert read_mmap(mount.path / "shard.bin") == new
        second = wait_for_entry(cache_dir, "shard.bin", len(new))
        assert second["generation"] != first["generation"]
        drop_kernel_cache()
        assert read(mount.path / "shard.bin") == new


def test_this_mounts_changes_never_leave_an_old_copy_served(emu, cache_dir):
    data = payload(4 * MiB, 6)
    names = ("append.bin", "rewrite.bin", "truncate.bin", "rename.bin")
    emu.seed_many(BUCKET, {name: data for name in names})
    with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir)) as mount:
        for name in names:
            assert read(mount.path / name) == data
            wait_for_entry(cache_dir, name, len(data))
            assert read(mount.path / name) == data  # a hit, held open by nobody now
        with open(mount.path / "append.bin", "ab") as file:
            file.write(b"tail")
        with open(mount.path / "rewrite.bin", "wb") as file:
            file.write(b"rewritten")
        os.truncate(mount.path / "truncate.bin", 1000)
        os.rename(mount.path / "rename.bin", mount.path / "renamed.bin")
        with open(mount.path / "rename.bin", "wb") as file:
            file.write(b"a new file under the old name")
        drop_kernel_cache()
        assert read(mount.path / "append.bin") == data + b"tail"
        assert read(mount.path / "rewrite.bin") == b"rewritten"
        assert read(mount.path / "truncate.bin") == data[:1000]
        assert read(mount.path / "renamed.bin") == data
        assert read(mount.path / "rename.bin") == b"a new file under the old name"
        assert read_mmap(mount.path / "append.bin") == data + b"tail"


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "deleted"])
def test_a_cache_file_damaged_underneath_is_dropped_and_read_from_the_bucket(emu, cache_dir, damage):
    data = payload(6 * MiB + 5, 7)
    emu.seed(BUCKET, "data.bin", data)
    with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir)) as mount:
        assert read(mount.path / "data.bin") == data
        wait_for_entry(cache_dir, "data.bin", len(data))
        victim = entry_file(cache_dir, "data.bin")
        if damage == "truncated":
            os.truncate(victim, len(data) // 2)
        elif damage == "overwritten":
            with open(victim, "r+b") as file:
                file.write(b"\0" * 4096)
        else:
            victim.unlink()
        drop_kernel_cache()
        assert read(mount.path / "data.bin") == data
        assert read_mmap(mount.path / "data.bin") == data
        stats = local_stats(mount)
    assert stats["damaged"] == 1, stats
    assert "local cache: dropped data.bin" in mount.log()


def test_damage_found_at_start_by_the_checksum_is_never_served(emu, cache_dir):
    data = payload(3 * MiB, 8)
    emu.seed(BUCKET, "data.bin", data)
    flags = ("--cache-dir", str(cache_dir))
    with guard.mount(emu, BUCKET, *flags) as mount:
        assert read(mount.path / "data.bin") == data
        wait_for_entry(cache_dir, "data.bin", len(data))
    victim = entry_file(cache_dir, "data.bin")
    stat = victim.stat()
    with open(victim, "r+b") as file:  # bit rot: same size, times put back
        file.seek(MiB)
        file.write(b"\xff" * 16)
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with guard.mount(emu, BUCKET, *flags) as mount:
        assert read(mount.path / "data.bin") == data
        assert read_mmap(mount.path / "data.bin") == data


def test_enospc_on_the_cache_file_system_stops_filling_and_reads_go_on(emu, tmp_path):
    cache = tmp_path / "small"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(cache)], check=True)
    try:
        files = {"a.bin": payload(5 * MiB, 9), "b.bin": payload(6 * MiB, 10), "c.bin": payload(12 * MiB, 11)}
        emu.seed_many(BUCKET, files)
        with guard.mount(emu, BUCKET, "--cache-dir", str(cache / "c"), "--cache-dir-size", "1GiB") as mount:
            for _ in range(2):
                for name, data in files.items():
                    assert read(mount.path / name) == data, name
                    assert read_mmap(mount.path / name) == data, name
            stats = local_stats(mount)
        assert stats["fill_faults"] >= 1, stats
        assert "no object is copied there for" in mount.log()
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_a_daemon_killed_mid_fill_leaves_nothing_served_after_a_restart(emu, cache_dir):
    data = payload(48 * MiB, 12)
    emu.seed(BUCKET, "big.bin", data)
    emu.set_stream_bandwidth(16_000_000)  # the copy takes about 3 s
    flags = ("--cache-dir", str(cache_dir))
    with guard.mount(emu, BUCKET, *flags) as mount:
        reader = threading.Thread(target=lambda: _read_quietly(mount.path / "big.bin"), daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while not any((cache_dir / "partial").glob("*")) or not (cache_dir / "partial").exists():
            assert time.monotonic() < deadline, "no fill started"
            time.sleep(0.01)
        while next((cache_dir / "partial").iterdir()).stat().st_blocks == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(mount.pid, signal.SIGKILL)
        for pid in mount.worker_pids():
            os.kill(pid, signal.SIGKILL)
        mount.process.wait(timeout=30)
        reader.join(timeout=30)
    assert "big.bin" not in entries(cache_dir)
    emu.set_stream_bandwidth(None)
    with guard.mount(emu, BUCKET, *flags) as mount:
        assert not list((cache_dir / "partial").iterdir())
        assert read(mount.path / "big.bin") == data
        assert read_mmap(mount.path / "big.bin") == data


def _read_quietly(path: pathlib.Path) -> None:
    try:
        read(path)
    except OSError:
        pass  # the daemon was killed under it


def test_eviction_keeps_the_directory_within_its_size(emu, cache_dir):
    files = {f"shard-{i}.bin": payload(4 * MiB, 20 + i) for i in range(5)}
    emu.seed_many(BUCKET, files)
    with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir), "--cache-dir-size", "10MiB") as mount:
        for name, data in files.items():
            assert read(mount.path / name) == data
            wait_for_entry(cache_dir, name, len(data))
            held = sum(path.stat().st_size for path in (cache_dir / "objects").iterdir())
            assert held <= 10 * MiB, held
        assert sorted(entries(cache_dir)) == ["shard-3.bin", "shard-4.bin"]
        for name, data in files.items():
            assert read(mount.path / name) == data
        stats = local_stats(mount)
    assert stats["evictions"] >= 3, stats


def test_the_directory_is_private_and_one_mount_holds_it(emu, cache_dir):
    data = payload(MiB, 30)
    emu.seed(BUCKET, "x.bin", data)
    with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir)) as mount:
        assert read(mount.path / "x.bin") == data
        wait_for_entry(cache_dir, "x.bin", len(data))
        assert cache_dir.stat().st_mode & 0o777 == 0o700
        for path in (cache_dir / "objects").iterdir():
            assert path.stat().st_mode & 0o777 == 0o600
        elsewhere = mount.path.parent / "second"
        elsewhere.mkdir()
        second = subprocess.run(
            rapidmount_command("--foreground", "--anonymous", "--endpoint", emu.endpoint, "--cache-dir",
                               str(cache_dir), BUCKET, str(elsewhere)),
            capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        assert second.returncode != 0
        assert b"in use by another rapidmount" in second.stderr, second.stderr
        assert mount.process.poll() is None


def test_allow_other_checks_the_modes_of_a_cached_file_as_of_any(emu, tmp_path):
    from tests.mount.test_permissions import NOBODY, as_user

    if os.geteuid() != 0:
        pytest.fail("this test switches to another uid: it needs root")
    data = payload(2 * MiB, 40)
    emu.seed(BUCKET, "private.bin", data)
    parent = pathlib.Path(tempfile.mkdtemp(prefix="rapidmount-perm-"))
    os.chmod(parent, 0o755)
    (parent / "mnt").mkdir()
    cache_dir = tmp_path / "cache"
    read_it = 'cat "$1" > /dev/null'
    try:
        with guard.mount(emu, BUCKET, "--cache-dir", str(cache_dir), "--file-mode", "0640", "-o", "allow_other",
                         mountpoint=parent / "mnt") as mount:
            assert read(mount.path / "private.bin") == data
            wait_for_entry(cache_dir, "private.bin", len(data))
            drop_kernel_cache()
            assert as_user(NOBODY, NOBODY, read_it, mount.path / "private.bin") == errno.EACCES
            assert as_user(NOBODY, NOBODY, read_it, entry_file(cache_dir, "private.bin")) == errno.EACCES
            assert read(mount.path / "private.bin") == data  # the owner's open: a hit
            stats = local_stats(mount)
        assert stats["hits"] == 1 and stats["passthrough_opens"] == 1, stats
    finally:
        subprocess.run(["rm", "-rf", str(parent)], check=False)
