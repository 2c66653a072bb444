"""Accept the YAMLs of scDINO's Snakemake pipelines: configs/scDINO_full_pipeline.yaml and
configs/only_downstream_analyses.yaml.

    python -m training pretrain --config scDINO_full_pipeline.yaml
    python -m training features --config only_downstream_analyses.yaml

A tree with scDINO's top-level sections is converted key by key, and the whole mapping
(scDINO key -> our key = value) is logged as one INFO block. A key whose scDINO value would change
results but has no counterpart here is named with its value in a WARNING. Sections of our own config
tree given beside them (e.g. `train:`) apply on top. scDINO writes tuples as `!!python/tuple`, which
training/config/load.py reads as lists.

What follows scDINO's pipeline rather than a key of the same name:
- Epochs: its Snakefile runs main_dino with `epochs + 1`, so optim.epochs = epochs + 1.
- Saved epochs: main_dino saves checkpoint{e}.pth after 0-based epoch e when e % saveckp_freq == 0,
  and the Snakefile analyses those and the last epoch: train.saveckp_rule=scdino, train.keep_last=0
  (nothing pruned). Our numbers count completed epochs: checkpoint{e}.pth is our epoch_{e+1}.
- Split: data.split_method=scdino, held out floor((1 - train_datasetsplit_fraction) x n) of a seeded
  shuffle (only_downstream: floor(test_datasetsplit_fraction x n)), computed in floating point as
  scDINO does (1 - 0.8 is 0.19999999999999996, so 10 images hold out 1, not 2).
- Eval resize: `resize: True` is eval.resize=shorter_side_bilinear (scDINO's Resize(resize_length));
  False is eval.resize=none.
- `meta.selected_channel_combination_per_run` trains one model per entry in scDINO; here every entry
  becomes `data.channel_combinations` (slurm/submit_pipeline.sh runs one chain per entry, then
  `compare`), and the first is `data.channels` for a single run.
- `use_fp16: True` is train.precision=auto (bf16 where the GPU has it, else fp16); False is fp32.
- The run directory is `<meta.output_dir>/<meta.name_of_run>`; misspelt `techer_temp` and
  `warump_epochs` are read as well as the right spellings.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from training.config.dotted import flatten_dotted
from training.errors import UserError

log = logging.getLogger(__name__)

SCDINO_SECTIONS = ("meta", "train_scDINO", "downstream_analyses", "compute_cls_features",
                   "attention_visualisation", "kNN", "umap_eval")
_HP = "train_scDINO.hyperparameters."
_DOWN = "downstream_analyses."
_CLS = "compute_cls_features."

_DOWNSTREAM: dict[str, str] = {
    _CLS + "batch_size_per_gpu": "eval.batch_size",
    _CLS + "resize_length": "eval.image_size",
    _CLS + "checkpoint_key": "eval.checkpoint_key",
    "attention_visualisation.num_images_per_class": "eval.attention_images_per_class",
    "kNN.global.n_neighbors": "eval.knn_k",
    "kNN.global.temperature": "eval.knn_temperature",
    "umap_eval.n_neighbors": "eval.umap_neighbors",
    "umap_eval.min_dist": "eval.umap_min_dist",
}
"""Keys below `downstream_analyses.` (full pipeline) or at the top (only_downstream_analyses.yaml)."""

# scDINO dotted key -> our dotted key, value unchanged
MAPPING: dict[str, str] = {
    "meta.name_of_run": "run.name",
    "meta.dataset_dir": "data.source",
    "meta.folder_depth_for_labels": "data.folder_depth_for_labels",
    "meta.seed": "run.seed",
    "train_scDINO.fraction_for_mean_std_calc": "data.mean_std_fraction",
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
    **{_DOWN + key: ours for key, ours in _DOWNSTREAM.items()},
    **_DOWNSTREAM,
    _CLS + "arch": "model.arch",
    _CLS + "patch_size": "model.patch_size",
    _CLS + "num_workers": "data.num_workers",
    _CLS + "pretrained_weights": "eval.checkpoints_dir",
}

NOT_NEEDED: dict[str, str] = {
    "train_scDINO.dino_vit_name": "the run directory names the model",
    "train_scDINO.num_gpus": "the launcher (torchrun/srun) sets the number of ranks",
    "train_scDINO.dist_url": "ranks meet through the launcher's environment",
    _DOWN + _CLS + "num_gpus": "the launcher sets the number of ranks",
    _DOWN + _CLS + "num_workers": "data.num_workers serves every step",
    _CLS + "num_gpus": "the launcher sets the number of ranks",
    _CLS + "use_cuda": "features are gathered on the CPU",
    _CLS + "class_weights": "used only by use_weighted_sampler",
    _CLS + "num_samples": "used only by use_weighted_sampler",
    _CLS + "custom_embedding_map": "used only by use_custom_embedding_map",
    _CLS + "norm_per_channel": "see compute_cls_features.parse_mean_std_from_file",
    _CLS + "mean_std_file_location": "see compute_cls_features.parse_mean_std_from_file",
    _DOWN + "attention_visualisation.resize_attention_image": "attention maps are drawn at eval.image_size",
}
"""scDINO keys with no key here that change no result: machine settings, or read by another key's rule."""


