"""Accept a YAML written for scDINO's Snakemake pipeline (its configs/scDINO_full_pipeline.yaml).

    python -m training pretrain --config scDINO_full_pipeline.yaml

A tree with scDINO's top-level sections (`meta`, `train_scDINO`, `downstream_analyses`) is converted
key by key with MAPPING below; keys with no counterpart are listed in one log line (IGNORED says why).
Sections of our own config tree given beside them (e.g. `train:`) apply on top. scDINO writes
tuples as `!!python/tuple`, which training/config/load.py reads as lists.

Differences worth knowing:
- `meta.train_datasetsplit_fraction` (0.8) becomes data.holdout_fraction = 1 - 0.8.
- `meta.selected_channel_combination_per_run` trains one model per entry in scDINO; here a run
  trains one model, on the first entry (run the pipeline once per combination for the others).
- `hyperparameters.use_fp16: True` becomes train.precision=auto (bf16 where the GPU has it,
  fp16 otherwise); False becomes fp32.
- The run directory is `<meta.output_dir>/<meta.name_of_run>`.
- scDINO's misspelt keys (`techer_temp`, `warump_epochs`) are read as well as the right spellings.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from training.config.schema import flatten_dotted
from training.errors import UserError

log = logging.getLogger(__name__)

SCDINO_SECTIONS = ("meta", "train_scDINO", "downstream_analyses")
_HP = "train_scDINO.hyperparameters."
_DOWN = "downstream_analyses."

# scDINO dotted key -> our dotted key
MAPPING: dict[str, str] = {
    "meta.name_of_run": "run.name",
    "meta.dataset_dir": "data.source",
    "meta.folder_depth_for_labels": "data.folder_depth_for_labels",
    "meta.seed": "run.seed",
    "train_scDINO.fraction_for_mean_std_calc": "data.mean_std_fraction",
    "train_scDINO.epochs": "optim.epochs",
    "train_scDINO.saveckp_freq": "train.saveckp_freq",
    "train_scDINO.batch_size_per_gpu": "optim.batch_size_per_gpu",
    "train_scDINO.num_workers": "data.num_workers",
    _HP + "arch": "model.arch",
    _HP + "patch_size": "model.patch_size",
    _HP + "out_dim": "model.out_dim",
    _HP + "norm_last_layer": "model.norm_last_layer",
    _HP + "use_bn_in_head": "model.use_bn_in_head",
    _HP + "drop_path_rate": "model.drop_path_rate",
    _HP + "momentum_teacher": "dino.momentum_teacher",
    _HP + "warmup_teacher_temp": "dino.warmup_teacher_temp",
    _HP + "teacher_temp": "dino.teacher_temp",
    _HP + "techer_temp": "dino.teacher_temp",
    _HP + "warmup_teacher_temp_epochs": "dino.warmup_teacher_temp_epochs",
    _HP + "global_crops_scale": "dino.global_crops_scale",
    _HP + "local_crops_number": "dino.local_crops_number",
    _HP + "local_crops_scale": "dino.local_crops_scale",
    _HP + "weight_decay": "optim.weight_decay",
    _HP + "weight_decay_end": "optim.weight_decay_end",
    _HP + "clip_grad": "optim.clip_grad",
    _HP + "freeze_last_layer": "optim.freeze_last_layer",
    _HP + "lr": "optim.lr",
    _HP + "warmup_epochs": "optim.warmup_epochs",
    _HP + "warump_epochs": "optim.warmup_epochs",
    _HP + "min_lr": "optim.min_lr",
    _DOWN + "compute_cls_features.batch_size_per_gpu": "eval.batch_size",
    _DOWN + "compute_cls_features.resize_length": "eval.image_size",
    _DOWN + "attention_visualisation.num_images_per_class": "eval.attention_images_per_class",
    _DOWN + "kNN.global.n_neighbors": "eval.knn_k",
    _DOWN + "kNN.global.temperature": "eval.knn_temperature",
    _DOWN + "umap_eval.n_neighbors": "eval.umap_neighbors",
    _DOWN + "umap_eval.min_dist": "eval.umap_min_dist",
}

# scDINO keys handled by a function of the whole scDINO tree (see _derived)
DERIVED = (
    "meta.output_dir", "meta.train_datasetsplit_fraction", "meta.channel_dict",
    "meta.selected_channel_combination_per_run", _HP + "use_fp16", _HP + "optimizer",
)

IGNORED: dict[str, str] = {
    "meta.images_are_RGB": "channels are always read as separate channels",
    "meta.center_crop": "images are used whole",
    "train_scDINO.dino_vit_name": "the run directory names the model",
    "train_scDINO.num_gpus": "the launcher (torchrun/srun) sets the number of ranks",
    "train_scDINO.dist_url": "ranks meet through the launcher's environment",
}


def is_scdino(tree: dict[str, Any]) -> bool:
    return any(section in tree for section in SCDINO_SECTIONS)


def convert_if_scdino(tree: dict[str, Any]) -> dict[str, Any]:
    """Return `tree` unchanged unless it looks like scDINO's pipeline YAML, else the converted tree."""
    if not is_scdino(tree):
        return tree
    flat = flatten_dotted({k: v for k, v in tree.items() if k in SCDINO_SECTIONS}, keep=("meta.channel_dict",))
    ours: dict[str, Any] = {}
    ignored = []
    for key, value in flat.items():
        if key in MAPPING:
            ours[MAPPING[key]] = value
        elif key not in DERIVED:
            ignored.append(f"{key} ({IGNORED.get(key, 'no counterpart')})")
    ours.update(_derived(flat))
    if ignored:
        log.info("scDINO config: ignored keys: %s", "; ".join(sorted(ignored)))
    converted = _nest(ours)
    for section, values in tree.items():
        if section not in SCDINO_SECTIONS:
            converted.setdefault(section, {}).update(values or {})
    return converted


def _derived(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rules: dict[str, Callable[[Any], dict[str, Any]]] = {
        "meta.train_datasetsplit_fraction": lambda v: {"data.holdout_fraction": round(1.0 - float(v), 10)},
        _HP + "use_fp16": lambda v: {"train.precision": "auto" if v else "fp32"},
        _HP + "optimizer": _check_optimizer,
        "meta.selected_channel_combination_per_run": _channels,
    }
    for key, rule in rules.items():
        if key in flat:
            out.update(rule(flat[key]))
    if "meta.output_dir" in flat:
        name = flat.get("meta.name_of_run", "run")
        out["run.output_dir"] = f"{str(flat['meta.output_dir']).rstrip('/')}/{name}"
    names = flat.get("meta.channel_dict")
    if isinstance(names, dict):
        channels = out.get("data.channels", "".join(str(k) for k in sorted(names)))
        out["data.channel_names"] = [str(names.get(int(c), names.get(c, f"ch{c}"))) for c in channels]
    return out


def _channels(value: Any) -> dict[str, Any]:
    combos = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    if len(combos) > 1:
        log.warning("scDINO config: one model per run here; training channels %r, not %s",
                    combos[0], ", ".join(combos[1:]))
    return {"data.channels": combos[0]}


def _check_optimizer(value: Any) -> dict[str, Any]:
    if str(value).lower() != "adamw":
        raise UserError(f"train_scDINO.hyperparameters.optimizer={value!r}: only 'adamw' is supported")
    return {}


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        section, key = dotted.split(".", 1)
        tree.setdefault(section, {})[key] = value
    return tree
