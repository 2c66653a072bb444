"""Command line: `python -m training <step> --config run.yaml [--set section.key=value ...]`.

Steps, in pipeline order: synth-data, prepare, mean-std, pretrain, features, labels, knn, linear,
plots, report. `bench step|loader` prints benchmark figures as JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from training.config import Config, dump_config, load_config
from training.errors import UserError
from training.layout import RunLayout

log = logging.getLogger(__name__)

# step name -> module under training.steps (imported lazily: torch is slow to import)
STEPS: dict[str, str] = {
    "synth-data": "synth_data",
    "prepare": "prepare",
    "mean-std": "mean_std",
    "pretrain": "pretrain",
    "features": "features",
    "labels": "labels",
    "knn": "knn",
    "linear": "linear",
    "plots": "plots",
    "report": "report",
    "bench": "bench",
    "upload-data": "upload_data",
}


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
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def record_timing(layout: RunLayout, step: str, seconds: float) -> None:
    """Merge this step's wall time into <run>/timings.json (rank 0 only)."""
    timings = json.loads(layout.timings.read_text()) if layout.timings.exists() else {}
    timings[step] = round(seconds, 3)
    layout.root.mkdir(parents=True, exist_ok=True)
    tmp = layout.timings.with_suffix(".tmp")
    tmp.write_text(json.dumps(timings, indent=2))
    tmp.replace(layout.timings)


def run_step(args: argparse.Namespace) -> int:
    config: Config = load_config(args.config, args.overrides)
    layout = RunLayout.from_config(config)
    if is_rank_zero() and args.step not in ("synth-data", "bench", "upload-data"):
        layout.root.mkdir(parents=True, exist_ok=True)
        dump_config(config, layout.config)
    start = time.perf_counter()
    result = args.module.run(config, args)
    if is_rank_zero() and args.step not in ("bench", "upload-data"):
        record_timing(layout, args.step, time.perf_counter() - start)
    return int(result or 0)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    args = build_parser().parse_args(argv)
    try:
        return run_step(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
