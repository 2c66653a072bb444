"""plots on a tiny real run: every figure it lists exists, has a sensible size and readable labels."""

import json

import numpy as np
import pytest

from tests.support.eval_tiny_run import CLASSES, plotted_run, png_size, run_dir
from training.plots.accuracy import plot_confusion
from training.plots.embedding import plot_embedding

pytestmark = pytest.mark.slow

TAGS = ["epoch_0001", "epoch_0002", "final", "random_init", "raw_pixels"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    plots = run_dir(plotted_run(tmp_path_factory)) / "plots"
    return plots, json.loads((plots / "manifest.json").read_text())


def test_every_promised_figure_is_listed(manifest):
    _, entries = manifest
    pngs = {e["png"] for e in entries}
    assert {f"umap_{tag}.png" for tag in TAGS} <= pngs
    assert {"knn_vs_k.png", "knn_vs_epoch.png", "training_curves.png", "confusion_final.png",
            "confusion_raw_pixels.png", "confusion_random_init.png"} <= pngs
    attention = [e for e in entries if e["section"] == "attention"]
    assert sorted(e["title"] for e in attention) == [f"Attention, {name}" for name in CLASSES]


def test_files_exist_with_readable_sizes_and_pdfs(manifest):
    plots, entries = manifest
    for entry in entries:
        width, height = png_size(plots / entry["png"])
        assert width >= 400 and height >= 250, (entry["png"], width, height)
        if entry["pdf"]:
            assert (plots / entry["pdf"]).read_bytes()[:5] == b"%PDF-"
    assert not [p.name for p in plots.iterdir() if p.name.endswith(".tmp")]
    assert all(e["pdf"] for e in entries if e["section"] != "attention")


def test_attention_figure_shows_each_channel_and_each_head(manifest):
    plots, entries = manifest
    entry = next(e for e in entries if e["section"] == "attention")
    width, height = png_size(plots / entry["png"])
    assert width > 1.5 * height  # a row of 3 channels over a row of 3 heads + their mean


def test_umap_legend_and_confusion_axes_use_class_names():
    rng = np.random.default_rng(0)
    fig = plot_embedding(rng.standard_normal((30, 2)), np.arange(30) % 3, list(CLASSES), "UMAP")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["alpha (10)", "beta (10)", "gamma (10)"]
    fig = plot_confusion(np.eye(3, dtype=int) * 4, list(CLASSES), "confusion")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list(CLASSES)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(CLASSES)


def test_umap_is_reproducible_for_a_seed(manifest):
    from training.plots.embedding import umap_embedding

    rng = np.random.default_rng(1)
    features = rng.standard_normal((40, 8)).astype(np.float32)
    first = umap_embedding(features, seed=3, n_neighbors=30, min_dist=0.4)
    again = umap_embedding(features, seed=3, n_neighbors=30, min_dist=0.4)
    assert first.shape == (40, 2)
    np.testing.assert_allclose(first, again)


def test_attention_under_per_image_normalisation_reads_instance_normalised_images(manifest, tmp_path, monkeypatch):
    """The attention maps see what the model was fed under data.normalization=per_image: each
    image's channels z-scored with their own statistics (torch's instance norm), then resized."""
    import torch
    import torch.nn.functional as F

    from training.config import load_config
    from training.data.dataset import open_dataset
    from training.plots import figures
    from training.rundir import RunLayout
    from training.rundir.artifacts import final_weights, load_labels

    plots, _ = manifest
    root = plots.parent
    config = load_config(root / "config.yaml").replace({"data.normalization": "per_image"})
    seen = []
    monkeypatch.setattr(figures, "cls_attention", lambda model, image, patch: seen.append(image) or
                        np.random.rand(3, image.shape[-2] // patch, image.shape[-1] // patch))
    layout = RunLayout.from_config(config)
    entries = figures.attention_plots(config, load_labels(layout), final_weights(layout), tmp_path)
    assert len(entries) == len(CLASSES) == len(seen)
    dataset, size = open_dataset(config), config.eval.image_size
    chosen = figures._one_image_per_class(load_labels(layout), config.run.seed, config.eval.attention_images_per_class)
    for (index, _), image in zip(chosen, seen, strict=True):
        reference = F.interpolate(F.instance_norm(dataset[index][0][None], eps=1e-7), size=(size, size),
                                  mode="bilinear", antialias=True)[0]
        torch.testing.assert_close(image, reference, atol=2e-4, rtol=0)
