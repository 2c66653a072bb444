"""linear: linear probe on the frozen held-out features, or (--finetune) full fine-tuning.

    python -m training linear --config run.yaml [--all-tags]
    python -m training linear --config run.yaml --finetune                          # one process
    torchrun --nproc_per_node 4 -m training linear --config run.yaml --finetune     # 4 ranks

Uses the kNN step's seeded split of the held-out images (references train, queries validate) so the
tables compare like with like. The probe trains on the stored features of the final checkpoint and
the two baselines (--all-tags adds every epoch) and writes <run>/linear/linear.json and linear.md.
--finetune instead trains the final teacher backbone with a linear head on the images themselves,
data-parallel (train.parallel: DDP or FSDP2), with validation accuracy per epoch, and writes
<run>/linear/finetune.json, finetune.md and the fine-tuned weights finetune.pth (rank 0 only).
"""

from __future__ import annotations

import argparse
import logging
import time

from training.config import Config
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which feature tags to probe, or fine-tuning instead of the probe."""
    parser.add_argument("--all-tags", action="store_true", help="also probe every epoch's features")
    parser.add_argument("--finetune", action="store_true",
                        help="fine-tune the backbone with a linear head on the images instead of probing "
                             "frozen features (DDP or FSDP under torchrun), written beside the probe's results")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Probe each tag (or fine-tune) on the kNN split; write the results, print the table."""
    if getattr(args, "finetune", False):
        return run_finetune(config, layout)
    from training.eval.linear_probe import probe_feature_sets
    from training.eval.tables import linear_rows, markdown_table
    from training.rundir import tags
    from training.rundir.artifacts import load_labels, load_tagged_features
    from training.writes.atomic import write_json_atomic, write_text_atomic

    labels = load_labels(layout)
    sets = load_tagged_features(layout, labels)
    if not getattr(args, "all_tags", False):
        sets = {t: fs for t, fs in sets.items() if not tags.is_epoch_tag(t)} or sets
    result = probe_feature_sets(sets, labels, config)
    write_json_atomic(layout.linear_json, result)
    table = markdown_table(*linear_rows(result))
    write_text_atomic(layout.linear_md, f"# Linear probe (validation top-1, %)\n\n{table}\n")
    print(table)
    return 0


def run_finetune(config: Config, layout: RunLayout) -> int:
    """Read the inputs, then fine-tune on every rank and write the results on rank 0.

    The inputs are read before joining the process group: a missing file stops every rank with the
    same message, and none is left waiting for the others.
    """
    from training.distributed.groups import process_group
    from training.eval.finetune import finetune, finetune_inputs, finetune_payload, write_finetune

    checkpoint, data = finetune_inputs(config, layout)
    with process_group() as ctx:
        start = time.perf_counter()
        result = finetune(config, ctx, checkpoint, data)
        if ctx.is_main:
            payload = finetune_payload(config, ctx, checkpoint, data, result)
            print(write_finetune(config, layout, {**payload, "seconds": round(time.perf_counter() - start, 3)},
                                 result.state))
    return 0
