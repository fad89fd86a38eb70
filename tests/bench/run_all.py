"""``make bench``: every benchmark, side by side with Google's official client.

Each benchmark prints its own table of figures and mount/official ratios;
raw results go to bench-results/. A full run then puts the figures of the
workloads it knows how to read from those results into docs/benchmarks.json
(the other workloads keep their entries) and draws docs/benchmarks.png
(tests/bench/chart.py). Pass --quick for a short smoke run, which leaves the
docs alone.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS_FILE = REPO / "docs" / "benchmarks.json"
CHART_FILE = REPO / "docs" / "benchmarks.png"
sys.path.insert(0, str(REPO))

from tests.bench import chart  # noqa: E402
from tests.bench.common import percentile  # noqa: E402


def _median(runs: list, key: str | None = None) -> float:
    return statistics.median(run[key] if key else run for run in runs)


def _entry(name: str, mount: float, official: float, unit: str) -> dict:
    return {"name": name, "ratio": round(chart.speed_ratio(mount, official, unit), 2), "mount": round(mount, 3),
            "official": round(official, 3), "unit": unit}


def _fuse_layer(raw: dict) -> list[dict]:
    entries = []
    for workload, name in (("B1", "B1: one 512 MiB file, fresh mount"), ("W1", "W1: 1 GiB dd write + fsync")):
        runs = raw.get(workload, {})
        if runs.get("after") and runs.get("official"):
            entries.append(_entry(name, _median(runs["after"], "mb_s"), _median(runs["official"], "mb_s"), "MB/s"))
    return entries


def _dataplane(raw: dict) -> list[dict]:
    entries = []
    b2 = raw.get("B2", {})
    if b2.get("mount", {}).get("default workers") and b2.get("official"):
        entries.append(_entry("B2: four 256 MiB files at once", _median(b2["mount"]["default workers"], "mb_s"),
                              _median(b2["official"], "mb_s"), "MB/s"))
    b4 = raw.get("B4", {})
    if b4.get("mount_ms") and b4.get("official_ms"):
        # As bench_dataplane reports it: each round's p50, then their median.
        p50 = {key: statistics.median(percentile(run, 0.5) for run in b4[key]) for key in ("mount_ms", "official_ms")}
        entries.append(_entry("B4: random 4 KiB reads, p50 latency", p50["mount_ms"], p50["official_ms"], "ms"))
    b5 = raw.get("B5", {})
    if b5.get("mount") and b5.get("official"):
        entries.append(_entry("B5: DataLoader, shuffled 64 KiB samples, 2 ms", _median(b5["mount"]),
                              _median(b5["official"]), "samples/s"))
    return entries


def _shards(raw: dict) -> list[dict]:
    entries = []
    for run in raw.get("runs", []):
        summary = run["summary"]
        for shards in ("8 x 256 MiB", "64 x 16 MiB"):
            if summary["label"] == f"{shards}, written by the official client":
                entries.append(_entry(f"B9: shards, {shards} through one mount", summary["mount_file_mb_s_median"],
                                      summary["official_file_mb_s_median"], "MB/s"))
    return entries


def _local_cache(raw: dict) -> list[dict]:
    if not raw.get("official"):
        return []
    official = _median([run["epoch"] for run in raw["official"]], "mb_s")
    entries = []
    if raw.get("no cache"):
        entries.append(_entry("64 x 32 MiB files, 4 threads, no local cache", _median(raw["no cache"], "mb_s"),
                              official, "MB/s"))
    passthrough = raw.get("passthrough", [])
    if passthrough:
        for key, name in (("epoch2", "Local cache: epoch 2, passthrough"),
                          ("remount", "Local cache: epoch 2 after a remount")):
            entries.append(_entry(name, _median([run[key] for run in passthrough], "mb_s"), official, "MB/s"))
        entries.append(_entry("M1: 512 MiB model load from the local cache",
                              _median([run["model"] for run in passthrough], "seconds"),
                              _median([run["model"] for run in raw["official"]], "seconds"), "s"))
    return entries


def _mount_write(raw: dict) -> list[dict]:
    w4 = raw.get("w4", {})
    if not (w4.get("mount") and w4.get("official")):
        return []
    return [_entry("W4: four 256 MiB files written at once", _median(w4["mount"], "mb_s"),
                   _median(w4["official"], "mb_s"), "MB/s")]


#: The workloads of docs/benchmarks.json that a run updates: each benchmark's results file
#: (bench-results/NAME-*.json) and what reads it. The others (B3, small files, page-cache
#: stores, listing) keep the entries written by hand.
READERS: dict[str, Callable[[dict], list[dict]]] = {
    "fuse-layer": _fuse_layer, "dataplane": _dataplane, "shards": _shards, "local-cache": _local_cache,
    "mount-write": _mount_write,
}


def measured_since(started: float, results_dir: pathlib.Path = REPO / "bench-results") -> list[dict]:
    """Today's entries from the newest results file of each benchmark written since ``started``."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    today = datetime.date.today().isoformat()
    entries = []
    for name, read in READERS.items():
        files = [path for path in results_dir.glob(f"{name}-*.json") if path.stat().st_mtime >= started]
        if not files:
            continue
        newest = max(files, key=lambda path: path.stat().st_mtime)
        try:
            found = read(json.loads(newest.read_text()))
        except (KeyError, TypeError, ValueError, ZeroDivisionError, statistics.StatisticsError) as err:
            print(f"{newest.name}: figures not read ({err!r}); its entries stay as they were")
            continue
        entries += [{**entry, "date": today, "commit": commit} for entry in found]
    return entries


def record(started: float) -> None:
    """Update docs/benchmarks.json with this run's figures and draw docs/benchmarks.png."""
    measured = measured_since(started)
    results = chart.update(chart.load(RESULTS_FILE), measured)
    chart.save(results, RESULTS_FILE)
    chart.draw(results, CHART_FILE)
    print(f"\n{len(measured)} workloads updated in {os.path.relpath(RESULTS_FILE)}; chart: {os.path.relpath(CHART_FILE)}")


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
    started = time.time()
    for script, *script_args in runs:
        print(f"\n# {script} {' '.join(script_args)}", flush=True)
        failed += subprocess.run([sys.executable, str(HERE / script), *script_args]).returncode != 0
    if not args.quick:
        record(started)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