def is_scdino(tree: dict[str, Any]) -> bool:
    return any(section in tree for section in SCDINO_SECTIONS)


def convert_if_scdino(tree: dict[str, Any]) -> dict[str, Any]:
    """Return `tree` unchanged unless it looks like one of scDINO's YAMLs, else the converted tree."""
    if not is_scdino(tree):
        return tree
    flat = flatten_dotted({k: v for k, v in tree.items() if k in SCDINO_SECTIONS}, keep=("meta.channel_dict",))
    lines: list[str] = []
    ours: dict[str, Any] = {}
    for key, value in flat.items():
        if key in MAPPING:
            ours[MAPPING[key]] = value
            lines.append(f"{key} -> {MAPPING[key]} = {value!r}")
        elif key in NOT_NEEDED:
            lines.append(f"{key} -> (no key here: {NOT_NEEDED[key]})")
    for key, produced in _derived(flat).items():
        ours.update(produced)
        targets = ", ".join(f"{k} = {v!r}" for k, v in produced.items()) or "(nothing to set; a difference is a WARNING)"
        lines.append(f"{key} -> {targets}")
    for key in sorted(set(flat) - set(MAPPING) - set(NOT_NEEDED) - set(RULES)):
        lines.append(f"{key} -> (no counterpart)")
        log.warning("scDINO config: %s=%r has no counterpart here and is ignored", key, flat[key])
    log.info("scDINO config -> ours (scDINO key -> our key = value):\n  %s", "\n  ".join(lines))
    converted = _nest(ours)
    for section, values in tree.items():
        if section not in SCDINO_SECTIONS:
            converted.setdefault(section, {}).update(values or {})
    return converted


