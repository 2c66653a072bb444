"""Every figure of a run, each drawn from the files its step wrote, listed in plots/manifest.json.

A figure whose input is missing is skipped with a warning naming the step that makes it; the report
reads the manifest to know what exists, with titles and captions.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from training.config import Config
from training.errors import MissingInputError
from training.plots.accuracy import plot_confusion, plot_knn_vs_epoch, plot_knn_vs_k, plot_screen_measures
from training.plots.attention import cls_attention, plot_attention
from training.plots.common import save_figure
from training.plots.curves import plot_training_curves
from training.plots.embedding import MAX_LEGEND, plot_embedding, umap_embedding
from training.rundir import RunLayout, tags
from training.rundir.artifacts import final_weights, load_knn, load_labels, read_metrics, read_optional_json
from training.rundir.features import list_tags, load_features
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlotEntry:
    """One figure: its PNG (and PDF) relative to the plots folder, a section and a caption."""

    section: str
    title: str
    png: str
    pdf: str | None
    caption: str


def _entry(section: str, title: str, paths: list[Path], caption: str) -> PlotEntry:
    pdf = next((p.name for p in paths if p.suffix == ".pdf"), None)
    return PlotEntry(section, title, paths[0].name, pdf, caption)


def umap_plots(config: Config, layout: RunLayout, out: Path) -> list[PlotEntry]:
    """One UMAP per feature tag (each checkpoint epoch and the baselines), seeded, of the cells
    labels.json lists (at most eval.umap_max_points of them, a seeded sample stratified by class),
    coloured by class; the trained model's and the baselines' again by each column of
    eval.umap_color_columns (by default data.batch_column)."""
    from training.data.split import stratified_sample

    labels = load_labels(layout)
    classes, rows = np.asarray(labels["labels"], np.int64), np.asarray(labels["indices"], np.int64)
    keep = stratified_sample(classes, np.arange(len(rows)), config.eval.umap_max_points, config.run.seed)
    shown = f"{len(keep)} of the {len(rows)}" if len(keep) < len(rows) else f"{len(rows)}"
    colourings = umap_colourings(config, rows[keep])
    entries = []
    for tag in sorted(list_tags(layout.features_root), key=tags.sort_key):
        feature_set = load_features(layout.features(tag), rows=rows[keep])
        embedding = umap_embedding(feature_set.features, seed=config.run.seed,
                                   n_neighbors=config.eval.umap_neighbors, min_dist=config.eval.umap_min_dist)
        name = tags.label(tag, feature_set.meta.get("epoch"))
        about = f"{shown} evaluated held-out cells, {feature_set.dim}-d features, coloured by"
        title = f"UMAP of {name} features"
        paths = save_figure(plot_embedding(embedding, classes[keep], labels["class_names"], title), out, f"umap_{tag}")
        entries.append(_entry("umap", title, paths, f"{about} class."))
        for column, (codes, names) in colourings.items() if tag in tags.HEADLINE else ():
            title = f"UMAP of {name} features by {column}"
            paths = save_figure(plot_embedding(embedding, codes, names, title), out, f"umap_{tag}_{_safe(column)}")
            entries.append(_entry("umap", title, paths, f"{about} {column}{_repeat_note(names)}."))
    return entries


def umap_colourings(config: Config, rows: np.ndarray) -> dict[str, tuple[np.ndarray, list[str]]]:
    """(codes, names) of each column eval.umap_color_columns names (default: data.batch_column) at
    the table `rows`; none for a dataset without a per-cell table."""
    from training.data.dataset import open_images

    columns = config.eval.umap_color_columns or ((config.data.batch_column,) if config.data.batch_column else ())
    if not columns:
        return {}
    table = getattr(open_images(config), "table", None)
    if table is None:
        log.info("a TIFF folder has no per-cell table: UMAPs coloured by class only")
        return {}
    found = {}
    for column in columns:
        name = table.find(column, "eval.umap_color_columns")
        categories = table.categories(name)
        found[name] = (categories.codes[rows], categories.names)
    return found


def _repeat_note(names: list[str]) -> str:
    return f" ({len(names)} values: colours repeat, no legend)" if len(names) > MAX_LEGEND else ""


def knn_plots(knn: dict[str, Any], out: Path) -> list[PlotEntry]:
    """Accuracy versus k, versus epoch (when epochs were evaluated), confusion matrices."""
    entries = [_entry("knn", "kNN accuracy versus k", save_figure(plot_knn_vs_k(knn), out, "knn_vs_k"),
                      "Top-1 accuracy of the weighted kNN for each k; baselines dashed/dotted.")]
    if sum(1 for e in knn["tags"].values() if e.get("kind") == "checkpoint" and e.get("epoch") is not None) >= 1:
        entries.append(_entry("knn", "kNN accuracy versus epoch",
                              save_figure(plot_knn_vs_epoch(knn), out, "knn_vs_epoch"),
                              "Top-1 accuracy at the best k of each checkpoint; baselines as horizontal lines."))
    if "not_same_batch" in knn or "map" in knn:
        entries.append(_entry("knn", "Plain kNN, not-same-batch kNN and mAP",
                              save_figure(plot_screen_measures(knn), out, "screen_measures"),
                              "Top-1 at each one's best k; mAP of the per-well profiles by treatment, x 100. A "
                              "plain kNN far above the not-same-batch one shows neighbours found by batch."))
    for tag in [t for t in tags.HEADLINE if t in knn["tags"]]:
        entry = knn["tags"][tag]
        title = f"Confusion matrix, {tags.label(tag, entry.get('epoch'))}, k={entry['best_k']}"
        fig = plot_confusion(np.asarray(entry["confusion"]), knn["class_names"], title)
        entries.append(_entry("confusion", title, save_figure(fig, out, f"confusion_{tag}"),
                              "Rows: true class (normalised to 1); numbers: query images."))
    return entries


def curve_plots(config: Config, layout: RunLayout, out: Path) -> list[PlotEntry]:
    """Training curves from metrics.jsonl."""
    records = read_metrics(layout)
    if not records:
        log.warning("%s is empty: no training curves", layout.metrics)
        return []
    fig = plot_training_curves(records, f"Pretraining of {config.run.name}")
    return [_entry("curves", "Training curves", save_figure(fig, out, "training_curves"),
                   f"From {layout.metrics.name}: per logged step and per epoch.")]


def comparison_plots(layout: RunLayout, comparison: dict[str, Any]) -> list[PlotEntry]:
    """The channel-combination figure, added to the run's manifest in place of an earlier one."""
    from training.eval.compare import adaptive_models
    from training.plots.combinations import plot_combinations

    paths = save_figure(plot_combinations(comparison), layout.plots, "channel_combinations")
    adaptive = " and the channel-adaptive models on the same channels" if adaptive_models(comparison) else ""
    entry = _entry("combinations", "kNN accuracy per channel combination", paths,
                   f"Trained model and baselines of each combination's own run{adaptive}, top-1 at the best k; "
                   "dashed: the model trained on all channels.")
    kept = [e for e in read_manifest(layout) if e.section != "combinations"]
    write_manifest(layout, [*kept, entry])
    return [entry]


