"""The weak-scaling model's command: multi-node efficiency per preset, from a measured step.

    python -m training.benchmarks.speed.scaling --step-json bench_step.json [--busbw-json allreduce.json]

The model and what it reads, field by field: training/costs/scaling.py.
- `--step-json`, from `python -m training bench step` (training/benchmarks/speed/step.py);
- `--busbw-json`, from `python -m training.benchmarks.speed.allreduce` (training/benchmarks/speed/allreduce.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.costs.scaling import PRESETS, StepProfile, predict, profile_from_step_json, with_measured_busbw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--step-json", type=Path, help="output of `python -m training bench step`")
    parser.add_argument("--step-time", type=float, help="seconds per step on one GPU")
    parser.add_argument("--params", type=int, default=44_000_000, help="trainable parameters (ViT-S + DINO head: ~44M)")
    parser.add_argument("--backward-fraction", type=float, default=0.55,
                        help="with --step-time: share of the step spent in backward")
    parser.add_argument("--busbw-json", type=Path,
                        help="allreduce benchmark output; its busbw_gbs replaces the figure of --preset "
                             "(across nodes when it was measured on more than one node, else inside one)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="only this instance type")
    parser.add_argument("--nodes", default="1,2,4,8,16", help="comma-separated node counts")
    parser.add_argument("--overlap", type=float, default=0.8, help="fraction of backward that can hide communication")
    args = parser.parse_args(argv)
    if args.step_json:
        profile = profile_from_step_json(json.loads(args.step_json.read_text()))
    elif args.step_time:
        profile = StepProfile(args.step_time, args.backward_fraction * args.step_time, args.params)
    else:
        parser.error("give --step-json or --step-time")
    presets = {args.preset: PRESETS[args.preset]} if args.preset else dict(PRESETS)
    if args.busbw_json:
        if not args.preset:
            parser.error("--busbw-json needs --preset (the instance type it was measured on)")
        presets[args.preset] = with_measured_busbw(presets[args.preset], json.loads(args.busbw_json.read_text()),
                                                   args.busbw_json.name)
    nodes = [int(n) for n in args.nodes.split(",") if n.strip()]
    json.dump(predict(profile, nodes, presets, args.overlap), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
