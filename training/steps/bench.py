"""bench: print benchmark figures as JSON.

    python -m training bench loader --config run.yaml [--batches 10 --workers 2]
    python -m training bench step --config run.yaml

`loader`: images/s of a straightforward scDINO-style loader (tifffile per image, float64,
per-sample torchvision transforms) against the packed loader with batched multi-crop, same images,
same worker count. `step`: training-step throughput (training/benchmarks/step.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["loader", "step"], help="which benchmark to run")
    parser.add_argument("--batches", type=int, default=10, help="timed batches (loader) or steps (step)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches or steps first")
    parser.add_argument("--workers", type=int, help="DataLoader workers (default: data.num_workers)")
    parser.add_argument("--images", type=int, default=2000,
                        help="synthetic images to generate when data.source is absent (loader)")
    parser.add_argument("--size", help="loader: global/local crop sides, e.g. 48/24 (native resolution)")
    parser.add_argument("--out", help="also write the JSON to this file")


def run(config, layout, args: argparse.Namespace) -> int:
    if args.what == "loader":
        from training.benchmarks.loader import run_loader_benchmark

        result = run_loader_benchmark(config, args)
    else:
        from training.benchmarks.step import run_step_benchmark

        result = run_step_benchmark(config, args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        out = Path(args.out)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(out)
    return 0
