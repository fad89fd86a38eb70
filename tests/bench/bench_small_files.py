"""Benchmark: many small files read by 16 threads, mount against the official client.

Same emulator data, same run, at emulator latency 0 and 2 ms:

1. rapidmount with its small-file features (whole-object reads at open,
   directory-scan prefetch);
2. rapidmount with them off (``--small-file-size 0 --prefetch-files 0``);
3. Google's official client opening one stream per object
   (``AsyncMultiRangeDownloader``), 16 at a time.

The mount's threads take files from one shared queue in listing order, as a
loader with several workers reading a directory does. The directory is
listed once before timing on each fresh mount (the official client is given
the names); the emulator's files are in memory for every scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    emulator_process, median, mount_process, official_client, print_table, save_results)

BUCKET = "bench-small"
PREFIX = "train/"


def seed(data_dir: str, count: int, size: int) -> list[str]:
    from rapidmount.emulator import Emulator

    names = [f"{PREFIX}sample-{i:06d}.bin" for i in range(count)]
    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        for start in range(0, count, 1000):
            emulator.seed_many(BUCKET, {name: os.urandom(size) for name in names[start:start + 1000]})
    return names


def warm_files(directory: str) -> None:
    """Read the emulator's files once, so every scenario finds them in memory."""
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as file:
                while file.read(1 << 20):
                    pass


def mount_read(endpoint: str, names: list[str], threads: int, size: int, *flags: str) -> tuple[float, float]:
    """Files per second through a fresh mount, and the daemon's CPU seconds."""
    # A fresh mount has nothing in the kernel's page cache: no cache drop,
    # so the emulator serves every run from memory alike.
    with mount_process(endpoint, BUCKET, *flags) as mount:
        os.listdir(mount.path / PREFIX.rstrip("/"))
        queue = iter(names)
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while True:
                    with lock:
                        name = next(queue, None)
                    if name is None:
                        return
                    with open(mount.path / name, "rb") as file:
                        if len(file.read()) != size:
                            raise RuntimeError(f"short read of {name}")
            except BaseException as err:  # reported after the run
                errors.append(err)

        cpu_before = mount.cpu_seconds()
        started = time.perf_counter()
        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - started
        cpu = mount.cpu_seconds() - cpu_before
        if errors:
            raise errors[0]
    return len(names) / elapsed, cpu


async def official_read(endpoint: str, names: list[str], concurrency: int, size: int) -> float:
    import io

    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    client = official_client(endpoint)
    queue = iter(names)

    async def worker() -> None:
        for name in queue:
            mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
            buffer = io.BytesIO()
            await mrd.download_ranges([(0, 0, buffer)])
            await mrd.close()
            if buffer.getbuffer().nbytes != size:
                raise RuntimeError(f"short read of {name}")

    # Warm the channel up once, as a long-running client would be.
    await worker_once(client, names[0])
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(names) / (time.perf_counter() - started)


async def worker_once(client, name: str) -> None:
    import io

    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
    await mrd.download_ranges([(0, 0, io.BytesIO())])
    await mrd.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latencies", default="0,2", help="emulator latencies in ms, comma separated")
    args = parser.parse_args()
    size = args.size_kib * 1024
    results: dict = {"files": args.files, "size": size, "threads": args.threads, "runs": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-small-") as data_dir:
        print(f"seeding {args.files} objects of {args.size_kib} KiB ...", flush=True)
        names = seed(data_dir, args.files, size)
        warm_files(data_dir)
        for latency in [float(x) for x in args.latencies.split(",")]:
            figures: dict[str, list[float]] = {"features": [], "off": [], "official": [], "cpu_features": [],
                                                "cpu_off": []}
            with emulator_process("--latency", str(latency), data_dir=data_dir) as (endpoint, _):
                for _ in range(args.rounds):
                    rate, cpu = mount_read(endpoint, names, args.threads, size)
                    figures["features"].append(rate)
                    figures["cpu_features"].append(cpu)
                    rate, cpu = mount_read(endpoint, names, args.threads, size,
                                           "--small-file-size", "0", "--prefetch-files", "0")
                    figures["off"].append(rate)
                    figures["cpu_off"].append(cpu)
                    figures["official"].append(asyncio.run(official_read(endpoint, names, args.threads, size)))
            results["runs"][str(latency)] = figures
            on, off, official = (median(figures[k]) for k in ("features", "off", "official"))
            rows.append([f"{latency:g} ms", f"{on:.0f}", f"{off:.0f}", f"{official:.0f}",
                         f"{on / official:.2f}x", f"{off / official:.2f}x",
                         f"{median(figures['cpu_features']) * 1000 / args.files:.2f}"])
    print_table(f"{args.files} files of {args.size_kib} KiB, {args.threads} readers (files/s, median of "
                f"{args.rounds})",
                ["latency", "mount", "mount, features off", "official", "mount/official",
                 "off/official", "daemon CPU ms/file"], rows)
    print(f"\nresults: {save_results('small-files', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
