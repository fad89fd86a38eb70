"""Benchmark B9: shard after shard through one mount, as a training job reads them.

N objects are read one after another, in the same order, each opened,
read whole with 1 MiB ``read()`` calls into one buffer and closed (as a
data loader's worker reads shards), through one fresh mount per round, against one official-client process
reading the same N objects (one ``AsyncMultiRangeDownloader`` per object,
the whole object into a sink), on the same in-memory emulator, sides
alternating over the rounds. Two sets by default: 8 objects of 256 MiB and
64 objects of 16 MiB; and two sources: objects written (and finalized) by
the official client, and objects written through the mount (appendable,
unfinalized), read after a remount.

Per set and source it reports each side's per-file MB/s (median and
minimum), the mount's READs per file (a round's average), every file's ratio to the first file
of its mount, and CPU seconds per GiB by process (the FUSE process, the
workers, the emulator; the official process, the emulator) and by thread.
The page cache is dropped once before each side's round; a fresh mount has
no page of these files cached anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.bench_dataplane import CpuSnapshot, cpu_delta, settle  # noqa: E402
from tests.bench.common import (  # noqa: E402
    GiB, MiB, Sink, drop_caches, emulator_process, free_port, median, mount_process, official_client, print_table,
    process_cpu, save_results)

BUCKET = "bench-bucket"
_PIECE = 16 * MiB


def _names(source: str, size_mib: int, count: int) -> list[str]:
    return [f"shards-{source}-{size_mib}m/shard-{index:05d}.bin" for index in range(count)]


# -- making the objects -------------------------------------------------------------------------

def official_seed(endpoint: str, names: list[str], size: int) -> None:
    """Write and finalize ``names`` with the official client's appendable writer."""
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter

    async def write() -> None:
        client = official_client(endpoint)
        for index, name in enumerate(names):
            data = _payload(size, index)
            writer = AsyncAppendableObjectWriter(client, BUCKET, name)
            await writer.open()
            for at in range(0, size, _PIECE):
                await writer.append(data[at:at + _PIECE])
            await writer.close(finalize_on_close=True)

    asyncio.run(write())


def mount_seed(endpoint: str, names: list[str], size: int, extra: list[str]) -> None:
    """Write ``names`` through a mount (appendable objects, left unfinalized)."""
    with mount_process(endpoint, BUCKET, *extra) as mount:
        for index, name in enumerate(names):
            path = mount.path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as out:
                out.write(_payload(size, index))


