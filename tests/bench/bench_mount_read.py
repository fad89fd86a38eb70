"""Benchmark: reads through the mount against Google's official client.

Same emulator process, same objects, one run; prints MB/s, latencies and
mount/official ratios. Scenarios (each at emulator latency 0 and 2 ms):

- sequential 1 GiB: ``dd bs=1M`` through a fresh mount with the page cache
  dropped, against ``AsyncMultiRangeDownloader`` reading the whole object;
- random 4 KiB reads: p50/p99 through a fresh mount, against one MRD;
- ``ls -l`` of a 10,000-object directory, cold and warm, against a raw
  ``ListObjects`` walk;
- the daemon's CPU seconds per GiB read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    MiB, Sink, drop_caches, emulator_process, median, mount_process, official_client, percentile,
    print_table, save_results, timed_dd_read, timed_preads)

BUCKET = "bench-bucket"
BIG = "seq/big.bin"
WARMUP = "seq/warmup.bin"
WARMUP_SIZE = 512 * MiB
LISTED_DIR = "listing/"


def seed(data_dir: str, size: int, listed: int) -> None:
    from rapidmount.emulator import Emulator

    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        emulator.seed(BUCKET, BIG, os.urandom(size))
        emulator.seed(BUCKET, WARMUP, os.urandom(WARMUP_SIZE))
        emulator.seed_many(BUCKET, {f"{LISTED_DIR}obj-{i:05d}": b"x" * 100 for i in range(listed)})


async def official_sequential(endpoint: str, size: int) -> float:
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    client = official_client(endpoint)
    started = time.perf_counter()
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, BIG)
    sink = Sink()
    await mrd.download_ranges([(0, 0, sink)])
    elapsed = time.perf_counter() - started
    await mrd.close()
    assert sink.count == size, sink.count
    return size / elapsed / 1e6


async def official_random(endpoint: str, size: int, count: int, seed_: int) -> list[float]:
    import io

    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    client = official_client(endpoint)
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, BIG)
    rng = random.Random(seed_)
    latencies = []
    for _ in range(count):
        offset = rng.randrange(0, size // 4096) * 4096
        buffer = io.BytesIO()
        started = time.perf_counter()
        await mrd.download_ranges([(offset, 4096, buffer)])
        latencies.append(time.perf_counter() - started)
    await mrd.close()
    return latencies


def warm_up(mount) -> None:
    """Read another object once, so the daemon's heap is warm (a long-running daemon)."""
    subprocess.run(["dd", f"if={mount.path / WARMUP}", "of=/dev/null", "bs=1M"], check=True,
                   stderr=subprocess.DEVNULL)


def mount_sequential(mount, size: int) -> tuple[float, float]:
    return timed_dd_read(mount, BIG, size)


