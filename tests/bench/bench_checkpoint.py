"""Benchmark: a PyTorch checkpoint saved and loaded through the mount.

``torch.save`` of a ~1 GiB state dict into the mount (then fsync), and
``torch.load`` back with the page cache dropped, against the same on a local
directory. Needs ``pip install torch==2.13.0`` (CPU build).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    MiB, drop_caches, emulator_process, median, mount_process, print_table, save_results)

BUCKET = "bench-bucket"


def state_dict(size_mib: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    layers = max(1, size_mib // 64)
    per_layer = size_mib * MiB // 4 // layers
    return {f"layer{i}.weight": torch.randn(per_layer, generator=generator) for i in range(layers)}


def save(path: str, state) -> float:
    import torch

    started = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - started


def load(path: str, state) -> float:
    import torch

    drop_caches()
    started = time.perf_counter()
    loaded = torch.load(path, weights_only=True)
    elapsed = time.perf_counter() - started
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mount-args", default="", help="more mount flags, e.g. --mount-args=--no-direct-writes")
    args = parser.parse_args()
    try:
        state = state_dict(args.size_mib)
    except ImportError:
        print("torch is not installed: pip install torch==2.13.0 (CPU build)")
        return 1
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    results: dict = {"bytes": nbytes, "mount": {"save": [], "load": []}, "local": {"save": [], "load": []}}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-ckpt-") as local_dir:
        with emulator_process("--bucket", f"{BUCKET}:zonal") as (endpoint, _):
            with mount_process(endpoint, BUCKET, *args.mount_args.split()) as mount:
                for round_ in range(args.rounds):
                    for where, directory in (("local", local_dir), ("mount", str(mount.path))):
                        path = os.path.join(directory, f"ckpt-{round_}.pt")
                        results[where]["save"].append(save(path, state))
                        results[where]["load"].append(load(path, state))
    rows = []
    for op in ("save", "load"):
        mount_s, local_s = median(results["mount"][op]), median(results["local"][op])
        rows.append([f"torch.{op} {nbytes / MiB:.0f} MiB", f"{mount_s:.2f} s ({nbytes / mount_s / 1e6:.0f} MB/s)",
                     f"{local_s:.2f} s ({nbytes / local_s / 1e6:.0f} MB/s)", f"{local_s / mount_s:.2f}"])
    print_table("Checkpoint through the mount vs a local directory (same run)",
                ["scenario", "mount", "local disk", "mount speed / local"], rows)
    print(f"\nraw results: {save_results('checkpoint', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