def _payload(size: int, index: int) -> bytes:
    block = os.urandom(min(size, 4 * MiB))
    return (block * (size // len(block) + 1))[index % 97:index % 97 + size]


# -- reading them -------------------------------------------------------------------------------

def _reads(port: int) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "rapidmount_fuse_operations_total" and sample.labels.get("op") == "read":
                return sample.value
    return 0.0


def _read_whole(path: pathlib.Path, buffer: bytearray) -> int:
    with open(path, "rb", buffering=0) as shard:
        total = 0
        while count := shard.readinto(buffer):
            total += count
    return total


def _cpu(pid: int) -> float:
    cpu = process_cpu(pid)
    return cpu[0] + cpu[1] if cpu else 0.0


def mount_round(endpoint: str, emulator_pid: int, names: list[str], size: int, extra: list[str]) -> dict:
    port = free_port()
    with mount_process(endpoint, BUCKET, "--prometheus-port", str(port), *extra) as mount:
        pid = mount.process.pid
        settle(pid)
        drop_caches()
        # The metrics are read once before and once after: each scrape costs
        # the FUSE process a few ms, as much as a 16 MiB file's READs.
        reads_before = _reads(port)
        before, emulator_before = CpuSnapshot.take(pid), _cpu(emulator_pid)
        rates = []
        started = time.perf_counter()
        buffer = bytearray(MiB)
        for name in names:
            began = time.perf_counter()
            got = _read_whole(mount.path / name, buffer)
            rates.append(size / (time.perf_counter() - began) / 1e6)
            if got != size:
                raise RuntimeError(f"{name}: {got} bytes through the mount, expected {size}")
        elapsed = time.perf_counter() - started
        after, emulator_after = CpuSnapshot.take(pid), _cpu(emulator_pid)
        reads = (_reads(port) - reads_before) / len(names)
    gib = size * len(names) / GiB
    cpu = cpu_delta(before, after)
    return {"rates": rates, "reads": reads, "elapsed": elapsed,
            "fuse_cpu_s_per_gib": cpu["fuse_cpu_s"] / gib, "workers_cpu_s_per_gib": cpu["workers_cpu_s"] / gib,
            "emulator_cpu_s_per_gib": (emulator_after - emulator_before) / gib,
            "threads": [[name, count, user / gib, system / gib] for name, count, user, system in cpu["threads"]],
            "worker_threads": [[name, count, user / gib, system / gib]
                               for name, count, user, system in cpu["worker_threads"]]}


def official_reader_main(endpoint: str, size: int, names: list[str]) -> int:
    """One process: each object whole, in order; print JSON (per-object MB/s, own CPU)."""
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    async def read() -> list[float]:
        client = official_client(endpoint)
        rates = []
        for name in names:
            began = time.perf_counter()
            mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
            sink = Sink()
            await mrd.download_ranges([(0, 0, sink)])
            rates.append(size / (time.perf_counter() - began) / 1e6)
            await mrd.close()
            if sink.count != size:
                raise RuntimeError(f"{name}: {sink.count} bytes, expected {size}")
        return rates

    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    rates = asyncio.run(read())
    elapsed = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"rates": rates, "elapsed": elapsed, "user_s": used.ru_utime - usage.ru_utime,
                      "sys_s": used.ru_stime - usage.ru_stime}), flush=True)
    return 0


def official_round(endpoint: str, emulator_pid: int, names: list[str], size: int) -> dict:
    drop_caches()
    emulator_before = _cpu(emulator_pid)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--official-reader", endpoint, str(size),
                           *names], check=True, stdout=subprocess.PIPE, text=True)
    emulator_after = _cpu(emulator_pid)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    gib = size * len(names) / GiB
    return {"rates": report["rates"], "elapsed": report["elapsed"],
            "client_user_s_per_gib": report["user_s"] / gib, "client_sys_s_per_gib": report["sys_s"] / gib,
            "client_cpu_s_per_gib": (report["user_s"] + report["sys_s"]) / gib,
            "emulator_cpu_s_per_gib": (emulator_after - emulator_before) / gib}


# -- the report ---------------------------------------------------------------------------------

