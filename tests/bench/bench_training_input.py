"""Benchmark: training input, DataLoader samples per second through the mount vs local disk.

A map-style dataset of small files (one sample per file), read by a
``torch.utils.data.DataLoader`` with 4 worker processes, in listing order
(``shuffle=False``, as when the dataset is pre-shuffled into shards) and
shuffled. The same files are read from local disk and through a fresh mount
of the emulator (latency 0 and 2 ms), kernel page cache dropped each time.
Worker start-up is excluded: the clock starts at the first batch.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    drop_caches, emulator_process, median, mount_process, print_table, save_results)

BUCKET = "bench-train"
PREFIX = "train/"


def keep_as_list(batch: list) -> list:
    return batch


def samples_per_second(root: pathlib.Path, shuffle: bool, workers: int) -> float:
    import torch
    from torch.utils.data import DataLoader

    from tests.mlsamples import FileSamples

    loader = DataLoader(FileSamples(str(root)), batch_size=32, num_workers=workers, shuffle=shuffle,
                        multiprocessing_context="spawn", generator=torch.Generator().manual_seed(1),
                        collate_fn=keep_as_list)
    batches = iter(loader)
    first = next(batches)
    started = time.perf_counter()
    count = sum(len(batch) for batch in batches)
    elapsed = time.perf_counter() - started
    del first  # worker start-up is not timed
    return count / elapsed


def main() -> int:
    # Loader workers import torch without numpy; its warning is noise here.
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from rapidmount.emulator import Emulator

    names = [f"{PREFIX}sample-{i:06d}.bin" for i in range(args.files)]
    rows, results = [], {"files": args.files, "size_kib": args.size_kib, "workers": args.workers, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-train-") as scratch:
        data_dir, local = pathlib.Path(scratch, "emulator"), pathlib.Path(scratch, "local")
        (local / PREFIX).mkdir(parents=True)
        print(f"seeding {args.files} samples of {args.size_kib} KiB ...", flush=True)
        with Emulator(buckets={BUCKET: "zonal"}, data_dir=str(data_dir)) as emulator:
            for start in range(0, args.files, 1000):
                batch = {name: os.urandom(args.size_kib * 1024) for name in names[start:start + 1000]}
                emulator.seed_many(BUCKET, batch)
                for name, data in batch.items():
                    (local / name).write_bytes(data)
        for shuffle in (False, True):
            figures: dict[str, list[float]] = {"local": [], "mount 0 ms": [], "mount 2 ms": []}
            for _ in range(args.rounds):
                drop_caches()
                figures["local"].append(samples_per_second(local / PREFIX, shuffle, args.workers))
                for latency in (0, 2):
                    with emulator_process("--latency", str(latency), data_dir=str(data_dir)) as (endpoint, _):
                        with mount_process(endpoint, BUCKET) as mount:
                            os.listdir(mount.path / PREFIX)
                            drop_caches()
                            figures[f"mount {latency} ms"].append(
                                samples_per_second(mount.path / PREFIX, shuffle, args.workers))
            results["runs"]["shuffled" if shuffle else "in order"] = figures
            local_rate = median(figures["local"])
            rows.append(["shuffled" if shuffle else "listing order", f"{local_rate:.0f}"]
                        + [f"{median(figures[k]):.0f} ({median(figures[k]) / local_rate:.2f}x)"
                           for k in ("mount 0 ms", "mount 2 ms")])
    print_table(f"DataLoader, {args.workers} workers, {args.files} samples of {args.size_kib} KiB "
                f"(samples/s, median of {args.rounds}; ratio to local disk)",
                ["order", "local disk", "mount, 0 ms", "mount, 2 ms"], rows)
    print(f"\nresults: {save_results('training-input', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
