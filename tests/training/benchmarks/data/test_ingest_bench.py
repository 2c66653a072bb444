"""`bench ingest`: every object of the benchmark's fields is cut or counted as skipped, in each field
count's own process, and the figures it prints are the ones the docs quote (crops per CPU-second,
peak RSS per field count)."""

from __future__ import annotations

import json

import numpy as np

from training.benchmarks.data.ingest_rate import SIDE, draw_labels, run_ingest_benchmark
from training.cli import main


def test_the_benchmark_fields_hold_the_cells_it_asks_for():
    labels = draw_labels(np.random.default_rng(0), 30)
    assert labels.shape == (SIDE, SIDE) and sorted(np.unique(labels).tolist()) == list(range(31))


def test_every_object_is_cut_or_counted_at_both_field_counts(capsys, tmp_path):
    result = run_ingest_benchmark([1, 3], cells=16, crop=48)
    assert [run["fields"] for run in result["runs"]] == [1, 3] and set(result["peak_rss_mb"]) == {"1", "3"}
    for run in result["runs"]:
        assert run["crops"] + sum(run["skipped"].values()) == 16 * run["fields"] and run["crops"] > 0
        # cpu_s is printed to the millisecond, crops_per_core_s from the unrounded CPU time: at a few
        # hundredths of a second that rounding alone moves the ratio by a few per cent.
        fastest = run["crops"] / max(run["cpu_s"] - 0.0005, 1e-9)
        slowest = run["crops"] / (run["cpu_s"] + 0.0005)
        assert slowest * 0.999 <= run["crops_per_core_s"] <= fastest * 1.001
    assert result["crops_per_core_s"] == result["runs"][-1]["crops_per_core_s"]
    assert main(["bench", "ingest", "--fields", "0"]) == 2
    assert "--fields '0'" in capsys.readouterr().err
    json.dumps(result)
