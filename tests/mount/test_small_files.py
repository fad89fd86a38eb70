"""Small files through a real mount: whole-object reads and directory-scan prefetch."""

from __future__ import annotations

import os
import random
import re
import signal

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard

BUCKET = "small-files"
guard = HangGuard(120)
hang_guard = guard.autouse_fixture()


@pytest.fixture
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


def seed_directory(emu, prefix: str, count: int, size: int) -> dict[str, bytes]:
    rng = random.Random(count * 31 + size)
    files = {f"{prefix}sample-{i:05d}.bin": rng.randbytes(size) for i in range(count)}
    emu.seed_many(BUCKET, files)
    return files


def read_file(path) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def drop_kernel_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as knob:
        knob.write("3\n")


def stop_and_read_stats(mount) -> dict[str, int]:
    """SIGTERM the daemon, wait, and parse the statistics it logs on the way out."""
    mount.process.send_signal(signal.SIGTERM)
    mount.process.wait(timeout=30)
    match = re.search(r"statistics: FSStats\(([^)]*)\)", mount.log())
    assert match, mount.log()[-2000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def test_a_small_file_is_read_whole_over_one_stream(emu):
    small = os.urandom(100_000)
    two_blocks = os.urandom(3 * 1024 * 1024 + 17)
    emu.seed(BUCKET, "a/small.bin", small)
    emu.seed(BUCKET, "a/two-blocks.bin", two_blocks)
    with guard.mount(emu, BUCKET, "--small-file-size", "4MiB", "--prefetch-files", "0") as mount:
        os.listdir(mount.path / "a")
        emu.reset_rpc_counts()
        fd = os.open(mount.path / "a/two-blocks.bin", os.O_RDONLY)
        try:
            # Small reads at scattered offsets: all served by the one whole-object fetch.
            for offset in (2 * 1024 * 1024 + 5, 0, 3 * 1024 * 1024, 4096 * 7):
                assert os.pread(fd, 4096, offset) == two_blocks[offset:offset + 4096]
        finally:
            os.close(fd)
        assert read_file(mount.path / "a/small.bin") == small
        assert emu.rpc_counts.get("BidiReadObject", 0) == 2  # one stream per file
        assert emu.rpc_counts.get("GetObject", 0) == 0
        stats = stop_and_read_stats(mount)
    assert stats["whole_file_fetches"] == 2


def test_reading_in_listing_order_prefetches_the_next_files(emu):
    files = seed_directory(emu, "train/", 300, 8192)
    with guard.mount(emu, BUCKET, "--prefetch-files", "16") as mount:
        names = sorted(os.listdir(mount.path / "train"))
        emu.reset_rpc_counts()
        for name in names:
            assert read_file(mount.path / "train" / name) == files["train/" + name]
        streams = emu.rpc_counts.get("BidiReadObject", 0)
        stats = stop_and_read_stats(mount)
    assert streams == len(files)  # each file fetched once: prefetched, never again by its handle
    assert stats["scan_prefetches"] >= 280
    assert stats["scan_hits"] >= 280


def test_opening_by_path_without_readdir_still_learns_the_order(emu):
    files = seed_directory(emu, "shard/", 200, 4096)
    with guard.mount(emu, BUCKET, "--prefetch-files", "8") as mount:
        for name in sorted(files):
            assert read_file(mount.path / name) == files[name]
        stats = stop_and_read_stats(mount)
    assert stats["scan_prefetches"] >= 150 and stats["scan_hits"] >= 150


def test_random_opens_prefetch_little(emu):
    files = seed_directory(emu, "shuffled/", 300, 8192)
    order = sorted(files)
    random.Random(5).shuffle(order)
    with guard.mount(emu, BUCKET, "--prefetch-files", "16") as mount:
        os.listdir(mount.path / "shuffled")
        for name in order:
            assert read_file(mount.path / name) == files[name]
        stats = stop_and_read_stats(mount)
    assert stats["scan_prefetches"] <= 30  # a chance run of near neighbours at most


def test_a_second_pass_in_the_same_shuffled_order_is_prefetched(emu):
    files = seed_directory(emu, "epoch/", 300, 64 * 1024)
    order = sorted(files)
    random.Random(9).shuffle(order)
    # 8 MiB of cache cannot hold 19 MiB of samples: the second pass must fetch again.
    with guard.mount(emu, BUCKET, "--prefetch-files", "16", "--cache-size", "8MiB") as mount:
        for name in order:
            assert read_file(mount.path / name) == files[name]
        drop_kernel_cache()
        for name in order:
            assert read_file(mount.path / name) == files[name]
        stats = stop_and_read_stats(mount)
    assert stats["scan_hits"] >= 250


def test_prefetched_data_is_never_served_for_a_newer_generation(emu):
    files = seed_directory(emu, "live/", 100, 4096)
    with guard.mount(emu, BUCKET, "--prefetch-files", "32", "--metadata-ttl", "0") as mount:
        names = sorted(os.listdir(mount.path / "live"))
        for name in names[:10]:
            read_file(mount.path / "live" / name)
        # Prefetch has run ahead; now another client replaces a file ahead of the reader.
        replaced = "live/" + names[20]
        emu.seed(BUCKET, replaced, b"new contents")
        for name in names[10:]:
            expected = b"new contents" if "live/" + name == replaced else files["live/" + name]
            assert read_file(mount.path / "live" / name) == expected


def test_the_scan_hit_rate_is_exported_as_metrics(emu):
    from tests.mount.test_metrics import free_port, scrape, value

    files = seed_directory(emu, "metrics/", 120, 4096)
    port = free_port()
    with guard.mount(emu, BUCKET, "--prefetch-files", "8", "--prometheus-port", str(port)) as mount:
        for name in sorted(os.listdir(mount.path / "metrics")):
            assert read_file(mount.path / "metrics" / name) == files["metrics/" + name]
        samples = scrape(port)
    prefetched = value(samples, "rapidmount_scan_prefetched_files_total")
    hits = value(samples, "rapidmount_scan_prefetch_hits_total")
    assert prefetched >= 100 and hits >= 100 and hits <= prefetched
    assert value(samples, "rapidmount_whole_file_fetches_total") >= 1


@pytest.fixture
def regional():
    with Emulator(buckets={"small-regional": "flat"}) as emulator:
        yield emulator


def test_compose_prefetch_reads_batches_of_files_and_leaves_nothing_behind(regional):
    rng = random.Random(4)
    files = {f"imgs/{i:04d}.jpg": rng.randbytes(rng.randrange(100, 20_000)) for i in range(400)}
    regional.seed_many("small-regional", files)
    with guard.mount(regional, "small-regional", "--compose-prefetch", "--prefetch-files", "128") as mount:
        names = sorted(os.listdir(mount.path / "imgs"))
        regional.reset_rpc_counts()
        for name in names:
            assert read_file(mount.path / "imgs" / name) == files["imgs/" + name]
        counts = dict(regional.rpc_counts)
        stats = stop_and_read_stats(mount)
    assert counts.get("ComposeObject", 0) >= 5
    assert counts.get("DeleteObject", 0) == counts["ComposeObject"]
    # Far fewer reads than files: most arrived inside composites.
    assert counts.get("ReadObject", 0) < len(files) // 2
    assert stats["scan_hits"] >= 300
    leftovers = regional.store.list_objects("small-regional", prefix=".rapidmount-compose/").objects
    assert not leftovers


def test_compose_prefetch_is_ignored_on_zonal_buckets(emu):
    files = seed_directory(emu, "z/", 100, 2048)
    with guard.mount(emu, BUCKET, "--compose-prefetch", "--prefetch-files", "64") as mount:
        for name in sorted(os.listdir(mount.path / "z")):
            assert read_file(mount.path / "z" / name) == files["z/" + name]
        assert "ignored: zonal buckets do not support ComposeObject" in mount.log()
        assert emu.rpc_counts.get("ComposeObject", 0) == 0


def test_prefetch_under_faults_returns_exact_bytes(emu):
    files = seed_directory(emu, "faulty/", 200, 6000)
    with guard.mount(emu, BUCKET, "--prefetch-files", "16") as mount:
        names = sorted(os.listdir(mount.path / "faulty"))
        for spec in ("redirect-read:count=5", "broken-read:after=3000,count=5", "corrupt-read:count=5",
                     "unavailable:method=BidiReadObject,rate=0.05,count=10"):
            emu.add_fault(spec)
        for name in names:
            assert read_file(mount.path / "faulty" / name) == files["faulty/" + name]
        stats = stop_and_read_stats(mount)
    assert stats["scan_prefetches"] >= 150
