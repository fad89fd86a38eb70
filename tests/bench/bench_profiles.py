"""Each ML profile on the workload it is for, against the defaults: same emulator, fresh mounts.

- aiml-training: one DataLoader epoch (4 workers, batch 32, shuffled) over
  ``--samples`` files of 64 KiB, with 2 ms of service latency; samples/s.
- aiml-serving: a safetensors model load (``safe_open``, mmap, every tensor
  copied) of a ``--model-mib`` file; seconds.
- aiml-checkpointing: ``torch.save`` of a ``--checkpoint-mib`` state dict
  into a new directory, fsync, close, then the directory renamed, on a
  regional (flat) bucket, as a checkpoint is published; seconds. With the
  defaults the rename is refused (EXDEV): the row says so.

Rounds alternate the order of default and profile; the kernel's page cache
is dropped before each.
"""

from __future__ import annotations

import argparse
import errno
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench import bench_dataplane, bench_page_stores  # noqa: E402
from tests.bench.bench_checkpoint import state_dict  # noqa: E402
from tests.bench.common import drop_caches, emulator_process, mount_process, print_table, save_results  # noqa: E402

FLAT_BUCKET = "bench-profiles-flat"


def training(endpoint: str, extra: list[str], backing: list[pathlib.Path]) -> dict:
    return {"samples_s": bench_dataplane.mount_loader(endpoint, extra, backing)}


def serving(endpoint: str, extra: list[str], size: int, backing: list[pathlib.Path]) -> dict:
    run = bench_page_stores.through_mount(endpoint, "model", bench_page_stores.MODEL, size, extra, backing)
    return {"seconds": run["seconds"], "reads": run["reads"], "fuse_cpu_s_per_gib": run["fuse_cpu_s_per_gib"]}


def checkpointing(endpoint: str, extra: list[str], state, round_: int) -> dict:
    import torch

    with mount_process(endpoint, FLAT_BUCKET, *extra) as mount:
        drop_caches()
        staging = mount.path / f"step-{round_}.tmp"
        started = time.perf_counter()
        staging.mkdir()
        with open(staging / "model.pt", "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        saved = time.perf_counter() - started
        try:
            os.rename(staging, mount.path / f"step-{round_}")
            renamed = True
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP):
                raise
            renamed = False
        return {"seconds": time.perf_counter() - started, "save_seconds": saved, "renamed": renamed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--model-mib", type=int, default=512)
    parser.add_argument("--checkpoint-mib", type=int, default=512)
    parser.add_argument("--only", default="aiml-training,aiml-serving,aiml-checkpointing")
    args = parser.parse_args()
    results: dict = {"rounds": args.rounds, "samples": args.samples, "model_mib": args.model_mib,
                     "checkpoint_mib": args.checkpoint_mib}
    modes = {"default": [], "profile": None}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-profiles-") as data_dir:
        if "aiml-training" in args.only:
            backing = bench_dataplane.seed(data_dir, 4096, None, args.samples)[bench_dataplane.SAMPLES]
            entry = results["aiml-training"] = {"default": [], "profile": []}
            with emulator_process("--latency", "2", data_dir=data_dir) as (endpoint, _):
                for round_ in range(args.rounds):
                    order = list(modes) if round_ % 2 == 0 else list(modes)[::-1]
                    for mode in order:
                        extra = [] if mode == "default" else ["--profile", "aiml-training"]
                        entry[mode].append(training(endpoint, extra, backing))
                    print(f"round {round_ + 1} aiml-training: " + ", ".join(
                        f"{mode} {entry[mode][-1]['samples_s']:.0f} samples/s" for mode in modes), flush=True)
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-profiles-") as data_dir:
        if "aiml-serving" in args.only:
            model = bench_page_stores.seed(data_dir, 4096, args.model_mib * MiB)[bench_page_stores.MODEL]
            size = sum(path.stat().st_size for path in model[:1])
            entry = results["aiml-serving"] = {"default": [], "profile": []}
            with emulator_process(data_dir=data_dir) as (endpoint, _):
                for round_ in range(args.rounds):
                    order = list(modes) if round_ % 2 == 0 else list(modes)[::-1]
                    for mode in order:
                        extra = [] if mode == "default" else ["--profile", "aiml-serving"]
                        entry[mode].append(serving(endpoint, extra, size, model))
                    print(f"round {round_ + 1} aiml-serving: " + ", ".join(
                        f"{mode} {entry[mode][-1]['seconds']:.2f} s" for mode in modes), flush=True)
    if "aiml-checkpointing" in args.only:
        state = state_dict(args.checkpoint_mib)
        entry = results["aiml-checkpointing"] = {"default": [], "profile": []}
        with emulator_process("--bucket", f"{FLAT_BUCKET}:flat") as (endpoint, _):
            for round_ in range(args.rounds):
                order = list(modes) if round_ % 2 == 0 else list(modes)[::-1]
                for mode in order:
                    extra = [] if mode == "default" else ["--profile", "aiml-checkpointing"]
                    entry[mode].append(checkpointing(endpoint, extra, state, 2 * round_ + (mode == "profile")))
                print(f"round {round_ + 1} aiml-checkpointing: " + ", ".join(
                    f"{mode} {entry[mode][-1]['seconds']:.2f} s (renamed: {entry[mode][-1]['renamed']})"
                    for mode in modes), flush=True)
    report(results)
    print(f"\nraw results: {save_results('profiles', results)}")
    return 0


def report(results: dict) -> None:
    spread = bench_dataplane.spread
    rows = []
    if "aiml-training" in results:
        entry = results["aiml-training"]
        rows += [["aiml-training", "DataLoader epoch, samples/s (higher is better)", mode,
                  spread([run["samples_s"] for run in entry[mode]])] for mode in ("default", "profile")]
    if "aiml-serving" in results:
        entry = results["aiml-serving"]
        rows += [["aiml-serving", "safetensors load, seconds (READs answered; FUSE CPU-s/GiB)", mode,
                  f"{spread([run['seconds'] for run in entry[mode]], 2)} "
                  f"({spread([run['reads'] for run in entry[mode]])}; "
                  f"{spread([run['fuse_cpu_s_per_gib'] for run in entry[mode]], 2)})"]
                 for mode in ("default", "profile")]
    if "aiml-checkpointing" in results:
        entry = results["aiml-checkpointing"]
        rows += [["aiml-checkpointing", "torch.save + fsync, then rename the directory, seconds", mode,
                  f"{spread([run['seconds'] for run in entry[mode]], 2)} (save "
                  f"{spread([run['save_seconds'] for run in entry[mode]], 2)}; rename "
                  f"{'done' if all(run['renamed'] for run in entry[mode]) else 'refused'})"]
                 for mode in ("default", "profile")]
    print_table(f"ML profiles against the defaults, median (min-max) of {results['rounds']} rounds",
                ["profile", "workload", "mount", "result"], rows)


MiB = 1 << 20

if __name__ == "__main__":
    raise SystemExit(main())