def _derived(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{scDINO key: the keys of ours it sets} for every key handled by a rule."""
    return {key: rule(key, flat[key], flat) for key, rule in RULES.items() if key in flat}


def _truthy(value: Any) -> bool:
    """scDINO tests these flags with a plain `if args.flag:`."""
    return bool(value)


def _warn(key: str, value: Any, why: str) -> dict[str, Any]:
    log.warning("scDINO config: %s=%r is not implemented here: %s", key, value, why)
    return {}


def _output_dir(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    return {"run.output_dir": f"{str(value).rstrip('/')}/{flat.get('meta.name_of_run', 'run')}"}


def _train_fraction(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    # scDINO holds out floor((1 - fraction) * n), computed in floating point: keep that float exactly
    return {"data.holdout_fraction": 1.0 - float(value), "data.split_method": "scdino"}


def _test_fraction(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    if not 0 <= float(value) < 1:
        raise UserError(f"meta.test_datasetsplit_fraction={value!r}: only a held-out fraction in [0, 1) is "
                        "supported (scDINO's 1 evaluates every image, training images included)")
    return {"data.holdout_fraction": float(value), "data.split_method": "scdino"}


def _channel_names(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(value, dict):
        return {}
    channels = _channels(key, flat.get("meta.selected_channel_combination_per_run", ""), flat).get(
        "data.channels", "".join(str(k) for k in sorted(value)))
    return {"data.channel_names": [str(value.get(int(c), value.get(c, f"ch{c}"))) for c in channels]}


def _channels(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    combos = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    if not combos or not combos[0]:
        return {}
    return {"data.channels": combos[0]}


def _combinations(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    """scDINO trains one model per entry: all of them become data.channel_combinations (one chain
    each under slurm/submit_pipeline.sh); the first stays data.channels for a single run."""
    combos = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    converted = _channels(key, value, flat)
    if len(combos) > 1:
        converted["data.channel_combinations"] = combos
    return converted


def _epochs(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    return {"optim.epochs": int(value) + 1}


def _saveckp_freq(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    every = int(value)
    if "train_scDINO.epochs" in flat and every > 0:
        last = int(flat["train_scDINO.epochs"])
        if last % every:
            log.warning("scDINO config: train_scDINO.epochs=%d is not a multiple of saveckp_freq=%d: scDINO's "
                        "Snakefile asks for checkpoint%d.pth, which its main_dino never writes; here epochs "
                        "%s (scDINO's numbering) are saved and analysed", last, every, last,
                        saved_epochs_scdino(last, every))
    return {"train.saveckp_freq": every, "train.saveckp_rule": "scdino", "train.keep_last": 0}


def saved_epochs_scdino(epochs: int, every: int) -> list[int]:
    """0-based epochs whose checkpoint scDINO's main_dino writes (run with epochs + 1), plus the last."""
    saved = [e for e in range(epochs + 1) if every and e % every == 0]
    return saved if epochs in saved else saved + [epochs]


def _precision(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    return {"train.precision": "auto" if value else "fp32"}


def _optimizer(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    if str(value).lower() != "adamw":
        raise UserError(f"train_scDINO.hyperparameters.optimizer={value!r}: only 'adamw' is supported")
    return {}


def _resize(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    return {"eval.resize": "shorter_side_bilinear" if _truthy(value) else "none"}


def _normalize(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    return {"eval.normalize": _truthy(value)}


def _mean_std_source(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    if not _truthy(flat.get(_CLS + "normalize", True)):
        return {}
    if _truthy(value):
        return {"data.mean_std_file": str(flat.get(_CLS + "mean_std_file_location", ""))}
    return _warn(_CLS + "norm_per_channel", flat.get(_CLS + "norm_per_channel"),
                 "write it as a JSON file {\"mean\": [...], \"std\": [...]} and use mean_std_file_location")


def _mean_patch_embedding(key: str, value: Any, flat: dict[str, Any]) -> dict[str, Any]:
    # scDINO refuses another channel count without it; here weights are always adapted, as scDINO's mean
    return {"model.channel_adaptation": "mean"}


Rule = Callable[[str, Any, dict[str, Any]], dict[str, Any]]


def _flag_warning(why: str) -> Rule:
    """A rule for a flag scDINO acts on when true and that is not implemented here."""
    return lambda key, value, flat: _warn(key, value, why) if _truthy(value) else {}


def _unless(expected: Any, why: str) -> Rule:
    """A rule for a setting whose scDINO value differs from what is done here unless it is `expected`."""
    return lambda key, value, flat: {} if value == expected else _warn(key, value, why)


_UMAP_HERE = "the UMAP here uses cosine distance, spread 1.0 and umap's default epochs, in 2-D"
_DOWNSTREAM_RULES: dict[str, Rule] = {
    _CLS + "resize": _resize,
    _CLS + "normalize": _normalize,
    _CLS + "images_are_RGB": _flag_warning("scDINO's RGB path (ImageNet normalisation, 256 px resize, "
                                           "224 px centre crop) is not implemented"),
    "attention_visualisation.image_size": _unless(None, "attention maps are drawn at eval.image_size"),
    "umap_eval.n_components": _unless(2, _UMAP_HERE),
    "umap_eval.metric": _unless("cosine", _UMAP_HERE),
    "umap_eval.spread": _unless(1.0, _UMAP_HERE),
    "umap_eval.epochs": _unless(None, _UMAP_HERE),
    "umap_eval.topometry_plots": _flag_warning("TopOMetry plots are not drawn"),
}


RULES: dict[str, Rule] = {
    "meta.output_dir": _output_dir,
    "meta.train_datasetsplit_fraction": _train_fraction,
    "meta.test_datasetsplit_fraction": _test_fraction,
    "meta.selected_channel_combination_per_run": _combinations,
    "meta.channel_dict": _channel_names,
    "meta.images_are_RGB": _flag_warning("scDINO's RGB path (PIL images, colour jitter, ImageNet-style "
                                         "normalisation) is not implemented; channels are read separately"),
    "meta.center_crop": _flag_warning("images are used whole: centre-crop the TIFFs beforehand to match"),
    "train_scDINO.epochs": _epochs,
    "train_scDINO.saveckp_freq": _saveckp_freq,
    _HP + "use_fp16": _precision,
    _HP + "optimizer": _optimizer,
    _CLS + "parse_mean_std_from_file": _mean_std_source,
    _CLS + "use_mean_patch_embedding": _mean_patch_embedding,
    _CLS + "use_custom_embedding_map": _flag_warning("only the mean patch embedding is implemented"),
    _CLS + "use_weighted_sampler": _flag_warning("features are computed on the whole held-out set"),
    _CLS + "read_model_arch_dynamically": _flag_warning("set compute_cls_features.arch and patch_size"),
    **_DOWNSTREAM_RULES,
    **{_DOWN + key: rule for key, rule in _DOWNSTREAM_RULES.items()},
}


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        section, key = dotted.split(".", 1)
        tree.setdefault(section, {})[key] = value
    return tree