def _spread(values: list[float], digits: int = 0) -> str:
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summarize(label: str, mount: list[dict], official: list[dict]) -> dict:
    # Every file against the first file of its own mount.
    versus_first = [rate / rounds["rates"][0] for rounds in mount for rate in rounds["rates"][1:]]
    mount_rates = [rate for rounds in mount for rate in rounds["rates"]]
    official_rates = [rate for rounds in official for rate in rounds["rates"]]
    summary = {
        "label": label,
        "mount_file_mb_s_median": median(mount_rates), "mount_file_mb_s_min": min(mount_rates),
        "official_file_mb_s_median": median(official_rates), "official_file_mb_s_min": min(official_rates),
        "ratio_median_file": median(mount_rates) / median(official_rates),
        "worst_file_vs_first": min(versus_first) if versus_first else 1.0,
        "median_file_vs_first": median(versus_first) if versus_first else 1.0,
        "reads_per_file_median": median([rounds["reads"] for rounds in mount]),
        "reads_per_file_max": max(rounds["reads"] for rounds in mount),
    }
    for key in ("fuse_cpu_s_per_gib", "workers_cpu_s_per_gib", "emulator_cpu_s_per_gib"):
        summary[f"mount_{key}"] = median([rounds[key] for rounds in mount])
    summary["mount_cpu_s_per_gib"] = summary["mount_fuse_cpu_s_per_gib"] + summary["mount_workers_cpu_s_per_gib"]
    for key in ("client_cpu_s_per_gib", "emulator_cpu_s_per_gib"):
        summary[f"official_{key}"] = median([rounds[key] for rounds in official])
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sets", default="256x8,16x64", help="SIZE_MIBxCOUNT, comma-separated")
    parser.add_argument("--sources", default="official,mount", help="who wrote the objects: official, mount")
    parser.add_argument("--latency", default="0", help="emulator latency in ms")
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags")
    parser.add_argument("--official-reader", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.official_reader:
        endpoint, size, *names = args.official_reader
        return official_reader_main(endpoint, int(size), names)
    extra = args.mount_args.split()
    sets = [tuple(int(part) for part in item.split("x")) for item in args.sets.split(",")]
    results: dict = {"rounds": args.rounds, "mount_args": extra, "runs": []}
    with emulator_process("--latency", args.latency, "--bucket", f"{BUCKET}:zonal") as (endpoint, emulator):
        for source in args.sources.split(","):
            for size_mib, count in sets:
                size, names = size_mib * MiB, _names(source, size_mib, count)
                if source == "official":
                    official_seed(endpoint, names, size)
                else:
                    mount_seed(endpoint, names, size, extra)
                mount_rounds, official_rounds = [], []
                for round_ in range(args.rounds):
                    sides = [("mount", mount_rounds), ("official", official_rounds)]
                    for side, into in sides if round_ % 2 == 0 else reversed(sides):
                        into.append(mount_round(endpoint, emulator.pid, names, size, extra) if side == "mount"
                                    else official_round(endpoint, emulator.pid, names, size))
                writer = "the official client" if source == "official" else "the mount"
                summary = summarize(f"{count} x {size_mib} MiB, written by {writer}", mount_rounds, official_rounds)
                results["runs"].append({"summary": summary, "mount": mount_rounds, "official": official_rounds})
                print(json.dumps(summary), flush=True)
    rows = []
    for run in results["runs"]:
        s, mount = run["summary"], run["mount"]
        rows.append([s["label"],
                     _spread([r for rounds in mount for r in rounds["rates"]]),
                     _spread([r for rounds in run["official"] for r in rounds["rates"]]),
                     f"{s['ratio_median_file']:.2f}", f"{s['worst_file_vs_first']:.2f}",
                     f"{s['reads_per_file_median']:.1f} ({s['reads_per_file_max']:.1f})",
                     f"{s['mount_fuse_cpu_s_per_gib']:.2f} + {s['mount_workers_cpu_s_per_gib']:.2f}",
                     f"{s['mount_emulator_cpu_s_per_gib']:.2f}",
                     f"{s['official_client_cpu_s_per_gib']:.2f}", f"{s['official_emulator_cpu_s_per_gib']:.2f}"])
    print_table(f"B9: shards read one after another, {args.rounds} rounds alternating (per-file MB/s: median (min-max))",
                ["set", "mount MB/s", "official MB/s", "mount/official", "worst file / first",
                 "READs per file (worst round)", "mount CPU-s/GiB FUSE + workers", "emulator (mount)",
                 "official CPU-s/GiB", "emulator (official)"], rows)
    for run in results["runs"]:
        mount = run["mount"]
        names = sorted({row[0] for rounds in mount for row in rounds["threads"]})
        thread_rows = [["FUSE " + name, f"{median([sum(r[2] for r in rounds['threads'] if r[0] == name) for rounds in mount]):.2f}",
                        f"{median([sum(r[3] for r in rounds['threads'] if r[0] == name) for rounds in mount]):.2f}"]
                       for name in names]
        names = sorted({row[0] for rounds in mount for row in rounds["worker_threads"]})
        thread_rows += [["workers " + name,
                         f"{median([sum(r[2] for r in rounds['worker_threads'] if r[0] == name) for rounds in mount]):.2f}",
                         f"{median([sum(r[3] for r in rounds['worker_threads'] if r[0] == name) for rounds in mount]):.2f}"]
                        for name in names]
        print_table(f"B9 by thread, {run['summary']['label']} (CPU-s per GiB, median of rounds)",
                    ["thread", "user", "system"], thread_rows)
    print(f"\nraw results: {save_results('shards', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
