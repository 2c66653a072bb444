"""summary: write <run>/results.json, the headline kNN figures, step times and bill, and print them.

    python -m training summary --config run.yaml [--jobs <run>/logs/jobs.txt] [--wall-seconds N]

`--jobs` names the "step jobid" lines `slurm/submit_pipeline.sh` printed, to add each job's run
time and the bill (GPU-hours or core-hours and cost, from Slurm's accounting, beside <run>/plan.json's
prediction); `--wall-seconds` records the wall time of the whole pipeline (`make demo`). The summary
ends the pipeline: with a bill, it also adds it to comparison.json and report.html, written before it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.config import Config
from training.rundir import RunLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=Path, help="file of 'step jobid' lines of the jobs just run")
    parser.add_argument("--wall-seconds", type=int, help="wall time of the whole pipeline, seconds")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    from training.results import add_bill_to_comparison, summary_text, write_summary

    summary = write_summary(layout, jobs_file=args.jobs, wall_seconds=args.wall_seconds)
    if args.jobs and summary.get("bill"):
        add_bill_to_comparison(layout)
        if layout.report.is_file():
            from training.report.html import rewrite_report

            rewrite_report(layout)
    print(summary_text(summary))
    return 0
