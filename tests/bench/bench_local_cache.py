"""The local cache (``--cache-dir``): a second epoch, a remount, and a model load,
against Google's official client reading the same objects, in one run against
one emulator process (objects on disk, latency 0).

- E1/E2: ``--files`` objects of ``--file-mib`` MiB read whole by 4 threads
  (1 MiB reads), as a data loader's workers would. Epoch 1 on a fresh mount
  with an empty cache directory; the kernel's caches dropped; epoch 2 on the
  same mount; then a remount on the same directory and epoch 2 again. The
  official client reads the same objects with 4 MRDs at once in one process.
- M1: a ``--model-mib`` MiB safetensors file loaded with ``safe_open`` (mmap,
  every tensor copied) after a remount with the cache warm and the kernel's
  caches dropped; the official client downloads it to local disk (one MRD)
  and the same code loads it from there.

Each mount runs twice per round: with FUSE passthrough (the kernel reads the
cache's files itself) and with ``--no-passthrough`` (the mount answers every
READ from them); a mount without ``--cache-dir`` reads the same epoch once,
and the cache's files are read straight from the local disk (the ceiling). Sides alternate between rounds. MB/s, and CPU-s per GiB of
the FUSE process (by thread in the JSON), of its workers, of the official
process.

    sudo .venv/bin/python tests/bench/bench_local_cache.py [--rounds 3] [--files 64] [--file-mib 32]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import pathlib
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench import bench_page_stores  # noqa: E402
from tests.bench.bench_dataplane import CpuSnapshot, cold_start, cpu_delta, settle, spread  # noqa: E402
from tests.bench.common import (  # noqa: E402
    GiB, MiB, drop_caches, emulator_process, free_port, median, mount_process, official_client, print_table,
    save_results)

BUCKET = bench_page_stores.BUCKET
PREFIX = "epochs/"
MODEL = "epochs-model/model.safetensors"
READERS = 4
MODES = {"passthrough": [], "no passthrough": ["--no-passthrough"]}
TIMEOUT = 1800


def names(count: int) -> list[str]:
    return [f"{PREFIX}shard-{index:04d}.bin" for index in range(count)]


def seed(data_dir: str, count: int, size: int, model_size: int) -> dict[str, list[pathlib.Path]]:
    """The shards and the model, and the emulator's backing files of each group."""
    from rapidmount.emulator import Emulator

    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        for name in names(count):
            emulator.seed(BUCKET, name, os.urandom(size))
        emulator.seed(BUCKET, MODEL, bench_page_stores.safetensors_file(model_size))
    blobs = sorted(pathlib.Path(data_dir).rglob("*.blob"), key=lambda path: path.stat().st_size)
    return {"shards": [b for b in blobs if b.stat().st_size == size],
            "model": [b for b in blobs if b.stat().st_size != size]}


# -- readers ----------------------------------------------------------------------------------

def epoch_reader_main(root: str, listing: str) -> int:
    """Read every file named in ``listing`` (one per line) under ``root``, READERS at once;
    print JSON: seconds, bytes, own CPU seconds."""
    paths = [os.path.join(root, line) for line in pathlib.Path(listing).read_text().split()]

    def read_whole(path: str) -> int:
        total = 0
        with open(path, "rb", buffering=0) as file:
            buffer = bytearray(MiB)
            while count := file.readinto(buffer):
                total += count
        return total

    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(READERS) as pool:
        total = sum(pool.map(read_whole, paths))
    elapsed = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": elapsed, "bytes": total,
                      "cpu_s": used.ru_utime - usage.ru_utime + used.ru_stime - usage.ru_stime}))
    return 0


