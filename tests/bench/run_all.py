"""``make bench``: every benchmark, side by side with Google's official client.

Each benchmark prints its own table of figures and mount/official ratios;
raw results go to bench-results/. Pass --quick for a short smoke run.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (a smoke run)")
    args = parser.parse_args()
    runs = [
        ["bench_emulator.py", "--rounds", "3"] if not args.quick else ["bench_emulator.py", "--size-mib", "128",
                                                                        "--rounds", "1"],
        ["bench_mount_read.py"] if not args.quick else ["bench_mount_read.py", "--size-mib", "128", "--rounds", "1",
                                                        "--random-reads", "200", "--listed", "1000"],
        ["bench_streams.py"] if not args.quick else ["bench_streams.py", "--size-mib", "128", "--rounds", "1"],
        ["bench_dataplane.py"] if not args.quick else ["bench_dataplane.py", "--quick"],
        ["bench_mount_write.py"] if not args.quick else ["bench_mount_write.py", "--size-mib", "128", "--rounds", "1"],
        ["bench_observability.py"] if not args.quick else ["bench_observability.py", "--size-mib", "64", "--rounds",
                                                           "1", "--random-reads", "200"],
        ["bench_auth.py", "--size-mib", "256", "--files", "300"] if not args.quick else
        ["bench_auth.py", "--size-mib", "64", "--files", "50", "--rounds", "1"],
        ["bench_listing.py"] if not args.quick else ["bench_listing.py", "--quick"],
    ]
    runs.append(["bench_shards.py"] if not args.quick else ["bench_shards.py", "--rounds", "1", "--sets", "64x2,16x4",
                                                             "--sources", "official"])
    runs.append(["bench_fuse_layer.py"] if not args.quick else ["bench_fuse_layer.py", "--quick"])
    runs.append(["bench_small_files.py"] if not args.quick else ["bench_small_files.py", "--files", "1000",
                                                                 "--rounds", "1"])
    runs.append(["bench_compose.py"] if not args.quick else ["bench_compose.py", "--files", "500", "--rounds", "1"])
    if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("safetensors") is not None:
        runs.append(["bench_page_stores.py"] if not args.quick else ["bench_page_stores.py", "--size-mib", "128",
                                                                     "--model-mib", "128", "--rounds", "1"])
        runs.append(["bench_local_cache.py"] if not args.quick else ["bench_local_cache.py", "--files", "16",
                                                                      "--model-mib", "128", "--rounds", "1"])
        runs.append(["bench_profiles.py"] if not args.quick else ["bench_profiles.py", "--samples", "512",
                                                                  "--model-mib", "128", "--checkpoint-mib", "128",
                                                                  "--rounds", "1"])
    if importlib.util.find_spec("torch") is not None:
        runs.append(["bench_checkpoint.py"] if not args.quick else ["bench_checkpoint.py", "--size-mib", "128",
                                                                    "--rounds", "1"])
        runs.append(["bench_training_input.py"] if not args.quick else ["bench_training_input.py", "--files",
                                                                        "1000", "--rounds", "1"])
    else:
        print("torch is not installed: skipping the checkpoint benchmark (pip install torch==2.13.0)")
    failed = 0
    for script, *script_args in runs:
        print(f"\n# {script} {' '.join(script_args)}", flush=True)
        failed += subprocess.run([sys.executable, str(HERE / script), *script_args]).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
