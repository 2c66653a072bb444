"""The bill after a run: Slurm's accounting (sacct, the job completion log or scontrol, whichever
answers first; fakes on PATH here, the real local cluster in tests/slurm/test_plan_accuracy.py),
node shares x GPUs x price, the prediction beside it, and where it lands: results.json,
comparison.json, report.html."""

from __future__ import annotations

import json
import os
import stat

import pytest

from training.cli import main
from training.costs.bill import build_bill, combination_bills
from training.rundir import RunLayout

SACCT_LINES = {
    "201": "201|scdino-pretrain|gpu-p4d24xl|2|192|3600|COMPLETED",
    "202": "202|scdino-features|gpu-g4dn12xl|1|12|3600|COMPLETED",
    "203": "203|scdino-pretrain-01|gpu-g4dn12xl|1|48|1800|COMPLETED",
    "204": "204|scdino-pretrain-adaptive-bag_of_channels|gpu-g4dn12xl|1|48|900|COMPLETED",
    "205": "205|scdino-knn-adaptive-bag_of_channels-01|gpu-g4dn12xl|1|12|360|COMPLETED",
    # an array's tasks, as accounting names them, and a job whose id only starts like the array's
    "206_0": "206_0|scdino-prepare-parts|gpu-g4dn12xl|1|48|600|COMPLETED",
    "206_1": "206_1|scdino-prepare-parts|gpu-g4dn12xl|1|48|900|COMPLETED",
    "2060": "2060|scdino-other|gpu-g4dn12xl|1|48|60|COMPLETED",
}


def fake_slurm(tmp_path, monkeypatch, *, accounting: bool, completion: bool, cluster: str = "hpc") -> None:
    """`sacct` that answers with accounting (-X) and/or the job completion log (--completion), and an
    `scontrol` that knows the cluster's name and job 201."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    records = tmp_path / "sacct.txt"
    records.write_text("\n".join(SACCT_LINES.values()) + "\n")
    answer = f'cat "{records}"'
    refuse = 'echo "Slurm accounting storage is disabled" >&2; exit 1'
    sacct = bin_dir / "sacct"
    sacct.write_text(f"""#!/bin/sh
case "$1" in
  -X) {answer if accounting else refuse} ;;
  --completion) {answer if completion else refuse} ;;
esac
""")
    job = ("JobId=201 JobState=COMPLETED Partition=gpu-p4d24xl NumNodes=2 NumCPUs=192 "
           "StartTime=2026-11-24T10:00:00 EndTime=2026-11-24T11:00:00")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"""#!/bin/sh
case "$2 $4" in
  "config "*) echo "ClusterName             = {cluster}" ;;
  "job 201") echo "{job}" ;;