def mount_random(endpoint: str, size: int, count: int, seed_: int, extra: list[str]) -> list[float]:
    with mount_process(endpoint, BUCKET, *extra) as mount:
        drop_caches()
        fd = os.open(mount.path / BIG, os.O_RDONLY)
        try:
            os.pread(fd, 4096, 0)  # open the stream before timing, as the official client does
            rng = random.Random(seed_)
            latencies = timed_preads(fd, [rng.randrange(0, size // 4096) * 4096 for _ in range(count)])
        finally:
            os.close(fd)
    return latencies


async def official_list_walk(endpoint: str) -> float:
    from google.cloud._storage_v2.types import storage as types

    client = official_client(endpoint)
    started = time.perf_counter()
    token, count = "", 0
    while True:
        response = await client.grpc_client.list_objects(request=types.ListObjectsRequest(
            parent=f"projects/_/buckets/{BUCKET}", prefix=LISTED_DIR, delimiter="/",
            page_size=1000, page_token=token))
        count += len(response.objects)
        token = response.next_page_token
        if not token:
            break
    return time.perf_counter() - started


def mount_ls(endpoint: str, extra: list[str]) -> tuple[float, float]:
    with mount_process(endpoint, BUCKET, *extra) as mount:
        target = str(mount.path / LISTED_DIR.rstrip("/"))
        times = []
        for _ in range(2):
            started = time.perf_counter()
            subprocess.run(["ls", "-l", target], check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - started)
    return times[0], times[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--random-reads", type=int, default=2000)
    parser.add_argument("--listed", type=int, default=10_000)
    parser.add_argument("--latencies", default="0,2", help="emulator latencies in ms, comma-separated")
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags")
    args = parser.parse_args()
    size = args.size_mib * MiB
    extra = args.mount_args.split()
    results: dict = {"size_mib": args.size_mib, "rounds": args.rounds, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-data-") as data_dir:
        seed(data_dir, size, args.listed)
        for latency in [float(x) for x in args.latencies.split(",")]:
            run: dict = {}
            with emulator_process("--latency", str(latency), data_dir=data_dir) as (endpoint, _):
                seq_mount, seq_official, cpu = [], [], []
                with mount_process(endpoint, BUCKET, *extra) as mount:
                    warm_up(mount)
                    for _ in range(args.rounds):
                        drop_caches()
                        seq_official.append(asyncio.run(official_sequential(endpoint, size)))
                        mbps, cpu_per_gib = mount_sequential(mount, size)
                        seq_mount.append(mbps)
                        cpu.append(cpu_per_gib)
                run["sequential_mb_s"] = {"mount": seq_mount, "official": seq_official,
                                          "ratio": median(seq_mount) / median(seq_official),
                                          "daemon_cpu_s_per_gib": median(cpu)}
                rand_mount = mount_random(endpoint, size, args.random_reads, 5, extra)
                rand_official = asyncio.run(official_random(endpoint, size, args.random_reads, 5))
                run["random_4k_ms"] = {
                    "mount_p50": percentile(rand_mount, 0.5) * 1e3, "mount_p99": percentile(rand_mount, 0.99) * 1e3,
                    "official_p50": percentile(rand_official, 0.5) * 1e3,
                    "official_p99": percentile(rand_official, 0.99) * 1e3}
                cold, warm = mount_ls(endpoint, extra)
                walk = asyncio.run(official_list_walk(endpoint))
                run["ls_l_s"] = {"mount_cold": cold, "mount_warm": warm, "list_objects_walk": walk}
            results["runs"][f"{latency:g}ms"] = run
    rows = []
    for name, run in results["runs"].items():
        seq = run["sequential_mb_s"]
        rows.append([name, "sequential 1 GiB MB/s", f"{median(seq['mount']):.0f}", f"{median(seq['official']):.0f}",
                     f"{seq['ratio']:.2f}"])
        rnd = run["random_4k_ms"]
        rows.append([name, "random 4 KiB p50 ms", f"{rnd['mount_p50']:.3f}", f"{rnd['official_p50']:.3f}",
                     f"{rnd['mount_p50'] / rnd['official_p50']:.2f}"])
        rows.append([name, "random 4 KiB p99 ms", f"{rnd['mount_p99']:.3f}", f"{rnd['official_p99']:.3f}",
                     f"{rnd['mount_p99'] / rnd['official_p99']:.2f}"])
        ls = run["ls_l_s"]
        rows.append([name, f"ls -l {args.listed} objects s (cold)", f"{ls['mount_cold']:.3f}",
                     f"{ls['list_objects_walk']:.3f}", f"{ls['mount_cold'] / ls['list_objects_walk']:.2f}"])
        rows.append([name, f"ls -l {args.listed} objects s (warm)", f"{ls['mount_warm']:.3f}",
                     f"{ls['list_objects_walk']:.3f}", f"{ls['mount_warm'] / ls['list_objects_walk']:.2f}"])
        rows.append([name, "daemon CPU s per GiB", f"{seq['daemon_cpu_s_per_gib']:.2f}", "", ""])
    print_table("Reads: mount vs official client (same emulator, same run)",
                ["latency", "scenario", "mount", "official", "mount/official"], rows)
    print(f"\nraw results: {save_results('mount-read', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
