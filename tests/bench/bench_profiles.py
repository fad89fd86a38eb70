"""Each ML profile on the workload it is for, against the defaults: same emulator, fresh mounts.

- aiml-training: the index a job builds first (``os.walk`` and a ``stat`` of
  every file) on a fresh mount, then one DataLoader epoch (4 workers, batch
  32, shuffled) over ``--samples`` files of 64 KiB, with 2 ms of service
  latency; seconds and samples/s.
- aiml-serving: a safetensors model load (``safe_open``, mmap, every tensor
  copied) of a ``--model-mib`` file; seconds.
- aiml-checkpointing: ``torch.save`` of a ``--checkpoint-mib`` state dict
  into a new directory, fsync, close, then the directory renamed, on a
  regional (flat) bucket, as a checkpoint is published; seconds. With the
  defaults the rename is refused (ENOTSUP): the row says so.

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
    """The index a training job builds first (walk the tree, stat every file, as many datasets
    do), then one epoch; each on its own fresh mount, whose start-up is not counted."""
    with mount_process(endpoint, bench_dataplane.BUCKET, *extra) as mount:
        bench_dataplane.settle(mount.process.pid)
        started = time.perf_counter()
        files = 0
        for root, _, names in os.walk(mount.path):
            for name in names:
                os.stat(os.path.join(root, name))
                files += 1
        index_s = time.perf_counter() - started
    return {"index_s": index_s, "files": files,
            "samples_s": bench_dataplane.mount_loader(endpoint, extra, backing)}


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
            if err.errno != errno.ENOTSUP:  # a directory rename the bucket cannot make
                raise
            renamed = False
        return {"seconds": time.perf_counter() - started, "save_seconds": saved, "renamed": renamed}


def alternate(rounds: int, profile: str, run, describe) -> dict:
    """``run(extra, round_)`` with the defaults and with ``--profile``, alternating which goes first."""
    entry: dict = {"default": [], "profile": []}
    for round_ in range(rounds):
        for mode in ("default", "profile") if round_ % 2 == 0 else ("profile", "default"):
            entry[mode].append(run([] if mode == "default" else ["--profile", profile], round_))
        print(f"round {round_ + 1} {profile}: "
              + ", ".join(f"{mode} {describe(entry[mode][-1])}" for mode in ("default", "profile")), flush=True)
    return entry


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
    if "aiml-training" in args.only:
        with tempfile.TemporaryDirectory(prefix="rapidmount-bench-profiles-") as data_dir:
            backing = bench_dataplane.seed(data_dir, 4096, None, args.samples)[bench_dataplane.SAMPLES]
            with emulator_process("--latency", "2", data_dir=data_dir) as (endpoint, _):
                results["aiml-training"] = alternate(
                    args.rounds, "aiml-training", lambda extra, _: training(endpoint, extra, backing),
                    lambda run: f"index {run['index_s']:.2f} s, {run['samples_s']:.0f} samples/s")
    if "aiml-serving" in args.only:
        with tempfile.TemporaryDirectory(prefix="rapidmount-bench-profiles-") as data_dir:
            model = bench_page_stores.seed(data_dir, 4096, args.model_mib * MiB)[bench_page_stores.MODEL]
            size = sum(path.stat().st_size for path in model[:1])
            with emulator_process(data_dir=data_dir) as (endpoint, _):
                results["aiml-serving"] = alternate(
                    args.rounds, "aiml-serving", lambda extra, _: serving(endpoint, extra, size, model),
                    lambda run: f"{run['seconds']:.2f} s")
    if "aiml-checkpointing" in args.only:
        state = state_dict(args.checkpoint_mib)
        with emulator_process("--bucket", f"{FLAT_BUCKET}:flat") as (endpoint, _):
            names = iter(range(1 << 20))
            results["aiml-checkpointing"] = alternate(
                args.rounds, "aiml-checkpointing",
                lambda extra, _: checkpointing(endpoint, extra, state, next(names)),
                lambda run: f"{run['seconds']:.2f} s (renamed: {run['renamed']})")
    report(results)
    print(f"\nraw results: {save_results('profiles', results)}")
    return 0


def report(results: dict) -> None:
    spread = bench_dataplane.spread
    rows = []
    if "aiml-training" in results:
        entry = results["aiml-training"]
        rows += [["aiml-training", "walk + stat every file, seconds; then a DataLoader epoch, samples/s", mode,
                  f"{spread([run['index_s'] for run in entry[mode]], 2)} s; "
                  f"{spread([run['samples_s'] for run in entry[mode]])} samples/s"] for mode in ("default", "profile")]
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
