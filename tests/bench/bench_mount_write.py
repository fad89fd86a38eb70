"""Benchmark: sequential writes through the mount against Google's official client.

Same emulator process, same bytes, one run: ``dd bs=1M conv=fsync`` of a
local file into the mount (a new appendable object, fsync'd) against
``AsyncAppendableObjectWriter`` appending the same bytes and flushing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (
    MiB, emulator_process, median, mount_process, official_client, print_table, save_results)

BUCKET = "bench-bucket"
_APPEND_PIECE = 16 * MiB


async def official_write(endpoint: str, source: str, name: str, size: int) -> float:
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter

    client = official_client(endpoint)
    with open(source, "rb") as f:  # noqa: ASYNC230 - the official writer is fed as a user would feed it
        started = time.perf_counter()
        writer = AsyncAppendableObjectWriter(client, BUCKET, name)
        await writer.open()
        while piece := f.read(_APPEND_PIECE):
            await writer.append(piece)
        await writer.flush()
        await writer.close()
        elapsed = time.perf_counter() - started
    return size / elapsed / 1e6


def mount_write(mount, source: str, name: str, size: int) -> float:
    started = time.perf_counter()
    subprocess.run(["dd", f"if={source}", f"of={mount.path / name}", "bs=1M", "conv=fsync"], check=True,
                   stderr=subprocess.DEVNULL)
    return size / (time.perf_counter() - started) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--mount-args", default="")
    args = parser.parse_args()
    size = args.size_mib * MiB
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-") as scratch:
        source = os.path.join(scratch, "source.bin")
        with open(source, "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(MiB))
        mounted, official = [], []
        with emulator_process("--bucket", f"{BUCKET}:zonal", "--latency", str(args.latency)) as (endpoint, _):
            with mount_process(endpoint, BUCKET, *args.mount_args.split()) as mount:
                for round_ in range(args.rounds):
                    official.append(asyncio.run(official_write(endpoint, source, f"official-{round_}", size)))
                    mounted.append(mount_write(mount, source, f"mount-{round_}", size))
    ratio = median(mounted) / median(official)
    print_table("Sequential write: mount vs official client (same emulator, same run)",
                ["scenario", "mount MB/s", "official MB/s", "mount/official"],
                [[f"write {args.size_mib} MiB + fsync", f"{median(mounted):.0f}", f"{median(official):.0f}",
                  f"{ratio:.2f}"]])
    path = save_results("mount-write", {"size_mib": args.size_mib, "mount": mounted, "official": official,
                                        "ratio": ratio})
    print(f"\nraw results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