def write_manifest(layout: RunLayout, entries: list[PlotEntry]) -> None:
    """The plots manifest: what the report embeds, in drawing order."""
    write_json_atomic(layout.plots_manifest, [asdict(e) for e in entries])


def read_manifest(layout: RunLayout) -> list[PlotEntry]:
    """The figures `plots` drew; empty when it has not run."""
    return [PlotEntry(**e) for e in read_optional_json(layout.plots_manifest, "plots") or []]


def channel_names(config: Config) -> list[str]:
    """Names of the selected channels for titles: data.channel_names, else ch<digit>."""
    return list(config.data.channel_names) or [f"ch{c}" for c in config.data.channels]


def _one_image_per_class(labels: dict[str, Any], seed: int, per_class: int) -> list[tuple[int, int]]:
    """(dataset index, class) pairs drawn with a seeded generator, `per_class` of each class."""
    rng = np.random.default_rng(seed)
    indices, classes = np.asarray(labels["indices"]), np.asarray(labels["labels"])
    chosen = []
    for cls in range(len(labels["class_names"])):
        members = indices[classes == cls]
        chosen += [(int(i), cls) for i in rng.permutation(members)[:per_class]]
    return chosen


def attention_plots(config: Config, labels: dict[str, Any], checkpoint: Path, out: Path) -> list[PlotEntry]:
    """Attention maps of the final teacher for one held-out image per class."""
    from training.data.dataset import open_dataset
    from training.data.loading.augment import normalise
    from training.data.stats import load_mean_std
    from training.models.pretrained import load_backbone

    mean, std = (torch.tensor(v).view(-1, 1, 1) for v in load_mean_std(config))
    dataset = open_dataset(config)
    model = load_backbone(checkpoint, config.model, dataset.in_chans, which=config.eval.checkpoint_key,
                          normalization=config.data.normalization).eval()
    size, entries = config.eval.image_size, []
    for index, cls in _one_image_per_class(labels, config.run.seed, config.eval.attention_images_per_class):
        source = dataset[index][0][None]
        image = F.interpolate(source, size=(size, size), mode="bilinear", antialias=True)
        normalised = normalise(image, source, mean, std, config.data.per_image_normalization)[0]
        maps = cls_attention(model, normalised, config.model.patch_size)
        name = labels["class_names"][cls]
        title = f"{name}: {dataset.paths[index]}"
        fig = plot_attention(image[0].numpy(), maps, channel_names(config), title)
        stem = f"attention_{_safe(name)}_{index}"
        entries.append(_entry("attention", f"Attention, {name}", save_figure(fig, out, stem, pdf=False),
                              "Top: input channels; bottom: CLS attention of each head in the last block."))
    return entries


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def figure_groups(config: Config, layout: RunLayout, *, umap: bool, attention: bool) -> list[tuple]:
    """(name, input present?, missing input, producing step, draw function) per figure group."""
    out = layout.plots
    features_root = layout.features_root
    knn_json = layout.knn_json
    checkpoint = final_weights(layout)

    def attention_maps() -> list[PlotEntry]:
        return attention_plots(config, load_labels(layout), checkpoint, out)

    groups: list[tuple[str, bool, object, str, Callable[[], list[PlotEntry]]]] = [
        ("training curves", layout.metrics.is_file(), layout.metrics, "pretrain",
         lambda: curve_plots(config, layout, out)),
        ("kNN plots", knn_json.is_file(), knn_json, "knn",
         lambda: knn_plots(load_knn(layout), out)),
    ]
    if umap:
        groups.append(("UMAPs", bool(list_tags(features_root)), features_root, "features",
                       lambda: umap_plots(config, layout, out)))
    if attention:
        ready = checkpoint.is_file() and layout.labels.is_file()
        missing, step = (checkpoint, "pretrain") if not checkpoint.is_file() else (layout.labels, "labels")
        groups.append(("attention maps", ready, missing, step, attention_maps))
    return groups

def draw_all(config: Config, layout: RunLayout, *, umap: bool = True, attention: bool = True) -> list[PlotEntry]:
    """Draw every figure group whose input exists and write the manifest; fail only when none does."""
    entries: list[PlotEntry] = []
    missing: list[MissingInputError] = []
    for name, ready, path, step, draw in figure_groups(config, layout, umap=umap, attention=attention):
        if not ready:
            missing.append(MissingInputError(f"input of the {name}", path, step))
            log.warning("no %s: %s", name, missing[-1])
            continue
        log.info("drawing %s", name)
        entries.extend(draw())
    if not entries:
        raise missing[0] if missing else MissingInputError("run outputs", layout.root, "pretrain")
    write_manifest(layout, entries)
    log.info("wrote %d figures to %s", len(entries), layout.plots)
    return entries
