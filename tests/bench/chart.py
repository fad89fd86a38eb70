"""The benchmarks' results file and its chart: each workload's speed against Google's official client.

The results file (``docs/benchmarks.json``) holds one entry per workload: its ``name``, the
mount's and the official client's figures with their ``unit``, ``ratio`` (the mount's speed over
the official client's: for rates mount/official, for times and latencies official/mount, so
above 1.0 the mount is faster either way), and the ``date`` and ``commit`` they were measured at.

    python tests/bench/chart.py docs/benchmarks.json docs/benchmarks.png
"""

from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")  # files only, never a display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

#: Units of figures where less is faster: their ratio is official / mount.
TIME_UNITS = {"s", "ms"}


def speed_ratio(mount: float, official: float, unit: str) -> float:
    """The mount's speed over the official client's, whatever the unit."""
    return official / mount if unit in TIME_UNITS else mount / official


def load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"workloads": []}


def save(results: dict, path: pathlib.Path) -> None:
    path.write_text(json.dumps(results, indent=2) + "\n")


def update(results: dict, measured: list[dict]) -> dict:
    """``results`` with each measured workload's figures put into its entry, found by name (what the
    run did not measure, such as the entry's command, stays); new names go last, and workloads
    this run did not measure keep their entries."""
    by_name = {entry["name"]: entry for entry in measured}
    workloads = [{**entry, **by_name.pop(entry["name"], {})} for entry in results.get("workloads", [])]
    return {**results, "workloads": workloads + list(by_name.values())}


def draw(results: dict, path: pathlib.Path) -> Figure:
    """One horizontal bar per workload, its ratio to the official client, 1.0 marked; saved as PNG."""
    workloads = results["workloads"]
    if not workloads:
        raise ValueError("no workloads to draw")
    names = [entry["name"] for entry in workloads]
    ratios = [float(entry["ratio"]) for entry in workloads]
    figure, axes = plt.subplots(figsize=(9, 1.2 + 0.38 * len(workloads)))
    rows = range(len(workloads))
    colours = ["#2f7d32" if ratio >= 1.0 else "#c0392b" for ratio in ratios]
    axes.barh(rows, ratios, color=colours, height=0.65)
    axes.axvline(1.0, color="black", linewidth=1, linestyle="--", zorder=0)
    axes.set_yticks(list(rows), labels=names)
    axes.invert_yaxis()  # the file's first workload on top
    for row, (ratio, entry) in enumerate(zip(ratios, workloads)):
        axes.text(ratio + 0.03, row, f"{ratio:.2f}x  ({entry['date']})", va="center", fontsize=8,
                  bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    axes.set_xlim(0, max(ratios + [1.0]) * 1.3)
    axes.set_xlabel("the mount's speed / the official client's (1.0: as fast)")
    axes.set_title("rapidmount against Google's official client")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=110)
    plt.close(figure)
    return figure


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: chart.py RESULTS.json CHART.png", file=sys.stderr)
        return 2
    draw(load(pathlib.Path(argv[0])), pathlib.Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
