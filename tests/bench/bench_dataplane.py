"""Benchmarks B1, B2, B4, B5 and B6: the mount's data plane against Google's official client.

The mount is one FUSE process and ``--workers N`` worker processes
(children of the daemon whose command line holds
``rapidmount.workers.main``) that make every gRPC call and write the
bytes into a shared-memory arena the FUSE process replies from.
The official client is ``AsyncMultiRangeDownloader`` of google-cloud-storage.
Same emulator process, same objects for the mount and the official client:

- B1: one object (``--size-mib``, 1 GiB) read sequentially: ``dd bs=1M``
  through a fresh mount against one official process reading it whole with
  one MRD; MB/s and CPU-s per GiB of the FUSE process, of the workers
  (summed) and of the official client's process. One read's CPU is also
  broken down by thread of the FUSE process and by worker process.
- B2: four objects (``--b2-size-mib``, 256 MiB) read at once: four ``dd``
  through one fresh mount against four official processes; aggregate MB/s.
  Meanwhile the RSS (and PSS) of all the mount's processes, daemon and
  workers, is sampled every 0.2 s; its peak is set against the budget:
  ``--cache-size`` plus 100 MiB per process.
- B4: random 4 KiB reads (``--random-reads``) at 4 KiB-aligned offsets of
  the B1 object, ``os.pread`` on a fresh mount against one MRD reading the
  same offsets; p50 and p99 in ms.
- B5: a torch ``DataLoader`` (4 workers, batch 32, shuffled) over
  ``--samples`` files of 64 KiB, emulator with 2 ms latency (an emulator
  process of its own, on the same objects): samples/s through the mount
  against the same DataLoader whose Dataset reads each sample with the
  official client (one MRD per sample, created, used and closed; one event
  loop and client per loader worker, created lazily in the worker).
- B6: B1 and B2 again with ``--workers N`` for each N of ``--workers-list``,
  and a projection (not a measurement) of one mount's ceiling on larger
  nodes from the measured CPU-s per GiB.

Each round runs the official client first in even rounds and the mount first
in odd rounds, with a fresh mount for each read. Before each read the page
cache is dropped, then the emulator's backing files of the objects read are
read back in, so the emulator (standing in for a remote service) serves both
sides from memory. Tables give medians with the range (min-max) of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import pathlib
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    GiB, MiB, Sink, drop_caches, emulator_process, median, mount_process, official_client, percentile,
    print_table, process_cpu, process_memory, released_together, save_results, thread_cpu, timed_preads, worker_pids)

BUCKET = "bench-dataplane"
BIG = "dataplane/big.bin"
PARALLEL = [f"dataplane/parallel-{index}.bin" for index in range(4)]
SAMPLE_PREFIX = "samples/"
SAMPLE_SIZE = 64 * 1024
SAMPLES = "samples"  # key of the samples' backing files
CORES = (8, 16, 64, 192)
PER_PROCESS_BUDGET = 100 * MiB
DD_TIMEOUT = 1800
LOADER_WORKERS, LOADER_BATCH = 4, 32

# Published figures of other clients, for scale beside the projection.
ANCHORS = [
    ("gcsfuse, zonal bucket", "one file: about 2 GB/s (1.9 GiB/s); 16 jobs: 15.7 GB/s (14.6 GiB/s)"),
    ("gcsfs", "2 GB/s per process (1.9 GiB/s); 16 processes: 19 GiB/s"),
]


def now() -> float:
    """CLOCK_MONOTONIC: one clock for this process and the official readers."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# -- objects and the emulator's backing files -------------------------------------------------

