"""summary: write <run>/results.json, the headline kNN figures and step times, and print them.

    python -m training summary --config run.yaml [--jobs <run>/logs/jobs.txt] [--wall-seconds N]

`--jobs` names the "step jobid" lines `slurm/submit_pipeline.sh` printed, to add each job's run
time from Slurm; `--wall-seconds` records the wall time of the whole pipeline (`make demo`).
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
    from training.rundir.summary import summary_text, write_summary

    summary = write_summary(layout, jobs_file=args.jobs, wall_seconds=args.wall_seconds)
    print(summary_text(summary))
    return 0