esac
""")
    for script in (sacct, scontrol):
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AWS_REGION", "us-east-1")


JOBS = [("pretrain", "201"), ("features", "202")]


def test_accounting_gives_gpu_hours_and_cost_per_node_share(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, accounting=True, completion=False)
    bill = build_bill(JOBS)
    assert bill["source"] == "sacct" and bill["cluster"] == "aws" and bill["unit"] == "gpu_h"
    pretrain, features = bill["jobs"]
    assert (pretrain["preset"], pretrain["node_h"], pretrain["unit_h"]) == ("p4d.24xlarge", 2.0, 16.0)
    assert pretrain["cost_usd"] == pytest.approx(2 * 21.957642, abs=1e-3)
    # 12 of a g4dn.12xlarge's 48 vCPUs for an hour: a quarter of the node, one of its four GPUs
    assert (features["node_h"], features["unit_h"], features["cost_usd"]) == (0.25, 1.0, pytest.approx(0.978))
    assert bill["pretrain"]["cost_usd"] == pytest.approx(43.92, abs=0.01)
    assert bill["total"]["cost_usd"] == pytest.approx(43.92 + 0.98, abs=0.01)
    assert bill["total"]["unit_h"] == 17.0


def test_an_array_s_tasks_are_billed_to_its_step(tmp_path, monkeypatch):
    """`sacct -X -j 206` lists an array's tasks as 206_0, 206_1: each is a line of the array's step."""
    fake_slurm(tmp_path, monkeypatch, accounting=True, completion=False)
    bill = build_bill([("prepare-parts", "206")])
    assert [(j["step"], j["job"], j["seconds"]) for j in bill["jobs"]] == [("prepare-parts", "206_0", 600),
                                                                         ("prepare-parts", "206_1", 900)]
    assert bill["total"]["seconds"] == 1500


def test_without_accounting_the_job_completion_log_then_scontrol_answer(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, accounting=False, completion=True)
    assert build_bill(JOBS)["source"] == "sacct --completion (job completion log)"
    fake_slurm(tmp_path, monkeypatch, accounting=False, completion=False)
    bill = build_bill(JOBS)
    assert bill["source"] == "scontrol show job" and [j["job"] for j in bill["jobs"]] == ["201"]
    assert bill["jobs"][0]["seconds"] == 3600 and bill["jobs"][0]["unit_h"] == 16.0


def test_the_local_cluster_bills_allocated_core_hours_without_a_price(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, accounting=False, completion=True, cluster="local")
    bill = build_bill(JOBS)
    assert (bill["cluster"], bill["unit"], bill["region"]) == ("local", "core_h", None)
    assert bill["jobs"][0]["unit_h"] == 192.0 and bill["jobs"][0]["cost_usd"] is None
    assert bill["total"]["cost_usd"] is None and "no price" in bill["note"]


def test_an_unknown_region_leaves_the_cost_empty(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, accounting=True, completion=False)
    bill = build_bill(JOBS, where="ap-south-2")
    assert bill["jobs"][0]["unit_h"] == 16.0 and bill["total"]["cost_usd"] is None


def test_the_prediction_for_the_preset_and_nodes_pretraining_ran_on_sits_beside(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, accounting=True, completion=False)
    row = {"preset": "p4d.24xlarge", "nodes": 2, "wall_h": 0.9, "gpu_h": 14.4, "unit": "gpu_h", "cost_usd": 39.5,
           "bottleneck": "gpu step", "pretrain": {"pretrain_s": 3240.0}}
    bill = build_bill(JOBS, plan={"rows": [{**row, "nodes": 1}, row]})
    assert bill["predicted"] == {"preset": "p4d.24xlarge", "nodes": 2, "pretrain_s": 3240.0, "wall_h": 0.9,
                                 "unit_h": 14.4, "unit": "gpu_h", "cost_usd": 39.5, "bottleneck": "gpu step"}
    assert "no row for p4d.24xlarge on 2" in build_bill(JOBS, plan={"rows": [{**row, "nodes": 4}]})["predicted"]["note"]


def test_comparison_splits_the_bill_by_combination_and_channel_adaptive_model(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, accounting=True, completion=False)
    bill = build_bill([("pretrain:01", "203"), ("pretrain:adaptive-bag_of_channels", "204"),
                       ("knn:adaptive-bag_of_channels-01", "205"), ("features", "202")])
    split = combination_bills(bill, ["01", "2"])
    assert split["per_combination"]["01"]["unit_h"] == 2.0 and split["per_combination"]["2"]["seconds"] == 0
    assert list(split["channel_adaptive"]) == ["bag_of_channels"], "per kind, its pretraining and its evaluations"
    assert split["channel_adaptive"]["bag_of_channels"]["seconds"] == 900 + 360
    assert split["total"] == bill["total"]


KNN = {"ks": [5], "seed": 0, "temperature": 0.1, "n_reference": 8, "n_query": 2, "class_names": ["a", "b"],
       "tags": {"final": {"epoch": 1, "top1": {"5": 0.5}, "top2": {"5": 0.9}, "best_k": 5}}}


def test_summary_puts_the_bill_into_results_comparison_and_report(tmp_path, monkeypatch, capsys):
    fake_slurm(tmp_path, monkeypatch, accounting=True, completion=False)
    layout = RunLayout(tmp_path / "run")
    layout.knn.mkdir(parents=True)
    layout.knn_json.write_text(json.dumps(KNN))
    layout.config.write_text("run:\n  name: billed\n")
    layout.comparison_json.write_text(json.dumps({"combinations": ["01"], "models": {}, "bill": None}))
    layout.plan.write_text(json.dumps({"rows": [{
        "preset": "p4d.24xlarge", "nodes": 2, "wall_h": 0.9, "gpu_h": 14.4, "unit": "gpu_h", "cost_usd": 39.5,
        "bottleneck": "gpu step", "pretrain": {"pretrain_s": 3240.0}}]}))
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("pretrain 201\nfeatures 202\n")
    assert main(["summary", "--set", f"run.output_dir={layout.root}", "--jobs", str(jobs)]) == 0
    bill = json.loads(layout.results.read_text())["bill"]
    assert bill["total"]["unit_h"] == 17.0 and bill["predicted"]["pretrain_s"] == 3240.0
    comparison = json.loads(layout.comparison_json.read_text())
    assert comparison["bill"]["total"] == bill["total"] and comparison["bill"]["per_combination"]["01"]["seconds"] == 0
    assert not layout.report.exists()  # a report is rewritten only where the pipeline wrote one
    layout.comparison_json.unlink()
    layout.report.write_text("<html>before the summary</html>")
    assert main(["summary", "--set", f"run.output_dir={layout.root}", "--jobs", str(jobs)]) == 0
    report = layout.report.read_text()
    assert "scDINO run billed" in report and "<h2>Cost</h2>" in report
    assert "$43.92" in report and "3240.0" in report and "p4d.24xlarge" in report
    out = capsys.readouterr().out
    assert "bill (sacct): GPU-hours" in out and "predicted pretraining: 3240.0 s" in out


def test_a_run_without_a_bill_says_how_to_get_one(tmp_path):
    from training.report.html import bill_section

    (section,) = bill_section(RunLayout(tmp_path / "run"))[1:]
    assert "summary --jobs" in section
