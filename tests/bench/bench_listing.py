"""Benchmark: listing a large tree, --prefetch-metadata against a sequential walk.

Same emulator process, same objects, one run. The tree is DIRS directories
of FILES objects each (default 100 x 1000 = 100,000), like an image data set.
At each emulator latency it measures:

- ``official walk``: every object below the root with Google's official
  client's gRPC ``ListObjects``, one page of 1000 after the other (what a
  sequential lister does);
- ``prefetch listing``: the parallel listing inside the mount, as the
  daemon logs it (from its first ListObjects to the last page);
- ``mount start -> find done``: from launching ``rapidmount --prefetch-metadata``
  until ``find MNT -type f | wc -l`` returned, with find started once the
  prefetch logged it was done (so this includes process start, mounting,
  the listing, filling the cache and the find);
- ``find after prefetch``: the find alone on that mount;
- ``find at once``: a fresh ``--prefetch-metadata`` mount with find started
  as soon as it is mounted, while the prefetch runs (find lists what the
  prefetch has not completed yet on demand); from launch to find done;
- ``find, no prefetch``: ``find`` on a fresh mount without the flag (one
  readdir after the other, as find walks).

The ratio printed is official walk / prefetch listing, and official walk /
(mount start -> find done). The emulator's CPU seconds per 1000-object page
are printed too: on a 2-core machine the emulator (one Python process)
serves pages no faster than its CPU allows, whatever the parallelism.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    emulator_process, median, mount_process, official_client, print_table, save_results)

BUCKET = "listing-bench"
DONE = re.compile(r"metadata prefetch of \S+ done in ([\d.]+) s: (\d+) objects listed in ([\d.]+) s "
                  r"\(\d+ objects/s; (\d+) ranges, (\d+) steals, (\d+) pages\)")


def seed(data_dir: str, dirs: int, files: int) -> None:
    from rapidmount.emulator import Emulator

    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        for d in range(dirs):
            emulator.seed_many(BUCKET, {f"train/class_{d:04d}/img_{f:06d}.jpg": b"j" for f in range(files)})


async def official_walk(endpoint: str) -> tuple[float, int]:
    from google.cloud._storage_v2.types import storage as types

    client = official_client(endpoint)
    started = time.perf_counter()
    token, count = "", 0
    while True:
        response = await client.grpc_client.list_objects(request=types.ListObjectsRequest(
            parent=f"projects/_/buckets/{BUCKET}", page_size=1000, page_token=token))
        count += len(response.objects)
        token = response.next_page_token
        if not token:
            break
    return time.perf_counter() - started, count


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_files(path) -> tuple[float, int]:
    started = time.perf_counter()
    result = subprocess.run(f"find {path} -type f | wc -l", shell=True, check=True, capture_output=True,
                            text=True)
    return time.perf_counter() - started, int(result.stdout)


def read_log(mount) -> str:
    log = mount.path.parent / "daemon.log"
    return log.read_text(errors="replace") if log.exists() else ""


def prefetched_mount(endpoint: str, workers: int, expected: int) -> dict:
    launched = time.perf_counter()
    with mount_process(endpoint, BUCKET, "--prefetch-metadata", "--prefetch-metadata-workers",
                       str(workers)) as mount:
        ready = time.perf_counter()
        deadline = time.monotonic() + 600
        while (match := DONE.search(read_log(mount))) is None:
            if "metadata prefetch" in read_log(mount) and "stopped" in read_log(mount):
                raise RuntimeError(f"the prefetch stopped:\n{read_log(mount)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the prefetch did not finish:\n{read_log(mount)}")
            time.sleep(0.01)
        prefetched = time.perf_counter()
        find_s, found = count_files(mount.path)
        finished = time.perf_counter()
        if found != expected:
            raise RuntimeError(f"find saw {found} files, expected {expected}")
        return {"mount_ready_s": ready - launched, "prefetch_done_s": prefetched - launched,
                "prefetch_total_s": float(match[1]), "prefetch_listing_s": float(match[3]),
                "objects": int(match[2]), "ranges": int(match[4]), "steals": int(match[5]),
                "pages": int(match[6]), "find_after_prefetch_s": find_s,
                "start_to_find_done_s": finished - launched, "daemon_cpu_s": mount.cpu_seconds()}


def find_at_once(endpoint: str, workers: int, expected: int) -> float:
    launched = time.perf_counter()
    with mount_process(endpoint, BUCKET, "--prefetch-metadata", "--prefetch-metadata-workers",
                       str(workers)) as mount:
        _, found = count_files(mount.path)
        finished = time.perf_counter()
    if found != expected:
        raise RuntimeError(f"find saw {found} files, expected {expected}")
    return finished - launched


def plain_mount_find(endpoint: str, expected: int) -> float:
    with mount_process(endpoint, BUCKET) as mount:
        find_s, found = count_files(mount.path)
    if found != expected:
        raise RuntimeError(f"find saw {found} files, expected {expected}")
    return find_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000, help="objects per directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="--prefetch-metadata-workers")
    parser.add_argument("--latencies", default="0,2", help="emulator latencies in ms, comma-separated")
    parser.add_argument("--quick", action="store_true", help="20 x 250 objects, one round")
    parser.add_argument("--skip-plain-find", action="store_true", help="skip find on a mount without prefetch")
    args = parser.parse_args()
    if args.quick:
        args.dirs, args.files, args.rounds = 20, 250, 1
    expected = args.dirs * args.files
    results: dict = {"dirs": args.dirs, "files": args.files, "workers": args.workers, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-data-") as data_dir:
        started = time.perf_counter()
        seed(data_dir, args.dirs, args.files)
        print(f"seeded {expected} objects in {time.perf_counter() - started:.1f} s", flush=True)
        for latency in [float(x) for x in args.latencies.split(",")]:
            with emulator_process("--latency", str(latency), data_dir=data_dir) as (endpoint, emulator):
                walks, mounts, walk_cpu, prefetch_cpu = [], [], [], []
                pages = -(-expected // 1000)
                for _ in range(args.rounds):
                    cpu_before = process_cpu_seconds(emulator.pid)
                    walk_s, count = asyncio.run(official_walk(endpoint))
                    walk_cpu.append((process_cpu_seconds(emulator.pid) - cpu_before) / pages)
                    if count != expected:
                        raise RuntimeError(f"the walk saw {count} objects, expected {expected}")
                    walks.append(walk_s)
                    cpu_before = process_cpu_seconds(emulator.pid)
                    mount = prefetched_mount(endpoint, args.workers, expected)
                    prefetch_cpu.append((process_cpu_seconds(emulator.pid) - cpu_before) / mount["pages"])
                    mounts.append(mount)
                run = {"official_walk_s": walks, "mounts": mounts,
                       "emulator_cpu_s_per_page_walk": walk_cpu, "emulator_cpu_s_per_page_prefetch": prefetch_cpu}
                run["find_at_once_s"] = find_at_once(endpoint, args.workers, expected)
                if not args.skip_plain_find:
                    run["plain_find_s"] = plain_mount_find(endpoint, expected)
            results["runs"][f"{latency:g}ms"] = run
            print(f"latency {latency:g} ms: done", flush=True)
    rows = []
    for name, run in results["runs"].items():
        walk = median(run["official_walk_s"])
        listing = median([m["prefetch_listing_s"] for m in run["mounts"]])
        start_to_find = median([m["start_to_find_done_s"] for m in run["mounts"]])
        rows.append([name, "official walk (sequential ListObjects)", f"{walk:.2f}", ""])
        rows.append([name, "prefetch listing (parallel, in the daemon)", f"{listing:.2f}", f"{walk / listing:.2f}"])
        rows.append([name, "mount ready", f"{median([m['mount_ready_s'] for m in run['mounts']]):.2f}", ""])
        rows.append([name, "mount start -> prefetch done (cache filled)",
                     f"{median([m['prefetch_done_s'] for m in run['mounts']]):.2f}", ""])
        rows.append([name, "find after prefetch", f"{median([m['find_after_prefetch_s'] for m in run['mounts']]):.2f}",
                     ""])
        rows.append([name, "mount start -> find done", f"{start_to_find:.2f}", f"{walk / start_to_find:.2f}"])
        rows.append([name, "mount start -> find done, find at once", f"{run['find_at_once_s']:.2f}",
                     f"{walk / run['find_at_once_s']:.2f}"])
        if "plain_find_s" in run:
            rows.append([name, "find, no prefetch (fresh mount)", f"{run['plain_find_s']:.2f}",
                         f"{walk / run['plain_find_s']:.2f}"])
        floor = median(run["emulator_cpu_s_per_page_prefetch"]) * median([m["pages"] for m in run["mounts"]])
        rows.append([name, "emulator CPU for the prefetch's pages (a floor)", f"{floor:.2f}",
                     f"{walk / floor:.2f}"])
        rows.append([name, "emulator CPU ms per page (walk / prefetch)",
                     f"{median(run['emulator_cpu_s_per_page_walk']) * 1e3:.1f} / "
                     f"{median(run['emulator_cpu_s_per_page_prefetch']) * 1e3:.1f}", ""])
        rows.append([name, "daemon CPU s (whole prefetched mount)",
                     f"{median([m['daemon_cpu_s'] for m in run['mounts']]):.2f}", ""])
        first = run["mounts"][0]
        rows.append([name, f"ranges / steals / pages (workers {args.workers})",
                     f"{first['ranges']} / {first['steals']} / {first['pages']}", ""])
    print_table(f"Listing {expected} objects ({args.dirs} dirs x {args.files}): seconds, and walk/x speed-up",
                ["latency", "scenario", "seconds", "walk / this"], rows)
    print(f"\nraw results: {save_results('listing', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
