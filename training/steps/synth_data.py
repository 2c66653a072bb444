"""synth-data: write the embedded synthetic dataset (N-channel 16-bit TIFFs in class folders), or
with --screen a synthetic screen (fields of view, label masks, a plate map and load_data.csv).

    python -m training synth-data --out runs/demo/data/images --classes 5 --per-class 200

    python -m training synth-data --screen --out runs/demo/data/screen --plates 4 --wells-per-plate 24

`--out` defaults to data.source (a screen: the folder `screen` beside it) and `--channels` to the
highest channel data.channels selects, so that a config's own `synth-data` call produces data its
other steps can read. `--corrupt` adds one of each kind of bad image (empty, truncated, garbage,
wrong channels, blank, wrong shape). A screen names its channels as data.channel_names does, else
Membrane, Cytoplasm, DNA, Marker, Marker2 (training/data/synthetic/plates.py lists what it writes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout

CLASS_OPTIONS = {"classes": 5, "per_class": 200, "size": 50}
"""Defaults of the class-folder options, which a screen does not take (None in the parsed arguments
when not given, so that a screen can refuse them)."""
SCREEN_OPTIONS = ("plates", "batches", "wells_per_plate", "sites", "fov_size", "cells_per_fov", "batch_strength")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="output folder (default: data.source; a screen: screen/ beside it)")
    parser.add_argument("--classes", type=int, help="number of classes (at most the number of built-in phenotypes; "
                                                    "default 5)")
    parser.add_argument("--per-class", type=int, help="images per class (default 200)")
    parser.add_argument("--channels", type=int,
                        help="channels per image (default: enough for data.channels, at least 5)")
    parser.add_argument("--size", type=int, help="image side in pixels (default 50)")
    parser.add_argument("--seed", type=int, help="generator seed (default: run.seed)")
    parser.add_argument("--channels-first", action="store_true", help="store (C, H, W) instead of scDINO's (H, W, C)")
    parser.add_argument("--corrupt", action="store_true", help="also write bad images into the first class folder")
    parser.add_argument("--channel-order", metavar="DIGITS",
                        help="store the generated channels in this order, e.g. 31042 puts the marker (3) first")
    screen = parser.add_argument_group("synthetic screen (--screen)")
    screen.add_argument("--screen", action="store_true",
                        help="write a screen: fields of view, label masks, plate map, load_data.csv, truth.csv")
    screen.add_argument("--plates", type=int, help="plates (default 4)")
    screen.add_argument("--batches", type=int, help="imaging batches the plates are split into (default 2)")
    screen.add_argument("--wells-per-plate", type=int, help="wells used on each plate (default 24)")
    screen.add_argument("--sites", type=int, help="fields of view per well (default 1)")
    screen.add_argument("--fov-size", type=int, help="field of view side in pixels (default 256)")
    screen.add_argument("--cells-per-fov", type=int, help="cells drawn in each field of view (default 20)")
    screen.add_argument("--batch-strength", type=float,
                        help="scale of the batch, plate and well imaging effects: 0 none, 1 default")
    screen.add_argument("--per-channel-files", action="store_true",
                        help="one single-channel TIFF per channel per field of view")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    channels = args.channels or max(5, max(config.data.channel_indices) + 1)
    seed = config.run.seed if args.seed is None else args.seed
    if args.screen:
        return _write_screen(config, args, channels, seed)
    given = [f"--{name.replace('_', '-')}" for name in SCREEN_OPTIONS if getattr(args, name) is not None]
    if args.per_channel_files:
        given.append("--per-channel-files")
    if given:
        raise UserError(f"{', '.join(given)} {'is a' if len(given) == 1 else 'are'} screen option"
                        f"{'' if len(given) == 1 else 's'}: add --screen, or leave {'it' if len(given) == 1 else 'them'} "
                        "out for class folders")
    from training.data.synthetic.folders import write_class_folders

    options = {name: default if getattr(args, name) is None else getattr(args, name)
               for name, default in CLASS_OPTIONS.items()}
    write_class_folders(args.out or Path(config.data.source), **options, channels=channels, seed=seed,
                        channels_first=args.channels_first, corrupt=args.corrupt, channel_order=args.channel_order)
    return 0


def _write_screen(config: Config, args: argparse.Namespace, channels: int, seed: int) -> int:
    from training.data.synthetic.plates import ScreenSpec, channel_names_for, write_screen

    given = [f"--{name.replace('_', '-')}" for name in CLASS_OPTIONS if getattr(args, name) is not None]
    given += [flag for flag, on in (("--channels-first", args.channels_first), ("--corrupt", args.corrupt),
                                    ("--channel-order", args.channel_order)) if on]
    if given:
        raise UserError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to class folders, not to "
                        "--screen (its images are channels-first fields of view: see --fov-size and --cells-per-fov)")
    configured = dict(zip(config.data.channel_indices, config.data.channel_names))
    sizes = {name: getattr(args, name) for name in SCREEN_OPTIONS if getattr(args, name) is not None}
    spec = ScreenSpec(**sizes, channel_names=channel_names_for(channels, configured),
                      per_channel_files=args.per_channel_files, seed=seed)
    write_screen(args.out or Path(config.data.source).parent / "screen", spec)
    return 0
