"""The benchmarks' chart: drawn from a results file, one labelled bar per workload, and a run's
figures merged into the file by workload name."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.bench import chart

RESULTS = {"workloads": [
    {"name": "B1: one large file", "ratio": 1.05, "mount": 1184, "official": 1123, "unit": "MB/s",
     "date": "2026-12-06", "commit": "bf97325", "command": "tests/bench/bench_fuse_layer.py --only B1"},
    {"name": "B4: random reads, p50", "ratio": 0.89, "mount": 1.131, "official": 1.010, "unit": "ms",
     "date": "2026-11-29", "commit": "312ab65"},
]}


def test_the_chart_is_a_png_with_a_labelled_bar_per_workload(tmp_path: pathlib.Path) -> None:
    source, png = tmp_path / "results.json", tmp_path / "chart.png"
    source.write_text(json.dumps(RESULTS))
    assert chart.main([str(source), str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    figure = chart.draw(RESULTS, png)
    [axes] = figure.axes
    assert [label.get_text() for label in axes.get_yticklabels()] == [entry["name"] for entry in RESULTS["workloads"]]
    assert [bar.get_width() for bar in axes.patches] == [1.05, 0.89]
    assert [line.get_xdata()[0] for line in axes.lines] == [1.0]  # the official client's mark
    assert {text.get_text() for text in axes.texts} == {"1.05x  (2026-12-06)", "0.89x  (2026-11-29)"}


def test_a_chart_of_no_workloads_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        chart.draw({"workloads": []}, tmp_path / "chart.png")


def test_the_ratio_is_the_mounts_speed_whatever_the_unit() -> None:
    assert chart.speed_ratio(300, 150, "MB/s") == 2.0
    assert chart.speed_ratio(0.5, 1.0, "s") == 2.0


def test_a_runs_figures_replace_their_workloads_and_keep_the_rest() -> None:
    measured = [{"name": "B1: one large file", "ratio": 1.1, "mount": 1200, "official": 1090, "unit": "MB/s",
                 "date": "2026-12-07", "commit": "abc1234"},
                {"name": "W9: new", "ratio": 1.0, "mount": 1, "official": 1, "unit": "MB/s",
                 "date": "2026-12-07", "commit": "abc1234"}]
    updated = chart.update(RESULTS, measured)
    assert [entry["name"] for entry in updated["workloads"]] == ["B1: one large file", "B4: random reads, p50", "W9: new"]
    first = updated["workloads"][0]
    assert (first["ratio"], first["date"], first["command"]) == (1.1, "2026-12-07", RESULTS["workloads"][0]["command"])
    assert updated["workloads"][1] == RESULTS["workloads"][1]
