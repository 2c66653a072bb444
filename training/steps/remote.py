"""remote: submit a run to the cluster from a laptop, watch it, fetch its results, cancel it; AWS credentials
are all it needs (training/remote/ has how).

    python -m training remote tunnel                      # the SSM port forward to the REST API; keep it open
    python -m training remote submit --config run.yaml    # config's run.output_dir: /fsx/data/runs/NAME
    python -m training remote submit --config new_plates.yaml --profile runs/MODEL   # profile with a trained model
    python -m training remote status runs/NAME [--follow]
    python -m training remote fetch runs/NAME [--what report,knn,profiles] [--into DIR]
    python -m training remote cancel runs/NAME

The deployment is the one recorded by `python -m stacks.deployment deploy` (deployment.json; --deployment
FILE for another). A run is named by its folder on the cluster, absolute (/fsx/data/runs/NAME) or under
the data folder (runs/NAME), or by --config (its run.output_dir). submit uploads the config beside the run
folder (s3://<bucket>/data/runs/NAME.yaml, which the file system imports as /fsx/data/runs/NAME.yaml),
submits the chain slurm/submit_pipeline.sh would (training/chain) through the Slurm REST API, and keeps
the job ids beside it (NAME.jobs.json); with --profile RUN, as submit_pipeline.sh --profile, the chain in
which RUN's model (a finished run's folder, or a checkpoint file) embeds the config's screen instead of
training one, once the bucket shows RUN's checkpoint. status reads each job's state from the REST API while Slurm knows
it, and always the run folder in the bucket: each step's time, its log's last lines, the kNN figures, the
results; fetch downloads parts of the run folder, resumably.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.config import Config

ACTIONS = ("submit", "status", "fetch", "cancel", "tunnel")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from training.remote.bucket import DEFAULT_PARTS, PARTS
    from training.remote.target import DEFAULT_ENDPOINT

    parser.add_argument("action", choices=ACTIONS, help="what to do")
    parser.add_argument("run", nargs="?", help="the run's folder on the cluster (/fsx/data/runs/NAME or runs/NAME); "
                        "default: --config's run.output_dir")
    parser.add_argument("--deployment", type=Path, metavar="FILE",
                        help="the deployment record (default: deployment.json at the repository root)")
    parser.add_argument("--region", help="refuse unless the recorded deployment is in this region")
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT,
                        help=f"the Slurm REST API (default {DEFAULT_ENDPOINT}, the SSM port forward's local end)")
    parser.add_argument("--cluster-data", metavar="DIR",
                        help="where the cluster has the bucket's data prefix (default /fsx/<prefix>, e.g. /fsx/data)")
    parser.add_argument("--bundle", default="/apps/scdino", metavar="DIR",
                        help="the bundle's folder on the cluster, whose slurm/ the jobs run (default /apps/scdino)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="submit: a variable of the jobs' environment (repeatable), e.g. SCDINO_PRESET=p4d.24xlarge")
    parser.add_argument("--from", dest="first", metavar="STEP", help="submit: start at STEP (as submit_pipeline.sh)")
    parser.add_argument("--to", dest="last", default="report", metavar="STEP", help="submit: stop after STEP")
    parser.add_argument("--nodes", type=int, help="submit: pretraining nodes")
    parser.add_argument("--prepare-tasks", type=int, default=1, help="submit: prepare as an array of N tasks")
    parser.add_argument("--ingest-tasks", type=int, default=1, help="submit: ingest as an array of N tasks")
    parser.add_argument("--profile", metavar="RUN",
                        help="submit: embed the config's screen with RUN's trained model instead of training one "
                        "(a finished run's folder, /fsx/data/runs/NAME or runs/NAME, or a checkpoint file *.pth)")
    parser.add_argument("--follow", action="store_true", help="status: print changes until every job has ended")
    parser.add_argument("--interval", type=float, default=10.0, help="status --follow: seconds between looks")
    parser.add_argument("--lines", type=int, default=3, help="status: last lines of each job's log")
    parser.add_argument("--what", default=",".join(DEFAULT_PARTS),
                        help=f"fetch: comma-separated parts of {', '.join(PARTS)}, or all (default: %(default)s)")
    parser.add_argument("--into", type=Path, metavar="DIR", help="fetch: local folder (default runs/remote/NAME)")
    parser.add_argument("--print", dest="print_only", action="store_true", help="tunnel: print the command only")


def run(config: Config, layout, args: argparse.Namespace) -> int:
    from training.remote import commands
    from training.remote.target import aws_session, load_target

    target = load_target(args.deployment, endpoint=args.endpoint, cluster_data=args.cluster_data, bundle=args.bundle,
                         region=args.region)
    if args.action == "tunnel":
        return commands.tunnel(target, args.print_only)
    session = aws_session(target)
    with commands.aws_errors(target):
        if args.action == "submit":
            return commands.submit(target, session, config, args)
        run_dir = commands.run_folder(target, config, args)
        action = {"status": commands.status, "fetch": commands.fetch, "cancel": commands.cancel}[args.action]
        return action(target, session, run_dir, args)
