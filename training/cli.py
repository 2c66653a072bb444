"""Command line: `python -m training <step> --config run.yaml [--set section.key=value ...]`.

Steps, in pipeline order: synth-data, prepare (or ingest: cells cut out of fields of view),
mean-std, pretrain, features, labels, knn, linear, export, plots, report, summary; `compare` after one
chain per channel combination; `chain` the Slurm jobs of them all for a config; `profile` embeds a new
screen with a trained model (ingest, features, export and the metrics). `bench step|loader`
prints benchmark figures as JSON; `plan` a run's time and cost per preset before launch; `paths`
prints where a run's files are (for shell scripts);
`upload-data` copies images to the data bucket; `remote` submits, watches, fetches and cancels a run on
the cluster from a laptop.

Step modules import only the standard library and the configuration at module level (torch and the
libraries load inside `run`), so `--help` and the light steps start quickly.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

from training.config import Config, dump_config, load_config
from training.errors import PathTakenError, UserError
from training.logs import configure_logging, launcher_rank
from training.rundir import RunLayout
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)

# step name -> module under training.steps
STEPS: dict[str, str] = {
    "synth-data": "synth_data",
    "prepare": "prepare",
    "ingest": "ingest",
    "mean-std": "mean_std",
    "pretrain": "pretrain",
    "features": "features",
    "labels": "labels",
    "knn": "knn",
    "export": "export",
    "linear": "linear",
    "plots": "plots",
    "report": "report",
    "summary": "summary",
    "compare": "compare",
    "profile": "profile",
    "bench": "bench",
    "plan": "plan",
    "upload-data": "upload_data",
    "paths": "paths",
    "chain": "chain",
    "remote": "remote",
}
UTILITIES = ("synth-data", "bench", "plan", "upload-data", "paths", "summary", "chain", "remote")
"""Commands that are not pipeline steps: they write no config.yaml and no timing into a run."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True, metavar="STEP")
    for name, module_name in STEPS.items():
        module = importlib.import_module(f"training.steps.{module_name}")
        step_parser = sub.add_parser(name, help=(module.__doc__ or name).strip().splitlines()[0])
        step_parser.add_argument("--config", type=Path, help="run YAML (defaults apply when omitted)")
        step_parser.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
            help="override a config value, e.g. --set optim.epochs=2 (repeatable)",
        )
        if hasattr(module, "add_arguments"):
            module.add_arguments(step_parser)
        step_parser.set_defaults(module=module)
    return parser


def is_rank_zero() -> bool:
    return launcher_rank() == 0


def record_timing(layout: RunLayout, step: str, seconds: float) -> None:
    """Merge this step's wall time into the run's timings (rank 0 only)."""
    from training.rundir.artifacts import timings_to_update

    timings = timings_to_update(layout)
    timings[step] = round(seconds, 3)
    write_json_atomic(layout.timings, timings, indent=2)


def run_step(args: argparse.Namespace) -> int:
    try:
        return _run_step(args)
    except PathTakenError as exc:  # the one place that knows which step to run again
        raise exc.for_step(args.step) from None


def _run_step(args: argparse.Namespace) -> int:
    if getattr(args.module, "READS_ITS_OWN_CONFIG", False):  # `chain`: a bad config is its own one-line error
        return int(args.module.run(args) or 0)
    config: Config = load_config(args.config, args.overrides)
    layout = RunLayout.from_config(config)
    pipeline_step = args.step not in UTILITIES and not getattr(args, "verify", False)  # a check writes nothing
    if is_rank_zero() and pipeline_step:
        layout.root.mkdir(parents=True, exist_ok=True)
        dump_config(config, layout.config)
    start = time.perf_counter()
    result = args.module.run(config, layout, args)
    if is_rank_zero() and pipeline_step:
        record_timing(layout, args.step, time.perf_counter() - start)
    return int(result or 0)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        configure_logging()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        return run_step(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
