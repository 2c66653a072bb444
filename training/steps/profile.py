"""profile: embed a new screen with a trained model, as the model learnt to read cells, through the
steps a screen's chain runs: ingest, mean-std, features, labels, knn (kNN, not-same-batch kNN and
retrieval mAP of per-well profiles) and export (per-cell and per-well profiles, normalised per plate).

    python -m training profile --model runs/screen --config new_plates.yaml      # every job, here
    slurm/submit_pipeline.sh new_plates.yaml --profile runs/screen [--ingest-tasks 8]   # as Slurm jobs

--model is a finished run's directory (its latest checkpoint) or a checkpoint file (*.pth). --config
is the new screen's: its ingest.table (the LoadData table), data.channel_names (the name of each of
data.channels, in the screen's order), run.output_dir (a folder of its own) and the evaluation's screen
settings (label, batch, control, plate and well columns, eval.profile_normalization). What the model
learnt comes from its card (training/models/card.py): the channels are mapped by name, so that the model
reads its own order whatever the screen's; its crop size, input scaling, evaluation image size and
feature, and its own per-channel mean and std are used (training/eval/profiles/new_plates.py).

Stages (--stage; `chain --profile` plans one job for each):
  setup   reads the model's card; refuses, in one line, a screen that lacks one of the model's
          channels or is cut at another crop size (ingest.crop_size 0 takes the model's); writes the
          profile's config, which every later job reads (<run>/profile.yaml), the card with the channel
          map and checks (model_card.json) and the model's statistics at the screen's channels
  check   after ingest and mean-std: refuses a screen whose per-channel mean or std (over min-max
          scaled pixels, as mean-std computes them) lies outside card.STATS_FACTOR of the model's
  all     (the default) plans the profile chain as `chain --profile` does and runs its jobs here, one
          after another, each in a process of its own (training/chain/local.py); the first failure stops it
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.errors import UserError

READS_ITS_OWN_CONFIG = True
"""The stages read the config themselves: `all` hands it to the jobs, `setup` writes the profile's own."""
STAGES = ("all", "setup", "check")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=Path,
                        help="the trained model: its run directory (its latest checkpoint) or a checkpoint file")
    parser.add_argument("--stage", choices=STAGES, default="all",
                        help="all: every job of the profile chain here (default); setup or check: one stage")


def run(args: argparse.Namespace) -> int:
    from training.chain.graph import ChainOptions, Site, plan
    from training.chain.local import run_here
    from training.config import load_config
    from training.eval.profiles.new_plates import check, setup

    if args.config is None:
        raise UserError("profile needs --config: the new screen's YAML (its ingest.table, data.channel_names, "
                        "run.output_dir)")
    if args.stage == "all":
        site = Site("here", 1, 1)  # sbatch's resources, which a job run here does not use
        return run_here(plan(args.config, ChainOptions(overrides=tuple(args.overrides), profile=str(args.model)),
                             site).jobs)
    config = load_config(args.config, args.overrides)
    if args.stage == "setup":
        setup(config, args.model)
    else:
        check(config)
    return 0
