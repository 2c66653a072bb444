"""The run summary, <run>/results.json: the headline kNN figures, the time of each step and the bill.

    python -m training summary --config run.yaml [--jobs logs/jobs.txt] [--wall-seconds N]

Written by `make demo` at the end of the pipeline, and by anyone who wants one file to compare runs:
kNN top-1/top-2 at the best k (and per k) of the trained model and both baselines, each step's wall
time inside Python (timings.json) and, given the Slurm job ids, the bill: each job's run time,
GPU-hours (core-hours locally) and cost from Slurm's accounting of those jobs, beside the planner's
prediction (training/costs/bill.py). The summary ends the pipeline: it also puts the bill into
comparison.json (here) and report.html (training/report/, by the step), which were written before it.
It reads the run directory (training/rundir/) and writes one file of it; the comparison
(training/eval/compare.py) and the report read its headline and bill.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.costs.bill import build_bill, combination_bills
from training.rundir import tags
from training.rundir.artifacts import load_knn, read_optional_json, read_timings
from training.rundir.layout import RunLayout
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED"}
"""States of a job still to end: its time so far is not its run time."""


def knn_headline(knn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per headline tag present in knn.json: its label, best k and top-1/top-2 there and per k; where
    measured, the same of the not-same-batch kNN ("not_same_batch") and the mAP ("map": the mean
    over treatments and the fraction whose mAP is significant; "map_consistency" the same over groups)."""
    models = {}
    for tag in dict.fromkeys((*tags.HEADLINE, *tags.BASELINES)):  # the CellProfiler baseline where measured
        entry = knn["tags"].get(tag)
        if entry is None:
            continue
        k = str(entry["best_k"])
        models[tag] = {"label": tags.label(tag), "best_k": entry["best_k"], "top1": entry["top1"][k],
                       "top2": entry["top2"][k], "top1_by_k": entry["top1"], "top2_by_k": entry["top2"]}
        other = entry.get("not_same_batch")
        if other is not None:
            k = str(other["best_k"])
            models[tag]["not_same_batch"] = {"best_k": other["best_k"], "top1": other["top1"][k],
                                             "top2": other["top2"][k]}
        for part in ("map", "map_consistency"):
            if entry.get(part) is not None:
                models[tag][part] = {key: entry[part][key] for key in
                                     ("mean_map", "fraction_significant", "n_significant", "n_treatments")}
    return models


def parse_jobs(text: str) -> list[tuple[str, str]]:
    """(step, job id) per line of `slurm/submit_pipeline.sh`'s output ("step jobid")."""
    return [(parts[0], parts[1]) for parts in (line.split() for line in text.splitlines()) if len(parts) >= 2]


def job_seconds(bill: dict[str, Any]) -> dict[str, int]:
    """Each finished job's run time by step, from the bill's jobs: whichever of Slurm's sources still
    knew them (accounting, the job completion log, the controller, which forgets a job MinJobAge after
    its end, long before a slow chain ends). An array's step takes its longest task (accounting lists every
    task; the local job completion log only the one that keeps the array's id)."""
    seconds: dict[str, int] = {}
    for line in bill["jobs"]:
        if line["state"] not in LIVE_STATES:
            seconds[line["step"]] = max(seconds.get(line["step"], 0), line["seconds"])
    return seconds


