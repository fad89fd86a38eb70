"""Benchmarks W1 and W4: sequential writes through the mount against Google's official writer.

Same emulator process, same bytes, one run:

- W1: one file (``--size-mib``, 1 GiB): ``dd bs=1M conv=fsync`` of a local
  file into a fresh mount (a new appendable object, fsync'd), against one
  official process appending the same bytes with
  ``AsyncAppendableObjectWriter`` in 16 MiB appends, then flushing and
  closing. MB/s, and CPU-s per GiB written of the FUSE process (by thread),
  of the workers and of the official writer's process.
- W4: four files at once (``--w4-size-mib`` each): four ``dd`` into one
  fresh mount against four official processes released together;
  aggregate MB/s and CPU-s per GiB.

Rounds alternate which side goes first; each mount round uses a fresh mount.
After each side of a round, its objects are deleted (outside the timing), so
the emulator's memory stays flat: bytes kept from earlier rounds made every
later round land in fresh memory, whose first touch is slow here, and that
cost, paid alike by both sides, came to set both rates.
Tables give medians with the range (min-max) of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.bench_dataplane import CpuSnapshot, cpu_delta, ratio, settle, spread  # noqa: E402
from tests.bench.common import (  # noqa: E402
    GiB, MiB, emulator_process, mount_process, official_client, print_table, released_together, save_results)

BUCKET = "bench-bucket"
_APPEND_PIECE = 16 * MiB


# -- the official writer, one process each -----------------------------------------------------

def official_writer_main(endpoint: str, name: str, source: str) -> int:
    """Set up, say ``ready``, wait for a line on stdin, append ``source`` as
    ``name`` in 16 MiB appends, flush and close; print JSON (start, end,
    bytes, its own CPU seconds)."""
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def make_client():
        return official_client(endpoint)

    async def write(client) -> int:
        written = 0
        writer = AsyncAppendableObjectWriter(client, BUCKET, name)
        await writer.open()
        with open(source, "rb") as f:  # noqa: ASYNC230 - fed as a user would feed it
            while piece := f.read(_APPEND_PIECE):
                await writer.append(piece)
                written += len(piece)
        await writer.flush()
        await writer.close()
        return written

    client = loop.run_until_complete(make_client())
    print("ready", flush=True)
    sys.stdin.readline()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    count = loop.run_until_complete(write(client))
    end = time.perf_counter()
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"elapsed": end - start, "bytes": count,
                      "cpu_s": used.ru_utime - usage.ru_utime + used.ru_stime - usage.ru_stime}), flush=True)
    loop.close()
    return 0


def official_write(endpoint: str, sources: list[str], tag: str) -> dict:
    """One official process per source, released together: aggregate MB/s and CPU-s per GiB."""
    command = [sys.executable, os.path.abspath(__file__), "--official-writer", endpoint]
    started = 0.0

    def go() -> None:
        nonlocal started
        started = time.perf_counter()

    reports = released_together([command + [f"official-{tag}-{i}", source] for i, source in enumerate(sources)], go)
    elapsed = time.perf_counter() - started
    total = sum(report["bytes"] for report in reports)
    return {"mb_s": total / elapsed / 1e6, "cpu_s_per_gib": sum(r["cpu_s"] for r in reports) / (total / GiB)}


# -- the mount ---------------------------------------------------------------------------------

def mount_write(endpoint: str, sources: list[str], tag: str, extra: list[str]) -> dict:
    """``dd bs=1M conv=fsync`` of each source into one fresh mount, all at once."""
    with mount_process(endpoint, BUCKET, *extra) as mount:
        pid = mount.process.pid
        settle(pid)
        before = CpuSnapshot.take(pid)
        started = time.perf_counter()
        dds = [subprocess.Popen(["dd", f"if={source}", f"of={mount.path / f'mount-{tag}-{i}'}", "bs=1M",
                                 "conv=fsync"], stderr=subprocess.DEVNULL) for i, source in enumerate(sources)]
        if any(dd.wait() != 0 for dd in dds):
            raise RuntimeError("dd into the mount failed")
        elapsed = time.perf_counter() - started
        after = CpuSnapshot.take(pid)
    total = sum(os.path.getsize(source) for source in sources)
    cpu = cpu_delta(before, after)
    gib = total / GiB
    return {"mb_s": total / elapsed / 1e6, "fuse_cpu_s_per_gib": cpu["fuse_cpu_s"] / gib,
            "workers_cpu_s_per_gib": cpu["workers_cpu_s"] / gib,
            "all_cpu_s_per_gib": (cpu["fuse_cpu_s"] + cpu["workers_cpu_s"]) / gib,
            "threads": [[name, count, user / gib, system / gib] for name, count, user, system in cpu["threads"]],
            "workers": {pid_: [user / gib, system / gib] for pid_, (user, system) in cpu["workers"].items()},
            "worker_threads": [[name, count, user / gib, system / gib]
                               for name, count, user, system in cpu["worker_threads"]]}


def delete_objects(endpoint: str, names: list[str]) -> None:
    """Delete ``names`` from the bucket (between rounds, outside any timing)."""
    from google.cloud import _storage_v2 as storage_v2

    async def delete() -> None:
        client = official_client(endpoint)
        for name in names:
            await client.grpc_client.delete_object(request=storage_v2.DeleteObjectRequest(
                bucket=f"projects/_/buckets/{BUCKET}", object_=name))

    asyncio.run(delete())


def run(endpoint: str, sources: list[str], rounds: int, extra: list[str], tag: str) -> dict:
    mounted, official = [], []
    for round_ in range(rounds):
        names = {side: [f"{side}-{tag}{round_}-{i}" for i in range(len(sources))] for side in ("official", "mount")}
        sides = [("official", lambda: official.append(official_write(endpoint, sources, f"{tag}{round_}"))),
                 ("mount", lambda: mounted.append(mount_write(endpoint, sources, f"{tag}{round_}", extra)))]
        for side_name, side in (sides if round_ % 2 == 0 else sides[::-1]):
            side()
            delete_objects(endpoint, names[side_name])
    return {"mount": mounted, "official": official}


def _column(results: list[dict], key: str) -> list[float]:
    return [result[key] for result in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--w4-size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--mount-args", default="")
    args = parser.parse_args()
    extra = args.mount_args.split()
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-") as scratch:
        def source(name: str, size_mib: int) -> str:
            path = os.path.join(scratch, name)
            with open(path, "wb") as f:
                for _ in range(size_mib):
                    f.write(os.urandom(MiB))
            return path

        w1_source = source("w1.bin", args.size_mib)
        w4_sources = [source(f"w4-{i}.bin", args.w4_size_mib) for i in range(4)]
        with emulator_process("--bucket", f"{BUCKET}:zonal", "--latency", str(args.latency)) as (endpoint, _):
            w1 = run(endpoint, [w1_source], args.rounds, extra, "w1-")
            w4 = run(endpoint, w4_sources, args.rounds, extra, "w4-")
    rows = []
    for label, result in ((f"W1 write {args.size_mib} MiB + fsync", w1),
                          (f"W4 four files of {args.w4_size_mib} MiB at once", w4)):
        mount, official = result["mount"], result["official"]
        rows.append([label, spread(_column(mount, "mb_s")), spread(_column(official, "mb_s")),
                     ratio(_column(mount, "mb_s"), _column(official, "mb_s")),
                     spread(_column(mount, "fuse_cpu_s_per_gib"), 2), spread(_column(mount, "workers_cpu_s_per_gib"), 2),
                     spread(_column(mount, "all_cpu_s_per_gib"), 2), spread(_column(official, "cpu_s_per_gib"), 2)])
    print_table("Sequential writes: mount vs official writer (same emulator, same run; median (min-max))",
                ["scenario", "mount MB/s", "official MB/s", "mount/official", "FUSE CPU-s/GiB",
                 "workers CPU-s/GiB", "mount all CPU-s/GiB", "official CPU-s/GiB"], rows)
    last = w1["mount"][-1]
    print_table("W1, last round: CPU-s per GiB written by thread of the FUSE process and by worker",
                ["where", "threads", "user", "system"],
                [[f"FUSE {name}", count, f"{user:.2f}", f"{system:.2f}"] for name, count, user, system in last["threads"]]
                + [[f"worker {pid}", "all", f"{user:.2f}", f"{system:.2f}"] for pid, (user, system) in last["workers"].items()]
                + [[f"workers' {name}", count, f"{user:.2f}", f"{system:.2f}"]
                   for name, count, user, system in last.get("worker_threads", []) if user + system >= 0.005])
    path = save_results("mount-write", {"size_mib": args.size_mib, "w4_size_mib": args.w4_size_mib,
                                        "w1": w1, "w4": w4})
    print(f"\nraw results: {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--official-writer":
        raise SystemExit(official_writer_main(*sys.argv[2:]))
    raise SystemExit(main())