def seed(data_dir: str, size: int, parallel_size: int | None, samples: int) -> dict[str, list[pathlib.Path]]:
    """Seed the objects; return each object's backing files (and the samples' under SAMPLES)."""
    from rapidmount.emulator import Emulator

    heads: dict[str, tuple[int, bytes]] = {}
    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        for name, object_size in [(BIG, size)] + [(name, parallel_size) for name in PARALLEL
                                                  if parallel_size is not None]:
            data = os.urandom(object_size)
            emulator.seed(BUCKET, name, data)
            heads[name] = (object_size, data[:64])
            del data
        names = sample_names(samples)
        for start in range(0, len(names), 1000):
            emulator.seed_many(BUCKET, {name: os.urandom(SAMPLE_SIZE) for name in names[start:start + 1000]})
    backing: dict[str, list[pathlib.Path]] = {name: [] for name in heads}
    backing[SAMPLES] = []
    for blob in sorted(pathlib.Path(data_dir).rglob("*.blob")):
        blob_size = blob.stat().st_size
        with open(blob, "rb") as file:
            head = file.read(64)
        owner = next((name for name, (want, want_head) in heads.items()
                      if blob_size == want and head == want_head), SAMPLES)
        backing[owner].append(blob)
    return backing


def sample_names(count: int) -> list[str]:
    return [f"{SAMPLE_PREFIX}sample-{index:06d}.bin" for index in range(count)]


def cold_start(backing: list[pathlib.Path]) -> None:
    """Drop the page cache, then read the emulator's backing files of what is about to be read."""
    drop_caches()
    buffer = bytearray(16 * MiB)
    for path in backing:
        with open(path, "rb", buffering=0) as file:
            while file.readinto(buffer):
                pass


# -- CPU of the mount's processes -------------------------------------------------------------

@dataclasses.dataclass
class CpuSnapshot:
    process: tuple[float, float, float]  # user s, sys s, reaped children's s
    threads: dict[int, tuple[str, float, float]]
    workers: dict[int, tuple[float, float]]
    #: Each worker's live threads: pid -> tid -> (name, user s, sys s).
    worker_threads: dict[int, dict[int, tuple[str, float, float]]] = dataclasses.field(default_factory=dict)

    @classmethod
    def take(cls, pid: int) -> "CpuSnapshot":
        workers, worker_threads = {}, {}
        for worker in worker_pids(pid):
            cpu = process_cpu(worker)
            if cpu is not None:
                workers[worker] = cpu[:2]
                worker_threads[worker] = thread_cpu(worker)
        return cls(process_cpu(pid) or (0.0, 0.0, 0.0), thread_cpu(pid), workers, worker_threads)


def total_cpu(pid: int) -> float:
    snapshot = CpuSnapshot.take(pid)
    return sum(snapshot.process[:2]) + sum(sum(cpu) for cpu in snapshot.workers.values())


def settle(pid: int, quiet: float = 0.02, limit: float = 10.0) -> None:
    """Wait until the daemon and its workers are idle (mount start-up done): less than
    ``quiet`` CPU seconds in 0.2 s, or ``limit`` seconds."""
    deadline = time.monotonic() + limit
    last = total_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        current = total_cpu(pid)
        if current - last < quiet:
            return
        last = current


