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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from training.config import Config
from training.eval.store import write_text_atomic
from training.eval.tables import finetune_history_rows, finetune_rows, linear_rows, markdown_table
from training.layout import RunLayout

if TYPE_CHECKING:
    from training.distributed import DistContext
    from training.eval.finetune import FinetuneData, FinetuneResult

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which feature tags to probe, or fine-tuning instead of the probe."""
    parser.add_argument("--all-tags", action="store_true", help="also probe every epoch's features")
    parser.add_argument("--finetune", action="store_true",
                        help="fine-tune the backbone with a linear head on the images instead of probing "
                             "frozen features (DDP or FSDP under torchrun); writes linear/finetune.json")


def run(config: Config, args: argparse.Namespace) -> int:
    """Probe each tag (or fine-tune) on the kNN split; write the results, print the table."""
    if getattr(args, "finetune", False):
        return run_finetune(config)
    from training.data.io import write_json_atomic
    from training.eval.linear_probe import train_linear_probe
    from training.steps.knn import load_tagged_features
    from training.steps.labels import load_labels

    layout = RunLayout.from_config(config)
    labels = load_labels(layout)
    sets = load_tagged_features(layout, labels)
    if not getattr(args, "all_tags", False):
        sets = {t: fs for t, fs in sets.items() if not t.startswith("epoch_")} or sets
    y, ref, query = reference_query(config, labels)
    result = {"seed": config.run.seed, "epochs": config.eval.linear_epochs, "lr": config.eval.linear_lr,
              "n_train": int(len(ref)), "n_val": int(len(query)), "class_names": labels["class_names"], "tags": {}}
    for tag, feature_set in sets.items():
        x = np.asarray(feature_set.features)
        log.info("linear probe on features/%s (%d x %d)", tag, *x.shape)
        probe = train_linear_probe(x[ref], y[ref], x[query], y[query], num_classes=len(labels["class_names"]),
                                   epochs=config.eval.linear_epochs, lr=config.eval.linear_lr,
                                   seed=config.run.seed, progress=True)
        result["tags"][tag] = {"epoch": feature_set.meta.get("epoch"), "history": probe.history,
                               "final_top1": probe.final_top1, "best_top1": probe.best_top1}
    write_json_atomic(layout.linear / "linear.json", result)
    table = markdown_table(*linear_rows(result))
    write_text_atomic(layout.linear / "linear.md", f"# Linear probe (validation top-1, %)\n\n{table}\n")
    print(table)
    return 0


def reference_query(config: Config, labels: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels of the held-out images and the kNN step's seeded reference and query rows of them."""
    from training.eval.knn import split_reference_query

    y = np.asarray(labels["labels"], np.int64)
    ref, query = split_reference_query(y, config.eval.knn_train_fraction, config.run.seed)
    return y, ref, query


def run_finetune(config: Config) -> int:
    """Read the inputs, then fine-tune on every rank and write the results on rank 0.

    The inputs are read before joining the process group: a missing file stops every rank with the
    same message, and none is left waiting for the others.
    """
    from training.distributed import process_group
    from training.eval.finetune import finetune

    checkpoint, data = finetune_inputs(config)
    with process_group() as ctx:
        start = time.perf_counter()
        result = finetune(config, ctx, checkpoint, data)
        if ctx.is_main:
            payload = finetune_payload(config, ctx, checkpoint, data, result)
            write_finetune(config, {**payload, "seconds": round(time.perf_counter() - start, 3)}, result.state)
    return 0


def finetune_inputs(config: Config) -> tuple[Path, FinetuneData]:
    """The checkpoint to start from (as `features` picks it) and the training and validation images;
    MissingInputError names the step to run first."""
    from training.data.stats import load_mean_std
    from training.eval.finetune import FinetuneData
    from training.eval.plan import final_checkpoint
    from training.steps.labels import load_labels

    checkpoint = final_checkpoint(config)
    labels = load_labels(RunLayout.from_config(config))
    mean, std = load_mean_std(config)
    check_labels_describe_dataset(config, labels)
    _, ref, query = reference_query(config, labels)
    indices = np.asarray(labels["indices"], np.int64)
    data = FinetuneData(train=indices[ref], val=indices[query], class_names=list(labels["class_names"]),
                        mean=mean, std=std)
    return checkpoint, data


def check_labels_describe_dataset(config: Config, labels: dict[str, Any]) -> None:
    """Fine-tuning reads the images by labels.json's dataset indices: they must still be its images."""
    from training.data.dataset import load_index
    from training.errors import UserError

    paths = load_index(config).paths
    if any(i >= len(paths) or paths[i] != path for i, path in zip(labels["indices"], labels["paths"])):
        raise UserError(f"labels.json describes other images than {config.data.source}: "
                        "rerun `python -m training labels`")


def finetune_payload(config: Config, ctx: DistContext, checkpoint: Path, data: FinetuneData,
                     result: FinetuneResult) -> dict[str, Any]:
    """finetune.json but its timing: settings, world size, parallel mode, per-epoch history."""
    from training.dino.step import resolve_precision
    from training.eval.finetune import parallel_mode
    from training.eval.plan import checkpoint_epoch

    settings = config.eval
    return {
        "checkpoint": str(checkpoint), "checkpoint_epoch": checkpoint_epoch(checkpoint),
        "seed": config.run.seed, "epochs": settings.finetune_epochs, "lr": settings.finetune_lr,
        "backbone_lr_scale": settings.finetune_backbone_lr_scale, "weight_decay": settings.finetune_weight_decay,
        "batch_size_per_rank": settings.finetune_batch_size, "flips": settings.finetune_flips,
        "image_size": settings.image_size, "world_size": ctx.world_size, "parallel": parallel_mode(config, ctx),
        "precision": resolve_precision(config.train.precision, ctx.device).name,
        "n_train": int(len(data.train)), "n_val": int(len(data.val)), "class_names": list(data.class_names),
        "history": result.history, "final_top1": result.final_top1, "best_top1": result.best_top1,
    }


def write_finetune(config: Config, payload: dict[str, Any], state: dict[str, Any]) -> None:
    """finetune.json, finetune.md and finetune.pth under <run>/linear, each written atomically."""
    from training.checkpoint import save_atomic
    from training.data.io import write_json_atomic

    linear = RunLayout.from_config(config).linear
    save_atomic({"model": state, "class_names": payload["class_names"], "config": config.to_dict()},
                linear / "finetune.pth")
    write_json_atomic(linear / "finetune.json", payload)
    summary = markdown_table(*finetune_rows(payload))
    history = markdown_table(*finetune_history_rows(payload))
    write_text_atomic(linear / "finetune.md", f"# Fine-tuned backbone (validation top-1, %)\n\n{summary}\n\n"
                                              f"## Per epoch\n\n{history}\n")
    log.info("wrote %s", linear / "finetune.json")
    print(summary)
