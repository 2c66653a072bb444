"""paths: print where a run's files are, so shell scripts never spell a file name themselves.

    python -m training paths --config run.yaml [--set key=value ...] root packed knn_json
    python -m training paths --config run.yaml --all      # every name, "name<TAB>path" per line
    python -m training paths --config run.yaml --combinations   # data.channel_combinations, one a line
    python -m training paths --config run.yaml --set run.combination=01 root   # a combination's run
    python -m training paths --config run.yaml --channel-adaptive   # combinations the channel-adaptive models are evaluated on
    python -m training paths --config run.yaml --channel-adaptive-kinds   # data.channel_adaptive_kinds, when compared
    python -m training paths --config run.yaml --ingest-table   # ingest.table (nothing when unset: the chain starts with prepare)
    python -m training paths --config run.yaml --set run.channel_adaptive=bag_of_channels --set run.combination=01 knn_json

One path per requested name, in order (names: training/rundir/layout.py, e.g. root, packed,
preempted_marker, results, report). An unknown name is an error that lists the known ones.
"""

from __future__ import annotations

import argparse

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="path names, e.g. root packed report")
    parser.add_argument("--all", action="store_true", help="print every name and path")
    parser.add_argument("--combinations", action="store_true",
                        help="print data.channel_combinations, one a line (nothing when empty)")
    parser.add_argument("--channel-adaptive", action="store_true",
                        help="print the combinations the channel-adaptive models are evaluated on, one a line "
                             "(nothing unless data.compare_channel_adaptive)")
    parser.add_argument("--channel-adaptive-kinds", action="store_true",
                        help="print the kinds of channel-adaptive model to train, one a line "
                             "(data.channel_adaptive_kinds; nothing unless data.compare_channel_adaptive)")
    parser.add_argument("--ingest-table", action="store_true",
                        help="print ingest.table, the load table `ingest` cuts cells from (nothing when unset)")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    if args.ingest_table:
        if config.ingest.table:
            print(config.ingest.table)
        return 0
    if args.channel_adaptive_kinds:
        if config.data.compare_channel_adaptive and config.data.channel_combinations:
            print("\n".join(config.data.channel_adaptive_kinds))
        return 0
    if args.combinations or args.channel_adaptive:
        listed = config.data.channel_combinations
        if listed and (args.combinations or config.data.compare_channel_adaptive):
            print("\n".join(listed))
        return 0
    known = layout.named_paths()
    if args.all:
        print("\n".join(f"{name}\t{path}" for name, path in known.items()))
        return 0
    unknown = [name for name in args.names if name not in known]
    if unknown or not args.names:
        raise UserError(f"unknown path name(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    print("\n".join(str(known[name]) for name in args.names))
    return 0