def cpu_delta(before: CpuSnapshot, after: CpuSnapshot) -> dict:
    """CPU spent between two snapshots by the FUSE process (by thread) and its workers.

    A worker that appeared meanwhile counts whole; one that ended and was reaped
    counts through the daemon's reaped-children CPU."""
    workers = {pid: (user - before.workers.get(pid, (0.0, 0.0))[0], system - before.workers.get(pid, (0.0, 0.0))[1])
               for pid, (user, system) in after.workers.items()}
    gone = [pid for pid in before.workers if pid not in after.workers]
    reaped = max(0.0, after.process[2] - before.process[2] - sum(sum(before.workers[pid]) for pid in gone))
    by_name: dict[str, list] = {}
    for tid, (name, user, system) in after.threads.items():
        _, user0, system0 = before.threads.get(tid, (name, 0.0, 0.0))
        entry = by_name.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += user - user0
        entry[2] += system - system0
    fuse_user = after.process[0] - before.process[0]
    fuse_sys = after.process[1] - before.process[1]
    ended_user = fuse_user - sum(user for _, user, _ in by_name.values())
    ended_sys = fuse_sys - sum(system for _, _, system in by_name.values())
    threads = sorted(([name, count, user, system] for name, (count, user, system) in by_name.items()),
                     key=lambda row: -(row[2] + row[3]))
    if ended_user + ended_sys > 0.005:
        threads.append(["(threads that ended during the read)", "", max(0.0, ended_user), max(0.0, ended_sys)])
    # The workers' threads by name, summed over the workers alive at both ends.
    worker_threads: dict[str, list] = {}
    for worker, threads_after in after.worker_threads.items():
        threads_before = before.worker_threads.get(worker, {})
        for tid, (name, user, system) in threads_after.items():
            _, user0, system0 = threads_before.get(tid, (name, 0.0, 0.0))
            entry = worker_threads.setdefault(name, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += user - user0
            entry[2] += system - system0
    return {"fuse_user_s": fuse_user, "fuse_sys_s": fuse_sys, "fuse_cpu_s": fuse_user + fuse_sys,
            "worker_threads": sorted(([name, count, user, system] for name, (count, user, system)
                                      in worker_threads.items()), key=lambda row: -(row[2] + row[3])),
            "workers_cpu_s": sum(user + system for user, system in workers.values()) + reaped,
            "workers": {str(pid): list(cpu) for pid, cpu in workers.items()},
            "workers_reaped_cpu_s": reaped, "workers_started": len(set(after.workers) - set(before.workers)),
            "workers_ended": len(gone), "worker_count": len(after.workers), "threads": threads}


class MemorySampler(threading.Thread):
    """Every ``interval`` s, the summed RSS and PSS of the daemon and its workers; keeps the peaks."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss = self.peak_pss = self.max_processes = self.samples = 0
        self._done = threading.Event()

    def sample(self) -> None:
        pids = [self.pid] + worker_pids(self.pid)
        memory = [process_memory(pid) for pid in pids]
        self.peak_rss = max(self.peak_rss, sum(rss for rss, _ in memory))
        self.peak_pss = max(self.peak_pss, sum(pss for _, pss in memory))
        self.max_processes = max(self.max_processes, len(pids))
        self.samples += 1

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self.join()
        self.sample()


# -- the official client ----------------------------------------------------------------------

def official_reader_main(endpoint: str, bucket: str, name: str) -> int:
    """One official-client process: set up, say ``ready``, wait for a line on stdin, read the
    object whole with one MRD, print JSON (start, end, bytes, its own CPU seconds)."""
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def make_client():
        return official_client(endpoint)

    async def read(client) -> tuple[int, float]:
        mrd = await AsyncMultiRangeDownloader.create_mrd(client, bucket, name)
        sink = Sink()
        await mrd.download_ranges([(0, 0, sink)])
        end = now()
        await mrd.close()
        return sink.count, end

    client = loop.run_until_complete(make_client())
    print("ready", flush=True)
    sys.stdin.readline()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = now()
    count, end = loop.run_until_complete(read(client))
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"start": start, "end": end, "bytes": count,
                      "cpu_s": used.ru_utime - usage.ru_utime + used.ru_stime - usage.ru_stime}), flush=True)
    loop.close()
    return 0


def official_read(endpoint: str, names: list[str], backing: list[pathlib.Path]) -> dict:
    """One official process per object, all released at once: aggregate MB/s and summed CPU."""
    command = [sys.executable, os.path.abspath(__file__), "--official-reader", endpoint, BUCKET]
    reports = released_together([command + [name] for name in names], lambda: cold_start(backing))
    total = sum(report["bytes"] for report in reports)
    elapsed = max(report["end"] for report in reports) - min(report["start"] for report in reports)
    cpu = sum(report["cpu_s"] for report in reports)
    return {"mb_s": total / elapsed / 1e6, "bytes": total, "elapsed_s": elapsed, "client_cpu_s": cpu,
            "client_cpu_s_per_gib": cpu / (total / GiB)}


# -- B1 and B2 through the mount --------------------------------------------------------------

def dd_command(path: pathlib.Path) -> list[str]:
    return ["dd", f"if={path}", "of=/dev/null", "bs=1M"]


def mount_read(endpoint: str, names: list[str], size: int, extra: list[str], workers: int | None,
               backing: list[pathlib.Path], sample_memory: bool) -> dict:
    """``dd bs=1M`` of each object at once through one fresh mount."""
    with mount_process(endpoint, BUCKET, *extra, workers=workers) as mount:
        pid = mount.process.pid
        cold_start(backing)
        settle(pid)
        before = CpuSnapshot.take(pid)
        with MemorySampler(pid) if sample_memory else contextlib.nullcontext() as sampler:
            started = time.perf_counter()
            readers = [subprocess.Popen(dd_command(mount.path / name), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL) for name in names]
            failed = [reader.wait(timeout=DD_TIMEOUT) for reader in readers]
            elapsed = time.perf_counter() - started
        after = CpuSnapshot.take(pid)
        if any(failed):
            raise RuntimeError(f"dd through the mount failed: exit codes {failed}")
    gib = size * len(names) / GiB
    result = {"mb_s": size * len(names) / elapsed / 1e6, "elapsed_s": elapsed, **cpu_delta(before, after)}
    result["fuse_cpu_s_per_gib"] = result["fuse_cpu_s"] / gib
    result["workers_cpu_s_per_gib"] = result["workers_cpu_s"] / gib
    if sampler:
        result.update(peak_rss=sampler.peak_rss, peak_pss=sampler.peak_pss,
                      processes=sampler.max_processes, memory_samples=sampler.samples)
    return result


# -- B4: random 4 KiB reads -------------------------------------------------------------------

def random_offsets(size: int, count: int, seed_: int) -> list[int]:
    rng = random.Random(seed_)
    return [rng.randrange(0, size // 4096) * 4096 for _ in range(count)]


async def official_random(endpoint: str, offsets: list[int]) -> list[float]:
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    client = official_client(endpoint)
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, BIG)
    latencies = []
    try:
        for offset in offsets:
            buffer = io.BytesIO()
            started = time.perf_counter()
            await mrd.download_ranges([(offset, 4096, buffer)])
            latencies.append(time.perf_counter() - started)
    finally:
        await mrd.close()
    return latencies


def mount_random(endpoint: str, offsets: list[int], extra: list[str], backing: list[pathlib.Path]) -> list[float]:
    with mount_process(endpoint, BUCKET, *extra) as mount:
        cold_start(backing)
        settle(mount.process.pid)
        fd = os.open(mount.path / BIG, os.O_RDONLY)
        try:
            os.pread(fd, 4096, 0)  # open the stream before timing, as create_mrd does
            latencies = timed_preads(fd, offsets)
        finally:
            os.close(fd)
    return latencies


# -- B5: DataLoader ---------------------------------------------------------------------------

def keep_as_list(batch: list) -> list:
    return batch


class OfficialSamples:
    """Map-style dataset: one object per sample, read with the official client, one MRD per
    sample (created, used, closed). Each loader worker makes its own event loop and client
    on its first sample."""

    def __init__(self, endpoint: str, names: list[str]) -> None:
        self.endpoint, self.names = endpoint, sorted(names)
        self._loop = self._client = None

    def __getstate__(self) -> dict:
        return {"endpoint": self.endpoint, "names": self.names, "_loop": None, "_client": None}

    def __len__(self) -> int:
        return len(self.names)

    async def _make_client(self):
        return official_client(self.endpoint)

    async def _fetch(self, name: str) -> bytes:
        from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

        mrd = await AsyncMultiRangeDownloader.create_mrd(self._client, BUCKET, name)
        try:
            buffer = io.BytesIO()
            await mrd.download_ranges([(0, 0, buffer)])
        finally:
            await mrd.close()
        return buffer.getvalue()

    def __getitem__(self, index: int):
        import torch

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._client = self._loop.run_until_complete(self._make_client())
        name = self.names[index]
        data = self._loop.run_until_complete(self._fetch(name))
        return name.removeprefix(SAMPLE_PREFIX), torch.frombuffer(bytearray(data), dtype=torch.uint8)


def loader_rate(dataset) -> float:
    """Samples/s of a shuffled DataLoader; the clock starts once each loader worker has
    delivered one batch (start-up and first client set-up are not timed)."""
    # torch without numpy, and 4 loader workers on a small machine: both warnings are noise here
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=LOADER_BATCH, num_workers=LOADER_WORKERS, shuffle=True,
                        multiprocessing_context="spawn", generator=torch.Generator().manual_seed(1),
                        collate_fn=keep_as_list)
    batches = iter(loader)
    for _ in range(min(LOADER_WORKERS, len(loader) - 1)):
        next(batches)
    started = time.perf_counter()
    count = sum(len(batch) for batch in batches)
    elapsed = time.perf_counter() - started
    del batches
    return count / elapsed


def mount_loader(endpoint: str, extra: list[str], backing: list[pathlib.Path]) -> float:
    from tests.mlsamples import FileSamples

    with mount_process(endpoint, BUCKET, *extra) as mount:
        dataset = FileSamples(str(mount.path / SAMPLE_PREFIX))
        cold_start(backing)
        settle(mount.process.pid)
        return loader_rate(dataset)


def official_loader(endpoint: str, names: list[str], backing: list[pathlib.Path]) -> float:
    cold_start(backing)
    return loader_rate(OfficialSamples(endpoint, names))


# -- reporting --------------------------------------------------------------------------------

def spread(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def ratio(mount: list[float], official: list[float]) -> str:
    return f"{median(mount) / median(official):.2f}" if mount and official and median(official) else "-"


def ceiling(serial: float, parallel: float, cores: int) -> float:
    """min(1/S, cores/(S+P)) GiB/s."""
    limits = []
    if serial > 0:
        limits.append(1 / serial)
    if serial + parallel > 0:
        limits.append(cores / (serial + parallel))
    return min(limits) if limits else float("inf")


def workers_flag_supported() -> bool:
    from rapidmount.daemon.config import FLAG_BY_DEST

    if "workers" in FLAG_BY_DEST:
        return True
    shown = subprocess.run([sys.executable, "-m", "rapidmount.daemon.cli", "--help"], capture_output=True, text=True)
    return re.search(r"(?<![\w-])--workers\b", shown.stdout + shown.stderr) is not None


def cache_budget(extra: list[str]) -> int:
    from rapidmount.daemon.config import FLAG_BY_DEST

    flag = FLAG_BY_DEST["cache_size"]
    value = flag.default
    for index, arg in enumerate(extra):
        if arg == flag.name and index + 1 < len(extra):
            value = flag.parse(extra[index + 1])
        elif arg.startswith(flag.name + "="):
            value = flag.parse(arg.split("=", 1)[1])
    return int(value)


def mount_rows(label: str, runs: list[dict], official_mb_s: list[float]) -> list:
    mb_s = [run["mb_s"] for run in runs]
    fuse = [run["fuse_cpu_s_per_gib"] for run in runs]
    workers = [run["workers_cpu_s_per_gib"] for run in runs]
    total = [f + w for f, w in zip(fuse, workers)]
    return [label, spread(mb_s), ratio(mb_s, official_mb_s), spread(fuse, 2), spread(workers, 2),
            spread(total, 2), spread([run["worker_count"] for run in runs])]


def official_row(label: str, runs: list[dict]) -> list:
    return [label, spread([run["mb_s"] for run in runs]), "1.00", "-", "-",
            spread([run["client_cpu_s_per_gib"] for run in runs], 2), "-"]


THROUGHPUT_HEADER = ["reader", "MB/s", "mount/official", "CPU-s/GiB FUSE process", "CPU-s/GiB workers",
                     "CPU-s/GiB total (official: client process)", "workers"]


def print_breakdown(run: dict, label: str) -> None:
    rows = [[name, count, f"{user:.3f}", f"{system:.3f}"] for name, count, user, system in run["threads"]]
    rows.append(["FUSE process, all threads", "", f"{run['fuse_user_s']:.3f}", f"{run['fuse_sys_s']:.3f}"])
    print_table(f"B1 CPU of one read ({label}): FUSE process by thread name",
                ["thread name", "threads", "user s", "sys s"], rows)
    rows = [[f"worker pid {pid}", f"{user:.3f}", f"{system:.3f}"] for pid, (user, system) in run["workers"].items()]
    if run["workers_reaped_cpu_s"] > 0:
        rows.append(["workers that ended during the read (user + sys)", f"{run['workers_reaped_cpu_s']:.3f}", ""])
    if not rows:
        rows.append(["(no worker processes found)", "0.000", "0.000"])
    print_table(f"B1 CPU of one read ({label}): worker processes", ["process", "user s", "sys s"], rows)


# -- main -------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="rounds of every measurement (default 3; --quick: 1)")
    parser.add_argument("--size-mib", type=int, help="B1 object (and B4's), MiB (default 1024; --quick: 128)")
    parser.add_argument("--b2-size-mib", type=int, help="each of B2's four objects, MiB (default 256; --quick: 64)")
    parser.add_argument("--random-reads", type=int, help="B4 reads (default 2000; --quick: 200)")
    parser.add_argument("--samples", type=int, help="B5 files of 64 KiB (default 4096; --quick: 512)")
    parser.add_argument("--b5-latency-ms", type=float, default=2.0, help="emulator latency of B5 (default 2)")
    parser.add_argument("--workers-list", default="1,2", help="B6: --workers counts (default 1,2)")
    parser.add_argument("--only", default="B1,B2,B4,B5,B6", help="benchmarks to run, e.g. B1,B4")
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (a smoke run)")
    args = parser.parse_args()
    defaults = {"rounds": (3, 1), "size_mib": (1024, 128), "b2_size_mib": (256, 64), "random_reads": (2000, 200),
                "samples": (4096, 512)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.only = {item.strip().upper() for item in args.only.split(",") if item.strip()}
    unknown = args.only - {"B1", "B2", "B4", "B5", "B6"}
    if unknown:
        parser.error(f"--only: unknown benchmarks {sorted(unknown)}")
    args.workers_list = [int(item) for item in args.workers_list.split(",") if item.strip()]
    return args


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--official-reader":
        return official_reader_main(*sys.argv[2:])
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # loader workers import torch without numpy
    args = parse_args()
    size, parallel_size = args.size_mib * MiB, args.b2_size_mib * MiB
    extra = args.mount_args.split()
    only = args.only

    run_b5 = "B5" in only
    if run_b5 and importlib.util.find_spec("torch") is None:
        print("torch is not installed: skipping B5 (pip install torch)")
        run_b5 = False
    workers_supported = "B6" in only and workers_flag_supported()
    if "B6" in only and not workers_supported:
        print("B6: this rapidmount has no --workers flag; only the default configuration is measured")
    scaling = [(f"--workers {count}", count) for count in args.workers_list] if workers_supported else []
    default = [("default workers", None)]
    configs = {"B1": (default if "B1" in only else []) + scaling, "B2": (default if "B2" in only else []) + scaling}
    run_b4 = "B4" in only

    results: dict = {
        "size_mib": args.size_mib, "b2_size_mib": args.b2_size_mib, "rounds": args.rounds,
        "random_reads": args.random_reads, "samples": args.samples, "sample_kib": SAMPLE_SIZE // 1024,
        "b5_latency_ms": args.b5_latency_ms, "mount_args": extra, "workers_list": args.workers_list,
        "workers_flag": workers_supported, "cache_budget": cache_budget(extra),
        "B1": {"official": [], "mount": {label: [] for label, _ in configs["B1"]}},
        "B2": {"official": [], "mount": {label: [] for label, _ in configs["B2"]}},
        "B4": {"official_ms": [], "mount_ms": []}, "B5": {"official": [], "mount": []},
    }
    offsets = random_offsets(size, args.random_reads, 5)
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-dataplane-") as data_dir:
        print(f"seeding {args.size_mib} MiB, 4 x {args.b2_size_mib} MiB"
              + (f", {args.samples} samples of 64 KiB" if run_b5 else "") + " ...", flush=True)
        backing = seed(data_dir, size, parallel_size if configs["B2"] else None, args.samples if run_b5 else 0)
        if configs["B1"] or configs["B2"] or run_b4:
            with emulator_process(data_dir=data_dir) as (endpoint, _):
                for round_ in range(args.rounds):
                    mount_first = round_ % 2 == 1
                    for bench, names, object_size in (("B1", [BIG], size), ("B2", PARALLEL, parallel_size)):
                        if not configs[bench]:
                            continue
                        files = [path for name in names for path in backing[name]]
                        entry = results[bench]

                        def official(entry=entry, names=names, files=files) -> None:
                            entry["official"].append(official_read(endpoint, names, files))

                        def mounts(bench=bench, entry=entry, names=names, files=files,
                                   object_size=object_size) -> None:
                            for label, workers in configs[bench]:
                                entry["mount"][label].append(mount_read(endpoint, names, object_size, extra,
                                                                        workers, files, bench == "B2"))

                        for step in ((mounts, official) if mount_first else (official, mounts)):
                            step()
                        print(f"round {round_ + 1} {bench}: official {entry['official'][-1]['mb_s']:.0f} MB/s, "
                              + ", ".join(f"mount {label} {runs[-1]['mb_s']:.0f} MB/s"
                                          for label, runs in entry["mount"].items()), flush=True)
                    if run_b4:
                        def official_b4() -> None:
                            cold_start(backing[BIG])
                            results["B4"]["official_ms"].append(
                                [x * 1e3 for x in asyncio.run(official_random(endpoint, offsets))])

                        def mount_b4() -> None:
                            results["B4"]["mount_ms"].append(
                                [x * 1e3 for x in mount_random(endpoint, offsets, extra, backing[BIG])])

                        for step in ((mount_b4, official_b4) if mount_first else (official_b4, mount_b4)):
                            step()
                        p50 = [percentile(results["B4"][key][-1], 0.5) for key in ("official_ms", "mount_ms")]
                        print(f"round {round_ + 1} B4: p50 official {p50[0]:.3f} ms, mount {p50[1]:.3f} ms",
                              flush=True)
        if run_b5:
            names = sample_names(args.samples)
            with emulator_process("--latency", str(args.b5_latency_ms), data_dir=data_dir) as (endpoint, _):
                for round_ in range(args.rounds):
                    steps = [lambda: results["B5"]["official"].append(official_loader(endpoint, names,
                                                                                      backing[SAMPLES])),
                             lambda: results["B5"]["mount"].append(mount_loader(endpoint, extra, backing[SAMPLES]))]
                    for step in (steps[::-1] if round_ % 2 == 1 else steps):
                        step()
                    print(f"round {round_ + 1} B5: official {results['B5']['official'][-1]:.0f} samples/s, "
                          f"mount {results['B5']['mount'][-1]:.0f} samples/s", flush=True)

    report(args, results, configs, scaling, workers_supported, run_b4, run_b5)
    print(f"\nraw results: {save_results('dataplane', results)}")
    return 0


def report(args, results: dict, configs: dict, scaling: list, workers_supported: bool, run_b4: bool,
           run_b5: bool) -> None:
    rounds = f"median (min-max) of {args.rounds} round{'s' if args.rounds > 1 else ''}"
    default_label = "default workers"
    b1, b2 = results["B1"], results["B2"]
    b1_official = [run["mb_s"] for run in b1["official"]]
    b2_official = [run["mb_s"] for run in b2["official"]]
    if default_label in b1["mount"]:
        print_table(f"B1: one {args.size_mib} MiB object, sequential (dd bs=1M vs one MRD), {rounds}",
                    THROUGHPUT_HEADER,
                    [official_row("official client, 1 MRD", b1["official"]),
                     mount_rows("mount (default workers)", b1["mount"][default_label], b1_official)])
    if b1["mount"]:
        label, runs = next(iter(b1["mount"].items()))
        print_breakdown(runs[0], f"mount, {label}, round 1")
    if default_label in b2["mount"]:
        print_table(f"B2: four {args.b2_size_mib} MiB objects read at once (4 dd vs 4 official processes), "
                    f"aggregate, {rounds}", THROUGHPUT_HEADER,
                    [official_row("official client, 4 processes", b2["official"]),
                     mount_rows("mount (default workers)", b2["mount"][default_label], b2_official)])
    if b2["mount"]:
        budget = results["cache_budget"]
        rows = []
        for label, runs in b2["mount"].items():
            processes = max(run["processes"] for run in runs)
            limit = budget + PER_PROCESS_BUDGET * processes
            # PSS: RSS counts the shared arena once in every process that touched it.
            peak = max(run["peak_pss"] for run in runs)
            rows.append([label, spread([run["peak_rss"] / MiB for run in runs]),
                         spread([run["peak_pss"] / MiB for run in runs]), processes, f"{limit / MiB:.0f}",
                         f"{peak / limit:.2f}", "yes" if peak <= limit else "NO"])
        print_table(f"B2 memory: peak of the mount's processes (daemon + workers), sampled every 0.2 s; "
                    f"budget = --cache-size {budget / MiB:.0f} MiB + {PER_PROCESS_BUDGET // MiB} MiB per process",
                    ["mount", "peak RSS sum MiB", "peak PSS sum MiB", "processes", "budget MiB",
                     "peak PSS / budget", "within budget"], rows)
    if run_b4:
        official_p = {q: [percentile(run, q) for run in results["B4"]["official_ms"]] for q in (0.5, 0.99)}
        mount_p = {q: [percentile(run, q) for run in results["B4"]["mount_ms"]] for q in (0.5, 0.99)}
        print_table(f"B4: {args.random_reads} random 4 KiB reads of the {args.size_mib} MiB object, ms, {rounds}",
                    ["reader", "p50 ms", "p99 ms", "p50 mount/official", "p99 mount/official"],
                    [["official client, 1 MRD", spread(official_p[0.5], 3), spread(official_p[0.99], 3), "1.00",
                      "1.00"],
                     ["mount, os.pread", spread(mount_p[0.5], 3), spread(mount_p[0.99], 3),
                      ratio(mount_p[0.5], official_p[0.5]), ratio(mount_p[0.99], official_p[0.99])]])
    if run_b5:
        b5 = results["B5"]
        print_table(f"B5: DataLoader ({LOADER_WORKERS} workers, batch {LOADER_BATCH}, shuffled), {args.samples} "
                    f"samples of 64 KiB, emulator latency {args.b5_latency_ms:g} ms, samples/s, {rounds}",
                    ["reader", "samples/s", "mount/official"],
                    [["official client, one MRD per sample", spread(b5["official"]), "1.00"],
                     ["mount, open/read per sample", spread(b5["mount"]), ratio(b5["mount"], b5["official"])]])
    if "B6" in args.only:
        rows = []
        for bench, official_mb_s, official_runs, title in (("B1", b1_official, b1["official"], "B1 official, 1 MRD"),
                                                           ("B2", b2_official, b2["official"],
                                                            "B2 official, 4 processes")):
            if not official_runs:
                continue
            rows.append(official_row(title, official_runs))
            for label, count in [("default workers", None)] + [(f"--workers {n}", n) for n in args.workers_list]:
                runs = results[bench]["mount"].get(label)
                if runs:
                    rows.append(mount_rows(f"{bench} mount {label}", runs, official_mb_s))
                elif count is not None:
                    rows.append([f"{bench} mount {label}", "not run: this rapidmount has no --workers flag",
                                 "", "", "", "", ""])
        print_table(f"B6: scaling with the worker count, {rounds}", THROUGHPUT_HEADER, rows)
        rows = []
        for label, runs in b1["mount"].items():
            serial = median([run["fuse_cpu_s_per_gib"] for run in runs])
            parallel = median([run["workers_cpu_s_per_gib"] for run in runs])
            rows.append([f"B1 mount {label}", f"{serial:.2f}", f"{parallel:.2f}"]
                        + [f"{ceiling(serial, parallel, cores):.2f}" for cores in CORES] + [""])
        for name, note in ANCHORS:
            rows.append([f"anchor: {name}", "", "", "", "", "", "", note])
        print_table("B6 projection, not a measurement: one mount's ceiling in GiB/s on nodes of "
                    + ", ".join(str(cores) for cores in CORES) + " cores",
                    ["mount", "S: FUSE CPU-s/GiB", "P: workers CPU-s/GiB"]
                    + [f"{cores} cores GiB/s" for cores in CORES] + ["published figure (other clients)"], rows)
        print("\nceiling(cores) = min(1/S, cores/(S+P)) GiB/s, where S is the FUSE process's CPU-s per GiB "
              "(the serial part: one process) and P the workers' CPU-s per GiB, summed (the parallel part), "
              "both measured in B1 on this machine. A projection, not a measurement: it assumes the "
              "network, the service and memory bandwidth never limit.")
        if not workers_supported:
            print("(this rapidmount has no --workers flag: the projection has only the default configuration)")


if __name__ == "__main__":
    raise SystemExit(main())