def official_epoch_main(endpoint: str, listing: str) -> int:
    """One official process reading every object whole, READERS MRDs at once."""
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    from tests.bench.common import Sink

    objects = pathlib.Path(listing).read_text().split()

    async def run() -> tuple[int, float]:
        client = official_client(endpoint)
        queue = list(objects)
        total = 0

        async def worker() -> None:
            nonlocal total
            while queue:
                name = queue.pop()
                mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
                sink = Sink()
                await mrd.download_ranges([(0, 0, sink)])
                await mrd.close()
                total += sink.count

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(READERS)))
        return total, time.perf_counter() - started

    usage = resource.getrusage(resource.RUSAGE_SELF)
    total, seconds = asyncio.run(run())
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "bytes": total,
                      "cpu_s": used.ru_utime - usage.ru_utime + used.ru_stime - usage.ru_stime}))
    return 0


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True,
                          timeout=TIMEOUT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def metric(port: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


def wait_for_fills(port: int, count: int, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while metric(port, "rapidmount_local_cache_fills_total") < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cache never held {count} objects")
        time.sleep(0.1)


# -- one side of a round ----------------------------------------------------------------------

def epoch(mount, listing: pathlib.Path, size: int, port: int) -> dict:
    """One epoch through ``mount``: the reader's figures and the mount's CPU per GiB."""
    pid = mount.process.pid
    settle(pid)
    reads = metric(port, "rapidmount_fuse_operations_total")
    before = CpuSnapshot.take(pid)
    run = _run("--epoch-reader", str(mount.path), str(listing))
    cpu = cpu_delta(before, CpuSnapshot.take(pid))
    assert run["bytes"] == size, run
    gib = size / GiB
    return {**run, "mb_s": size / run["seconds"] / 1e6, "fuse_cpu_s_per_gib": cpu["fuse_cpu_s"] / gib,
            "workers_cpu_s_per_gib": cpu["workers_cpu_s"] / gib,
            "mount_cpu_s_per_gib": (cpu["fuse_cpu_s"] + cpu["workers_cpu_s"]) / gib,
            "requests": metric(port, "rapidmount_fuse_operations_total") - reads, "threads": cpu["threads"]}


def through_mount(endpoint: str, flags: list[str], listing: pathlib.Path, size: int, count: int,
                  backing: dict[str, list[pathlib.Path]], model_size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-cache-", dir="/var/tmp") as scratch:
        cache = ["--cache-dir", os.path.join(scratch, "cache"), "--cache-dir-size", "8GiB"]
        port = free_port()
        result: dict = {}
        with mount_process(endpoint, BUCKET, "--prometheus-port", str(port), *cache, *flags) as mount:
            cold_start(backing["shards"])
            result["epoch1"] = epoch(mount, listing, size, port)
            with open(mount.path / MODEL, "rb") as model:  # copied for M1
                while model.read(8 * MiB):
                    pass
            wait_for_fills(port, count + 1)
            drop_caches()
            result["epoch2"] = epoch(mount, listing, size, port)
            # The ceiling: the same reader over the cache's own files, straight from the local disk.
            objects = pathlib.Path(scratch) / "cache" / "objects"
            files = pathlib.Path(scratch) / "files.txt"
            files.write_text("\n".join(path.name for path in objects.iterdir() if path.stat().st_size == size // count))
            drop_caches()
            disk = _run("--epoch-reader", str(objects), str(files))
            result["disk"] = {**disk, "mb_s": disk["bytes"] / disk["seconds"] / 1e6}
        port = free_port()
        with mount_process(endpoint, BUCKET, "--prometheus-port", str(port), *cache, *flags) as mount:
            settle(mount.process.pid)  # the entries' checks at start are done (they read every file)
            drop_caches()
            result["remount"] = epoch(mount, listing, size, port)
            drop_caches()
            pid = mount.process.pid
            before = CpuSnapshot.take(pid)
            run = bench_page_stores.run_reader("model", mount.path / MODEL)
            cpu = cpu_delta(before, CpuSnapshot.take(pid))
            result["model"] = {**run, "mb_s": model_size / run["seconds"] / 1e6,
                               "mount_cpu_s_per_gib": (cpu["fuse_cpu_s"] + cpu["workers_cpu_s"]) / (model_size / GiB)}
        return result


def without_cache(endpoint: str, flags: list[str], listing: pathlib.Path, size: int,
                  backing: dict[str, list[pathlib.Path]]) -> dict:
    """The same epoch through a mount without --cache-dir: what epoch 1 costs without it."""
    port = free_port()
    with mount_process(endpoint, BUCKET, "--prometheus-port", str(port), *flags) as mount:
        cold_start(backing["shards"])
        return epoch(mount, listing, size, port)


def official(endpoint: str, listing: pathlib.Path, size: int, backing: dict[str, list[pathlib.Path]],
             model_size: int, scratch: str) -> dict:
    cold_start(backing["shards"])
    run = _run("--official-epoch", endpoint, str(listing))
    assert run["bytes"] == size, run
    load = bench_page_stores.official(endpoint, "model", MODEL, model_size, backing["model"], scratch)
    return {"epoch": {**run, "mb_s": size / run["seconds"] / 1e6,
                      "cpu_s_per_gib": run["cpu_s"] / (size / GiB)},
            "model": load}


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--epoch-reader":
        return epoch_reader_main(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[1] == "--official-epoch":
        return official_epoch_main(sys.argv[2], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[1] == "--reader":
        return bench_page_stores.reader_main(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--file-mib", type=int, default=32)
    parser.add_argument("--model-mib", type=int, default=512)
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags for every mount")
    args = parser.parse_args()
    common = shlex.split(args.mount_args)
    file_size, model_size = args.file_mib * MiB, args.model_mib * MiB
    size = args.files * file_size
    results: dict = {"files": args.files, "file_mib": args.file_mib, "model_mib": args.model_mib,
                     "rounds": args.rounds, "official": [], "no cache": [], **{mode: [] for mode in MODES}}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-epochs-", dir="/var/tmp") as data_dir, \
            tempfile.TemporaryDirectory(prefix="rapidmount-bench-local-", dir="/var/tmp") as scratch:
        print(f"seeding {args.files} x {args.file_mib} MiB and a {args.model_mib} MiB safetensors file ...",
              flush=True)
        backing = seed(data_dir, args.files, file_size, model_size)
        listing = pathlib.Path(scratch) / "listing.txt"
        listing.write_text("\n".join(names(args.files)) + "\n")
        with emulator_process(data_dir=data_dir) as (endpoint, _):
            for round_ in range(args.rounds):
                steps = [("official", lambda: official(endpoint, listing, size, backing, model_size, scratch))]
                steps += [(mode, lambda flags=flags: through_mount(endpoint, [*common, *flags], listing, size,
                                                                   args.files, backing, model_size))
                          for mode, flags in MODES.items()]
                steps.append(("no cache", lambda: without_cache(endpoint, common, listing, size, backing)))
                if round_ % 2:
                    steps = steps[1:] + steps[:1]
                for label, step in steps:
                    results[label].append(step())
                print(f"round {round_ + 1}: official {results['official'][-1]['epoch']['mb_s']:.0f} MB/s; "
                      f"no cache {results['no cache'][-1]['mb_s']:.0f} MB/s; "
                      + "; ".join(f"{mode}: epoch 1 {results[mode][-1]['epoch1']['mb_s']:.0f}, epoch 2 "
                                  f"{results[mode][-1]['epoch2']['mb_s']:.0f}, remount "
                                  f"{results[mode][-1]['remount']['mb_s']:.0f} MB/s" for mode in MODES), flush=True)
    report(args, results)
    print(f"\nraw results: {save_results('local-cache', results)}")
    return 0


def report(args, results: dict) -> None:
    official_runs = [run["epoch"] for run in results["official"]]
    official_mb_s = [run["mb_s"] for run in official_runs]
    header = ["reader", "MB/s", "vs official", "vs epoch 1", "FUSE requests", "CPU-s/GiB FUSE process",
              "CPU-s/GiB workers", "CPU-s/GiB mount (both)", "CPU-s/GiB official process"]
    rows = [["official client, 4 MRDs", spread(official_mb_s), "1.00", "-", "-", "-", "-", "-",
             spread([run["cpu_s_per_gib"] for run in official_runs], 2)]]
    plain = results["no cache"]
    rows.append(["mount without --cache-dir (every epoch)", spread([run["mb_s"] for run in plain]),
                 f"{median([run['mb_s'] for run in plain]) / median(official_mb_s):.2f}", "-",
                 spread([run["requests"] for run in plain]),
                 spread([run["fuse_cpu_s_per_gib"] for run in plain], 3),
                 spread([run["workers_cpu_s_per_gib"] for run in plain], 3),
                 spread([run["mount_cpu_s_per_gib"] for run in plain], 3), "-"])
    disk = [run["disk"]["mb_s"] for mode in MODES for run in results[mode]]
    rows.append(["the cache's files read directly from local disk (the ceiling)", spread(disk),
                 f"{median(disk) / median(official_mb_s):.2f}", "-", "-", "-", "-", "-", "-"])
    for mode in MODES:
        first = [run["epoch1"]["mb_s"] for run in results[mode]]
        for key, label in (("epoch1", "epoch 1"), ("epoch2", "epoch 2"), ("remount", "epoch 2 after a remount")):
            runs = [run[key] for run in results[mode]]
            mb_s = [run["mb_s"] for run in runs]
            rows.append([f"mount, {mode}: {label}", spread(mb_s), f"{median(mb_s) / median(official_mb_s):.2f}",
                         f"{median(mb_s) / median(first):.2f}", spread([run["requests"] for run in runs]),
                         spread([run["fuse_cpu_s_per_gib"] for run in runs], 3),
                         spread([run["workers_cpu_s_per_gib"] for run in runs], 3),
                         spread([run["mount_cpu_s_per_gib"] for run in runs], 3), "-"])
    print_table(f"E1/E2: {args.files} files of {args.file_mib} MiB read whole by {READERS} threads, "
                f"median (min-max) of {args.rounds} rounds", header, rows)
    official_models = [run["model"] for run in results["official"]]
    rows = [["official client: download, then load", spread([r["seconds"] for r in official_models], 2), "1.00",
             "-", spread([r["client_cpu_s_per_gib"] for r in official_models], 2)]]
    for mode in MODES:
        runs = [run["model"] for run in results[mode]]
        rows.append([f"mount, {mode}, cache warm after a remount", spread([r["seconds"] for r in runs], 2),
                     f"{median([r['seconds'] for r in official_models]) / median([r['seconds'] for r in runs]):.2f}",
                     spread([r["mount_cpu_s_per_gib"] for r in runs], 3), "-"])
    print_table(f"M1: load a {args.model_mib} MiB safetensors file (mmap, every tensor copied), kernel caches "
                f"dropped, median (min-max) of {args.rounds} rounds",
                ["loader", "seconds", "speed-up vs official", "CPU-s/GiB mount", "CPU-s/GiB official"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
