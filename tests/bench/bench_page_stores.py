"""Page-cache stores: the same reads with the workers' stores on, off, and Google's official client.

Three workloads, each on a fresh mount per round (cold caches, the kernel's
page cache dropped), rounds alternating the order of the readers:

- P1, cold ``dd bs=1M`` of one object: the reader is faster than the bucket,
  so it meets each block as it arrives (the stores' worst case).
- P2, a reader that computes: 1 MiB reads, each followed by SHA-256 over the
  chunk twice (about what decoding a shard costs), so the bytes can arrive
  before the reader wants them.
- B8, a model load: a safetensors file opened with ``safe_open`` (``mmap``)
  and every tensor copied, as a move to the GPU would. The official client
  downloads the file to local disk (one MRD) and the same code loads it
  (P2 likewise: download, then the same reader over the local file).
  Each load is timed by its loader, after its imports (torch's too), so
  the official figure is the download plus that same load.

For each: MB/s (B8: seconds), the READ requests the FUSE process answered,
and CPU seconds per GiB of the FUSE process and of the workers (the
official client: its process; for B8 the download and the load together).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import pathlib
import resource
import subprocess
import shlex
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.bench_dataplane import (
    CpuSnapshot, cold_start, cpu_delta, official_read, settle, spread)
from tests.bench.common import (
    GiB, MiB, emulator_process, free_port, median, mount_process, official_client, print_table, save_results)

BUCKET = "bench-dataplane"
BIG = "stores/big.bin"
MODEL = "stores/model.safetensors"
MODES = {"stores on": [], "stores off": ["--page-store-buffer", "0"]}
TIMEOUT = 1800


def safetensors_file(size: int) -> bytes:
    """A safetensors file of 8 MiB float32 tensors, written by hand (the format is
    a little-endian header length, a JSON header, then the tensors' bytes)."""
    count, tensor = size // (8 * MiB), 8 * MiB
    header = {f"layer.{index:03d}.weight": {"dtype": "F32", "shape": [2048, 1024],
                                            "data_offsets": [index * tensor, (index + 1) * tensor]}
              for index in range(count)}
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    return len(encoded).to_bytes(8, "little") + encoded + os.urandom(count * tensor)


def seed(data_dir: str, size: int, model_size: int) -> dict[str, list[pathlib.Path]]:
    """The two objects, and each one's backing files in the emulator's directory."""
    from rapidmount.emulator import Emulator

    model = safetensors_file(model_size)
    big = os.urandom(size)
    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        emulator.seed(BUCKET, BIG, big)
        emulator.seed(BUCKET, MODEL, model)
    heads = {BIG: (len(big), big[:64]), MODEL: (len(model), model[:64])}
    backing: dict[str, list[pathlib.Path]] = {BIG: [], MODEL: []}
    for blob in pathlib.Path(data_dir).rglob("*.blob"):
        with open(blob, "rb") as file:
            head = file.read(64)
        for name, (length, want) in heads.items():
            if blob.stat().st_size == length and head == want:
                backing[name].append(blob)
    return backing


# -- the readers, each in a process of its own ------------------------------------------------

def reader_main(kind: str, path: str) -> int:
    """Read ``path`` as workload ``kind``; print JSON: seconds, bytes, own CPU seconds."""
    if kind == "model":  # imported before the clock starts
        import torch  # noqa: F401 - safe_open(framework="pt") would import it (2 s here) on the clock
        from safetensors import safe_open
    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    total = 0
    if kind == "paced":
        with open(path, "rb", buffering=0) as file:
            while chunk := file.read(MiB):
                total += len(chunk)
                hashlib.sha256(chunk).digest()
                hashlib.sha256(chunk).digest()
    else:  # the model load
        with safe_open(path, framework="pt") as model:
            for key in model.keys():
                tensor = model.get_tensor(key).clone()
                total += tensor.numel() * tensor.element_size()
    elapsed = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": elapsed, "bytes": total,
                      "cpu_s": used.ru_utime - usage.ru_utime + used.ru_stime - usage.ru_stime}))
    return 0


def run_reader(kind: str, path: pathlib.Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--reader", kind, str(path)], check=True,
                          capture_output=True, text=True, timeout=TIMEOUT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_requests(port: int) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "rapidmount_fuse_operations_total" and sample.labels.get("op") == "read")


