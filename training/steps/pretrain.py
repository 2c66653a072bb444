"""pretrain: DINO self-supervised pretraining of the ViT, resuming from the run's last checkpoint.

    python -m training pretrain --config configs/demo.yaml
    torchrun --nproc_per_node 4 -m training pretrain --config run.yaml
    srun python -m training pretrain --config run.yaml      (Slurm ranks without torchrun)

Needs `mean-std` first. Pre-emption (SIGUSR1/SIGTERM) saves and exits 0 leaving
<run>/checkpoints/PREEMPTED for the batch script to requeue; see training/trainer.py. With
run.channel_adaptive=<kind> it trains that channel-adaptive model of data.compare_channel_adaptive, once,
on every channel of data.channels (run.combination would pick one of its evaluations, which train nothing).
"""

from __future__ import annotations

import argparse

from training.config import Config
from training.errors import UserError
from training.recovery.failures import refuse_if_failed
from training.rundir import RunLayout


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    if config.run.channel_adaptive and config.run.combination:
        raise UserError("the channel-adaptive model trains once, on every channel of data.channels: run pretrain "
                        f"with run.channel_adaptive={config.run.channel_adaptive} and without run.combination "
                        f"(got {config.run.combination!r}, "
                        "which picks its evaluation on that combination: features, labels, knn, linear)")
    # A worker that torchrun restarts after a deterministic failure of this job attempt stops here, before torch
    # is imported and the ranks meet: each restart left costs a Python start (1 s) instead of a set-up (13 s on
    # the local cluster). train() checks again, and there rank 0 clears a marker of an earlier attempt.
    refuse_if_failed(layout, is_main=False)
    from training.distributed.groups import process_group
    from training.trainer import train

    with process_group() as ctx:
        train(config, ctx)
    return 0
