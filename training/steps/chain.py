"""chain: the Slurm jobs of a run's pipeline, computed once (training/chain/graph.py), printed as sbatch
command lines, as JSON, or for slurm/submit_pipeline.sh, which submits them.

    python -m training chain --config run.yaml [--set key=value ...] --partition P --cpus-per-task N
        --ingest-cpus-per-task N [--from STEP] [--to STEP] [--nodes N] [--after JOBID] [--prepare-tasks N]
        [--ingest-tasks N] [--output PATTERN] [--comment TEXT] [--bundle DIR] [--format commands|json|nul]
        [--profile MODEL]

With --profile MODEL (a trained run's directory or a checkpoint file), the jobs that embed the config's
screen with that model instead of training one (training/steps/profile.py).

`commands` (the default) prints `sbatch ...` per job, a job of the chain it waits for as <LABEL>; `json`
the run directory, what was skipped and the jobs (label, script, args, sbatch, after, after_ids); `nul`
per job its label, the count of sbatch's arguments and the arguments, each ending in a NUL byte.
The run directory and what was skipped (its files exist) also go to stderr, one line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.errors import UserError

READS_ITS_OWN_CONFIG = True
"""The CLI hands this command its arguments unread: a bad configuration is the chain's own one-line error."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from training.chain.graph import DEFAULT_OUTPUT
    from training.chain.sbatch import BUNDLE

    parser.add_argument("--from", dest="first", metavar="STEP", help="first step (default: the chain's first)")
    parser.add_argument("--to", dest="last", default="report", metavar="STEP", help="last step (default: report)")
    parser.add_argument("--nodes", help="pretraining nodes (default: pretrain.slurm's)")
    parser.add_argument("--after", help="job id(s), colon-separated, that the first jobs also wait for")
    parser.add_argument("--prepare-tasks", default="1", help="prepare as an array of N tasks, then a merge")
    parser.add_argument("--ingest-tasks", default="1", help="ingest as an array of N tasks, then a merge")
    parser.add_argument("--profile", default="", metavar="MODEL",
                        help="embed the config's screen with this trained model (run directory or checkpoint file)")
    parser.add_argument("--partition", required=True, help="Slurm partition of every job (SCDINO_PARTITION)")
    parser.add_argument("--cpus-per-task", required=True, help="CPUs of a single-process step (SCDINO_CPUS_PER_TASK)")
    parser.add_argument("--ingest-cpus-per-task", required=True,
                        help="CPUs of each ingest job or task (SCDINO_INGEST_CPUS_PER_TASK)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="sbatch's --output pattern (default: %(default)s)")
    parser.add_argument("--comment", default="", help="sbatch's --comment of every job (the bundle's mark)")
    parser.add_argument("--bundle", type=Path, default=BUNDLE, help="the folder holding slurm/ (default: %(default)s)")
    parser.add_argument("--format", choices=("commands", "json", "nul"), default="commands", help="what to print")


def run(args: argparse.Namespace) -> int:
    from training.chain.graph import ChainOptions, Site, count, plan
    from training.chain.sbatch import command_line

    if args.config is None:
        raise UserError("chain needs --config: the run's YAML, which every job reads")
    options = ChainOptions(
        first=args.first, last=args.last, nodes=count("--nodes", args.nodes) if args.nodes is not None else None,
        after=tuple(args.after.split(":")) if args.after else (), prepare_tasks=count("--prepare-tasks", args.prepare_tasks),
        ingest_tasks=count("--ingest-tasks", args.ingest_tasks), overrides=tuple(args.overrides), output=args.output,
        comment=args.comment, profile=args.profile)
    site = Site(args.partition, count("--cpus-per-task", args.cpus_per_task),
                count("--ingest-cpus-per-task", args.ingest_cpus_per_task))
    chain = plan(args.config, options, site)
    print("\n".join([f"run directory: {chain.run_dir}", *chain.skipped]), file=sys.stderr)
    if args.format == "json":
        print(json.dumps(chain.as_dict(), indent=2))
        return 0
    for job in chain.jobs:
        words = command_line(job, args.bundle)
        if args.format == "nul":
            sys.stdout.write("".join(f"{word}\0" for word in (job.label, str(len(words)), *words)))
        else:
            print("sbatch " + " ".join(words))
    return 0
