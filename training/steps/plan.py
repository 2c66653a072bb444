"""plan: a run's time and cost before launch, per preset and node count, and its bottleneck.

    python -m training plan --config run.yaml [--images N] [--wells W] [--preset P ...] [--nodes K[,K...]]
        [--step-json F] [--loader-json F] [--busbw-json F] [--json OUT] [--save] [--live-prices] [-c key=value ...]

Reads the deployment settings as `cdk` does (cdk.json's context, `-c settings=file.yaml`, then
`-c key=value`) for the enabled presets, the region, `cluster.max_nodes` and the FSx capacity and
throughput; `--preset all` plans every preset of the instance table, `--preset local` the local
Slurm cluster (CPU core-hours, no price). The dataset's size comes from the run's packed dataset,
or `--images`. Measured JSONs (`bench step --out`, `bench loader`, the all-reduce benchmark) replace
published figures; each row says which figures it used. The model: training/planning/model.py.
`--save` keeps the rows in the run directory, where `summary` puts the row of the preset and node
count pretraining ran on beside the run's bill (training/costs/bill.py). Beside the run's cost it prints
what the deployment bills a month while idle and what `cdk destroy --all` keeps billing
(training/planning/standing.py), in the text and under "standing" in the JSON; and the time, storage and
memory of the steps after `features` (export, per-well profiles, mAP) for the dataset's cells in `--wells`
wells, from measured figures (training/planning/profile_steps.py), under "profile_steps".
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--images", type=int, help="images in the dataset (default: the run's packed dataset)")
    parser.add_argument("--image-bytes", type=float,
                        help="with --images: stored bytes per image (default: 16-bit, 48 x 48 px per channel)")
    parser.add_argument("--wells", type=int, help="wells of the screen, for the steps after features (default: "
                                                   "the cells over the benchmark's 651 cells a well)")
    parser.add_argument("--preset", action="append", default=[],
                        help="instance type to plan (repeatable), `all`, or `local`; default: the enabled presets")
    parser.add_argument("--nodes", help="comma-separated node counts (default: 1, 2, 4, ... up to cluster.max_nodes)")
    parser.add_argument("--step-json", type=Path, help="output of `python -m training bench step --out`")
    parser.add_argument("--loader-json", type=Path, help="output of `python -m training bench loader --out`")
    parser.add_argument("--busbw-json", type=Path,
                        help="output of `python -m training.benchmarks.speed.allreduce --out`")
    parser.add_argument("--json", type=Path, dest="json_out", help="also write the rows to this file")
    parser.add_argument("--save", action="store_true",
                        help="also keep the rows in the run directory, for the bill after the run")
    parser.add_argument("--live-prices", action="store_true",
                        help="ask the AWS Price List API and Service Quotas (needs AWS credentials)")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="a CDK context value, as `cdk -c` takes it (e.g. -c cluster.max_nodes=4)")
    parser.add_argument("--cdk-json", type=Path, help="the CDK app's cdk.json (default: ./cdk.json, else the repository's)")


def read_settings(args: argparse.Namespace):
    """The deployment settings, merged as app.py merges them; a bad value is one line naming it."""
    from training.planning.inputs import PlanSettings, cdk_context

    try:
        from stacks.shared.settings import SettingsError, settings_from
    except ImportError:
        raise UserError("plan reads the deployment settings with stacks/ (the CDK app): run it from the "
                        "repository root") from None
    context = cdk_context(args.cdk_json, args.context)
    try:
        settings = settings_from(context.get)
    except SettingsError as exc:
        raise UserError(str(exc)) from None
    return PlanSettings.of(settings)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    start = time.perf_counter()
    from training.planning.report import (
        node_counts,
        plan_payload,
        plan_profile_steps,
        plan_rows,
        plan_standing,
        plan_text,
        preset_names,
        write_plan,
    )

    settings = read_settings(args)
    names = preset_names(args.preset, settings.presets)
    rows = plan_rows(config, layout, settings, names, args,
                     lambda local: node_counts(args.nodes, settings.max_nodes, local))
    standing = plan_standing(config, layout, settings, names, args)
    profile = plan_profile_steps(config, layout, args)
    elapsed = time.perf_counter() - start
    print(plan_text(rows, settings, standing, profile))
    print(f"\nplanned {len(rows)} row(s) for {len(names)} preset(s) in {elapsed:.2f} s")
    payload = plan_payload(rows, settings, elapsed, standing, profile)
    for wanted, path in ((args.json_out, args.json_out), (args.save, layout.plan)):
        if wanted:
            write_plan(payload, path)
    return 0