def build_summary(layout: RunLayout, *, jobs: dict[str, int] | None = None,
                  wall_seconds: int | None = None, bill: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results.json payload; without new job times, wall time or bill, the previous summary's are kept."""
    previous = read_optional_json(layout.results) or {}
    knn = load_knn(layout)
    return {
        "knn": knn_headline(knn), "n_reference": knn["n_reference"], "n_query": knn["n_query"],
        "step_seconds": read_timings(layout),
        "job_seconds": jobs if jobs is not None else previous.get("job_seconds", {}),
        "demo_wall_seconds": wall_seconds if wall_seconds is not None else previous.get("demo_wall_seconds"),
        "bill": bill if bill is not None else previous.get("bill"),
        "report": str(layout.report.resolve()),
    }


def summary_text(summary: dict[str, Any]) -> str:
    """The kNN table and the step times, as printed at the end of `make demo`."""
    lines = [f"{'features':<18} {'k':>4} {'top-1':>8} {'top-2':>8}{screen_header(summary['knn'])}"]
    for entry in summary["knn"].values():
        lines.append(f"{entry['label']:<18} {entry['best_k']:>4} {entry['top1']:>8.3f} {entry['top2']:>8.3f}"
                     f"{screen_cells(entry, summary['knn'])}")
    lines += ["", "step times, s (in Python / as a Slurm job):"]
    for step, value in summary["step_seconds"].items():
        job = summary["job_seconds"].get(step)
        lines.append(f"  {step:<12} {value:>7.1f} / {'-' if job is None else job}")
    return "\n".join(lines + bill_lines(summary.get("bill")))


def screen_header(models: dict[str, Any]) -> str:
    """The not-same-batch and mAP columns' headers, where the run measured them."""
    batches = any("not_same_batch" in m for m in models.values())
    retrieval = any("map" in m for m in models.values())
    return (f" {'not-same-batch top-1':>21}" if batches else "") + (f" {'mAP':>6} {'q<0.05':>7}" if retrieval else "")


def screen_cells(entry: dict[str, Any], models: dict[str, Any]) -> str:
    cells = ""
    if any("not_same_batch" in m for m in models.values()):
        other = entry.get("not_same_batch")
        cells += f" {'-' if other is None else format(other['top1'], '.3f') + ' (k=' + str(other['best_k']) + ')':>21}"
    if any("map" in m for m in models.values()):
        found = entry.get("map") or {}
        value = found.get("mean_map")
        cells += f" {'-' if value is None else format(value, '.3f'):>6}"
        cells += f" {'-' if value is None else str(found['n_significant']) + '/' + str(found['n_treatments']):>7}"
    return cells


def bill_lines(bill: dict[str, Any] | None) -> list[str]:
    """The bill's totals and the prediction beside them, as printed at the end of `make demo`."""
    if not bill:
        return []
    unit = {"gpu_h": "GPU-hours", "core_h": "core-hours (as Slurm allocated them)"}.get(bill["unit"], bill["unit"])
    lines = ["", f"bill ({bill['source']}): {unit}"]
    for name in ("pretrain", "total"):
        part = bill[name]
        cost = "no price" if part["cost_usd"] is None else f"${part['cost_usd']:,.2f}"
        lines.append(f"  {name:<12} {part['unit_h']:>10.4f} h over {part['seconds']} s, {cost}")
    predicted = bill.get("predicted")
    if predicted and "pretrain_s" in predicted:
        lines.append(f"  predicted pretraining: {predicted['pretrain_s']:.1f} s, {predicted['unit_h']:.4f} "
                     f"{predicted['unit']}, bottleneck {predicted['bottleneck']} (the saved plan)")
    return lines


def write_summary(layout: RunLayout, *, jobs_file: Path | None = None, wall_seconds: int | None = None) -> dict:
    """Build and write results.json; `jobs_file` lists "step jobid" lines of the jobs just run."""
    listed = parse_jobs(jobs_file.read_text()) if jobs_file and jobs_file.is_file() else None
    bill = build_bill(listed, plan=read_optional_json(layout.plan)) if listed else None
    jobs = job_seconds(bill) if bill else ({} if listed is not None else None)
    summary = build_summary(layout, jobs=jobs, wall_seconds=wall_seconds, bill=bill)
    write_json_atomic(layout.results, summary, indent=2)
    log.info("wrote %s", layout.results)
    return summary


def comparison_bill(layout: RunLayout, combinations: list[str]) -> dict[str, Any] | None:
    """The bill of comparison.json, from the run's results.json (written by `summary`): None before it."""
    results = read_optional_json(layout.results) or {}
    return combination_bills(results.get("bill"), list(combinations))


def add_bill_to_comparison(layout: RunLayout) -> None:
    """The bill into comparison.json (its "bill"), where the run has one."""
    comparison = read_optional_json(layout.comparison_json)
    if comparison is not None:
        bill = comparison_bill(layout, comparison["combinations"])
        write_json_atomic(layout.comparison_json, {**comparison, "bill": bill}, indent=2)
        log.info("added the bill to %s", layout.comparison_json)
