"""synth-data: write the embedded synthetic dataset (N-channel 16-bit TIFFs in class folders).

    python -m training synth-data --out runs/demo/data/images --classes 5 --per-class 200

`--out` defaults to data.source and `--channels` to the highest channel data.channels selects, so
that a config's own `synth-data` call produces data its other steps can read. `--corrupt` adds one
of each kind of bad image (empty, truncated, garbage, wrong channels, blank, wrong shape).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="output folder (default: data.source)")
    parser.add_argument("--classes", type=int, default=5, help="number of classes (at most the number of built-in phenotypes)")
    parser.add_argument("--per-class", type=int, default=200, help="images per class")
    parser.add_argument("--channels", type=int,
                        help="channels per image (default: enough for data.channels, at least 5)")
    parser.add_argument("--size", type=int, default=50, help="image side in pixels")
    parser.add_argument("--seed", type=int, help="generator seed (default: run.seed)")
    parser.add_argument("--channels-first", action="store_true", help="store (C, H, W) instead of scDINO's (H, W, C)")
    parser.add_argument("--corrupt", action="store_true", help="also write bad images into the first class folder")
    parser.add_argument("--channel-order", metavar="DIGITS",
                        help="store the generated channels in this order, e.g. 31042 puts the marker (3) first")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    from training.data.synthetic import PHENOTYPES, write_corrupt_files, write_dataset

    out = args.out or Path(config.data.source)
    channels = args.channels or max(5, max(config.data.channel_indices) + 1)
    if not 1 <= args.classes <= len(PHENOTYPES):
        raise UserError(f"--classes must be between 1 and {len(PHENOTYPES)}, got {args.classes}")
    if args.per_class < 1 or args.size < 16 or channels < 1:
        raise UserError("--per-class must be >= 1, --size >= 16 and --channels >= 1")
    seed = config.run.seed if args.seed is None else args.seed
    order = None
    if args.channel_order:
        order = tuple(int(c) for c in args.channel_order if c.isdigit())
        if len(order) != len(args.channel_order) or sorted(order) != list(range(channels)):
            raise UserError(f"--channel-order must list each of the {channels} channels once, as digits such as "
                            f"{''.join(map(str, reversed(range(channels))))}; got {args.channel_order!r}")
    write_dataset(out, args.classes, args.per_class, channels, args.size, seed,
                  channel_axis="first" if args.channels_first else "last", channel_order=order)
    if args.corrupt:
        first = sorted(p for p in out.iterdir() if p.is_dir())[0]
        written = write_corrupt_files(first, channels, args.size, seed)
        log.info("wrote %d bad images into %s", len(written), first)
    return 0
