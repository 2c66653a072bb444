"""results.json, the run summary `make demo` ends with: figures taken from knn.json as written."""

from __future__ import annotations

import json
import os
import stat

import pytest

from training.cli import main
from training.rundir import RunLayout


def knn_payload() -> dict:
    def entry(top1: dict, top2: dict, best: int) -> dict:
        return {"epoch": 3, "top1": top1, "top2": top2, "best_k": best}

    return {
        "ks": [5, 10], "seed": 0, "temperature": 0.1, "n_reference": 80, "n_query": 20, "class_names": ["a", "b"],
        "tags": {
            "final": entry({"5": 0.7, "10": 0.75}, {"5": 0.9, "10": 0.95}, 10),
            "epoch_0002": entry({"5": 0.6, "10": 0.55}, {"5": 0.8, "10": 0.8}, 5),
            "raw_pixels": entry({"5": 0.65, "10": 0.6}, {"5": 0.85, "10": 0.8}, 5),
            "random_init": entry({"5": 0.5, "10": 0.52}, {"5": 0.7, "10": 0.75}, 10),
        },
    }


def fake_scontrol(bin_dir, times: dict[str, tuple[str, str]], states: dict[str, str] | None = None) -> None:
    """An `scontrol show job -o ID` that prints the state (COMPLETED unless `states` says otherwise), start
    and end time of each known job, and no other source of Slurm's accounting."""
    states = states or {}
    cases = "\n".join(f'  {job}) echo "JobId={job} JobState={states.get(job, "COMPLETED")} StartTime={a} EndTime={b} '
                      'Other=x" ;;' for job, (a, b) in times.items())
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\ncase "$4" in\n{cases}\nesac\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    # A fake: the machine's real sacct would read the local cluster's job completion log, where these
    # ids may name other jobs. As on a cluster with neither accounting nor a completion log, it fails.
    sacct = bin_dir / "sacct"
    sacct.write_text('#!/bin/sh\necho "sacct: error: Slurm accounting storage is disabled" >&2\nexit 1\n')
    sacct.chmod(sacct.stat().st_mode | stat.S_IEXEC)


def test_summary_takes_each_headline_tag_at_its_best_k(tmp_path, monkeypatch, capsys):
    layout = RunLayout(tmp_path / "run")
    layout.knn.mkdir(parents=True)
    layout.knn_json.write_text(json.dumps(knn_payload()))
    layout.timings.write_text(json.dumps({"pretrain": 12.5, "knn": 0.5}))
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("pretrain 101\nknn 102\nplots 103\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # 103 still runs: scontrol gives it the end of its time limit as EndTime, which is no run time.
    fake_scontrol(bin_dir, {"101": ("2026-11-23T10:00:00", "2026-11-23T10:01:30"),
                            "102": ("2026-11-23T10:02:00", "Unknown"),
                            "103": ("2026-11-23T10:03:00", "2026-11-23T11:03:00")}, states={"103": "RUNNING"})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    assert main(["summary", "--set", f"run.output_dir={layout.root}", "--jobs", str(jobs),
                 "--wall-seconds", "321"]) == 0
    summary = json.loads(layout.results.read_text())
    assert set(summary["knn"]) == {"final", "raw_pixels", "random_init"}
    assert summary["knn"]["final"]["best_k"] == 10 and summary["knn"]["final"]["top1"] == 0.75
    assert summary["knn"]["final"]["top2"] == 0.95
    assert summary["knn"]["raw_pixels"]["top1"] == 0.65 and summary["knn"]["random_init"]["top1"] == 0.52
    assert summary["knn"]["random_init"]["label"] == "random init"
    assert (summary["n_reference"], summary["n_query"]) == (80, 20)
    assert summary["step_seconds"] == {"pretrain": 12.5, "knn": 0.5}
    assert summary["job_seconds"] == {"pretrain": 90}
    assert summary["demo_wall_seconds"] == 321
    out = capsys.readouterr().out
    assert "trained" in out and "0.750" in out and "raw pixels" in out


def test_a_rerun_without_new_jobs_keeps_the_previous_times(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.knn.mkdir(parents=True)
    layout.knn_json.write_text(json.dumps(knn_payload()))
    layout.results.write_text(json.dumps({"job_seconds": {"pretrain": 90}, "demo_wall_seconds": 321}))
    assert main(["summary", "--set", f"run.output_dir={layout.root}"]) == 0
    summary = json.loads(layout.results.read_text())
    assert summary["job_seconds"] == {"pretrain": 90} and summary["demo_wall_seconds"] == 321


def test_summary_without_knn_results_names_the_step(tmp_path, capsys):
    assert main(["summary", "--set", f"run.output_dir={tmp_path}"]) == 2
    assert "python -m training knn" in capsys.readouterr().err


@pytest.mark.parametrize("damaged, remedy", [
    ("timings", "rerun any pipeline step (`python -m training <step>`), which moves it aside and starts a new one"),
    ("results", "delete it and rerun the step that writes it"),
])
def test_a_damaged_merged_file_names_the_fix(tmp_path, capsys, damaged, remedy):
    """timings.json and results.json are read back by the steps that write them: results.json is to
    be deleted (a rerun alone fails again); every pipeline step sets a damaged timings.json aside
    (tests/training/rundir/test_damaged_files.py), so any of them mends it."""
    layout = RunLayout(tmp_path / "run")
    layout.knn.mkdir(parents=True)
    layout.knn_json.write_text(json.dumps(knn_payload()))
    getattr(layout, damaged).write_text('{"pretrain": 12')
    assert main(["summary", "--set", f"run.output_dir={layout.root}"]) == 2
    err = capsys.readouterr().err
    assert f"{getattr(layout, damaged)} is not valid JSON" in err
    assert err.rstrip().endswith(f": {remedy}")