def through_mount(endpoint: str, kind: str, name: str, size: int, extra: list[str],
                  backing: list[pathlib.Path]) -> dict:
    port = free_port()
    with mount_process(endpoint, BUCKET, "--prometheus-port", str(port), *extra) as mount:
        pid = mount.process.pid
        cold_start(backing)
        settle(pid)
        reads_before = read_requests(port)
        before = CpuSnapshot.take(pid)
        if kind == "dd":
            started = time.perf_counter()
            subprocess.run(["dd", f"if={mount.path / name}", "of=/dev/null", "bs=1M"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=TIMEOUT)
            run = {"seconds": time.perf_counter() - started, "bytes": size}
        else:
            run = run_reader(kind, mount.path / name)
        after = CpuSnapshot.take(pid)
        reads = read_requests(port) - reads_before
    cpu = cpu_delta(before, after)
    gib = size / GiB
    return {**run, "mb_s": size / run["seconds"] / 1e6, "reads": reads,
            "fuse_cpu_s_per_gib": cpu["fuse_cpu_s"] / gib, "workers_cpu_s_per_gib": cpu["workers_cpu_s"] / gib,
            "threads": cpu["threads"]}


def official(endpoint: str, kind: str, name: str, size: int, backing: list[pathlib.Path], scratch: str) -> dict:
    if kind == "dd":
        run = official_read(endpoint, [name], backing)
        return {"mb_s": run["mb_s"], "seconds": run["elapsed_s"], "client_cpu_s_per_gib": run["client_cpu_s_per_gib"]}
    # Download to local disk with one MRD, then the same load from there.
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    cold_start(backing)
    target = pathlib.Path(scratch) / "model.safetensors"
    usage = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()

    async def download() -> None:
        client = official_client(endpoint)
        mrd = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
        with open(target, "wb") as sink:  # noqa: ASYNC230 - the official reader writes to a file, as a user's would
            await mrd.download_ranges([(0, 0, sink)])
        await mrd.close()

    asyncio.run(download())
    downloaded = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_SELF)
    # The load's own clock, as through the mount: not the loader process's start and imports.
    loaded = run_reader(kind, target)
    seconds = downloaded + loaded["seconds"]
    cpu = used.ru_utime - usage.ru_utime + used.ru_stime - usage.ru_stime + loaded["cpu_s"]
    target.unlink()
    return {"mb_s": size / seconds / 1e6, "seconds": seconds, "client_cpu_s_per_gib": cpu / (size / GiB)}


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--reader":
        return reader_main(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=512, help="P1 and P2: the object's size")
    parser.add_argument("--model-mib", type=int, default=512, help="B8: the safetensors file's size")
    parser.add_argument("--only", default="P1,P2,B8")
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags for every mount")
    args = parser.parse_args()
    common = shlex.split(args.mount_args)
    size = args.size_mib * MiB
    results: dict = {"size_mib": args.size_mib, "model_mib": args.model_mib, "rounds": args.rounds,
                     "mount_args": args.mount_args}
    workloads = [(bench, kind, name) for bench, kind, name in
                 (("P1", "dd", BIG), ("P2", "paced", BIG), ("B8", "model", MODEL)) if bench in args.only]
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-stores-") as data_dir, \
            tempfile.TemporaryDirectory(prefix="rapidmount-bench-local-", dir="/var/tmp") as scratch:
        print(f"seeding {args.size_mib} MiB and a {args.model_mib} MiB safetensors file ...", flush=True)
        backing = seed(data_dir, size, args.model_mib * MiB)
        sizes = {BIG: size, MODEL: sum(path.stat().st_size for path in backing[MODEL][:1])}
        with emulator_process(data_dir=data_dir) as (endpoint, _):
            for round_ in range(args.rounds):
                for bench, kind, name in workloads:
                    entry = results.setdefault(bench, {"official": [], **{mode: [] for mode in MODES}})
                    steps = [("official", lambda: official(endpoint, kind, name, sizes[name], backing[name],
                                                           scratch))]
                    steps += [(mode, lambda flags=flags: through_mount(endpoint, kind, name, sizes[name],
                                                                       [*common, *flags], backing[name]))
                              for mode, flags in MODES.items()]
                    for label, step in (steps[::-1] if round_ % 2 else steps):
                        entry[label].append(step())
                    print(f"round {round_ + 1} {bench}: " + ", ".join(
                        f"{label} {entry[label][-1]['mb_s']:.0f} MB/s" for label in entry), flush=True)
    report(args, results)
    print(f"\nraw results: {save_results('page-stores', results)}")
    return 0


def report(args, results: dict) -> None:
    titles = {"P1": f"P1: cold dd bs=1M of one {args.size_mib} MiB object",
              "P2": f"P2: a {args.size_mib} MiB object read by a reader that computes (2 x SHA-256 per MiB); "
                    "official: download to local disk, then the same reader",
              "B8": f"B8: load a {args.model_mib} MiB safetensors file (mmap, every tensor copied); official: "
                    "download to local disk, then load"}
    header = ["reader", "MB/s", "seconds", "vs official", "READs answered", "CPU-s/GiB FUSE process",
              "CPU-s/GiB workers", "CPU-s/GiB official process"]
    for bench, entry in results.items():
        if bench not in titles:
            continue
        official_mb_s = [run["mb_s"] for run in entry["official"]]
        rows = [["official client", spread(official_mb_s), spread([r["seconds"] for r in entry["official"]], 2),
                 "1.00", "-", "-", "-", spread([r["client_cpu_s_per_gib"] for r in entry["official"]], 2)]]
        for mode in MODES:
            runs = entry[mode]
            mb_s = [run["mb_s"] for run in runs]
            rows.append([f"mount, {mode}", spread(mb_s), spread([r["seconds"] for r in runs], 2),
                         f"{median(mb_s) / median(official_mb_s):.2f}", spread([r["reads"] for r in runs]),
                         spread([r["fuse_cpu_s_per_gib"] for r in runs], 2),
                         spread([r["workers_cpu_s_per_gib"] for r in runs], 2), "-"])
        print_table(f"{titles[bench]}, median (min-max) of {args.rounds} rounds", header, rows)


if __name__ == "__main__":
    raise SystemExit(main())
