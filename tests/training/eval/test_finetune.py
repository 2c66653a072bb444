"""`linear --finetune`: the pretrained backbone and a linear head trained together, on one and two ranks."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from tests.support.eval_tiny_run import CLASSES, pretrained_run, run_dir, run_step
from training.config import Config, ConfigError
from training.report.html import build_report
from training.rundir import RunLayout

pytestmark = pytest.mark.slow

# 7 held-out images per class (0.45 of 16), of which the kNN split gives 4 to training and 3 to
# validation: 12 training images, an even share for each of 2 ranks (so 2 ranks of 2 images per
# batch see the same global batches as 1 rank of 4), and 9 validation images that are not (rank 0
# gets 5, rank 1 gets 4: 3 and 2 batches of 2, so FSDP's collective forwards must be kept in step).
# No flips: they are drawn per rank, and the runs on one and two ranks must see the same images.
SETTINGS = ("data.holdout_fraction=0.45", "eval.knn_train_fraction=0.6", "eval.batch_size=2",
            "eval.finetune_epochs=4", "eval.finetune_lr=0.003", "eval.finetune_flips=false")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The tiny pretrained run's config."""
    return pretrained_run(tmp_path_factory)


def fresh_run(source, directory, *settings, checkpoint=True, labels=True) -> list[str]:
    """A new run directory with the tiny run's mean/std, optionally its latest checkpoint (linked)
    and labels.json; returns the `--set` arguments that point a step at it."""
    directory.mkdir(parents=True)
    shutil.copy(run_dir(source) / "mean_std.json", directory)
    if checkpoint:
        (directory / "checkpoints").mkdir()
        os.symlink(run_dir(source) / "checkpoints" / "checkpoint.pth", directory / "checkpoints" / "checkpoint.pth")
    overrides = [arg for value in (f"run.output_dir={directory}", *SETTINGS, *settings) for arg in ("--set", value)]
    if labels:
        assert run_step(source, "labels", *overrides) == 0
    return overrides


@pytest.fixture(scope="module")
def single(source, tmp_path_factory):
    """One process, 4 images per batch: the run directory and its --set arguments."""
    directory = tmp_path_factory.mktemp("finetune") / "single"
    overrides = fresh_run(source, directory, "eval.finetune_batch_size=4")
    assert run_step(source, "linear", "--finetune", *overrides) == 0
    return directory, overrides


def history(directory, key):
    return [entry[key] for entry in json.loads((directory / "linear" / "finetune.json").read_text())["history"]]


def test_one_process_lowers_the_loss_and_reports_every_epoch(single, source):
    directory, _ = single
    result = json.loads((directory / "linear" / "finetune.json").read_text())
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3, 4]
    losses = history(directory, "train_loss")
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(0.0 <= h["val_top1"] <= 1.0 and h["val_images"] == 9 for h in result["history"])
    assert (result["n_train"], result["n_val"], result["world_size"], result["parallel"]) == (12, 9, 1, "single")
    assert result["class_names"] == list(CLASSES) and result["checkpoint_epoch"] == 2
    assert result["final_top1"] == result["history"][-1]["val_top1"] <= result["best_top1"]
    assert "| fine-tuned (single) | 2 " in (directory / "linear" / "finetune.md").read_text()
    assert not (directory / "linear" / "linear.json").exists()  # the probe did not run


def test_the_backbone_is_trained_not_frozen(single, source):
    directory, _ = single
    tuned = torch.load(directory / "linear" / "finetune.pth", weights_only=False)["model"]
    pretrained = torch.load(run_dir(source) / "checkpoints" / "checkpoint.pth", weights_only=False)["teacher"]
    assert tuned["head.weight"].shape == (len(CLASSES), 192)
    for key in ("backbone.blocks.0.attn.qkv.weight", "backbone.pos_embed"):
        assert tuned[key].shape == pretrained[key].shape
        assert not torch.equal(tuned[key], pretrained[key]), key


def test_a_rerun_repeats_the_history_exactly(single, source):
    directory, overrides = single
    before = json.loads((directory / "linear" / "finetune.json").read_text())["history"]
    assert run_step(source, "linear", "--finetune", *overrides) == 0
    assert json.loads((directory / "linear" / "finetune.json").read_text())["history"] == before


def torchrun(args: list[str], timeout: float = 120) -> tuple[int, str]:
    """Exit status and output of `torchrun --nproc_per_node 2 ARGS`. A rank still waiting after
    `timeout` seconds fails the test; SIGTERM lets torchrun stop its workers (each runs in a session
    of its own, out of reach of a kill of the launcher's process group)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"torchrun still running after {timeout} s (a rank waits in a collective):\n{output[-3000:]}")
    return process.returncode, output


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_torchrun_ranks_reproduce_one_process(single, source, tmp_path, parallel):
    overrides = fresh_run(source, tmp_path / "two", "eval.finetune_batch_size=2", f"train.parallel={parallel}")
    returncode, output = torchrun(["-m", "training", "linear", "--config", str(source), "--finetune", *overrides])
    assert returncode == 0, output[-3000:]
    assert "rank 0/2 took 12 training steps" in output and "rank 1/2 took 12 training steps" in output
    assert len(re.findall(r"wrote \S+finetune\.json", output)) == 1  # rank 0 alone writes
    result = json.loads((tmp_path / "two" / "linear" / "finetune.json").read_text())
    assert (result["world_size"], result["parallel"]) == (2, parallel)
    assert history(tmp_path / "two", "val_images") == [9] * 4  # both shards, no image twice
    # an image on a decision boundary may flip with the summation order of the all-reduce: one of 9
    assert history(tmp_path / "two", "val_top1") == pytest.approx(history(single[0], "val_top1"), abs=1 / 9 + 1e-9)
    assert history(tmp_path / "two", "train_loss") == pytest.approx(history(single[0], "train_loss"), rel=1e-3)
    state = torch.load(tmp_path / "two" / "linear" / "finetune.pth", weights_only=False)["model"]
    assert state["head.weight"].shape == (len(CLASSES), 192)  # gathered whole, also from FSDP shards


def test_training_images_follow_per_image_normalisation(source, single):
    """Fine-tuning reads its training images as `features` does: under data.normalization=per_image,
    each image instance-normalised (torch's reference), then resized."""
    from torch.nn import functional as F

    from training.config import load_config
    from training.data.dataset import open_images, to_scaled_tensor
    from training.data.loading.augment import resize_full
    from training.distributed.groups import DistContext, DistEnv
    from training.eval.finetune import build_train_loader, finetune_inputs

    _, overrides = single
    config = load_config(source, [o for o in overrides if o != "--set"] + ["data.normalization=per_image"])
    _, data = finetune_inputs(config, RunLayout.from_config(config))
    loader, _ = build_train_loader(config, data, DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None))
    images, _, indices = next(iter(loader))
    stored = open_images(config)
    sources = torch.stack([to_scaled_tensor(stored.read(int(i)), config.data.channel_indices) for i in indices])
    expected = resize_full(F.instance_norm(sources, eps=1e-7), config.eval.image_size)
    torch.testing.assert_close(images, expected, atol=2e-4, rtol=0)


def test_flips_only_mirror_images_and_follow_the_batch_seed():
    from training.eval.finetune import RandomFlips

    images = torch.arange(8 * 2 * 4 * 4, dtype=torch.float32).reshape(8, 2, 4, 4)
    flip = RandomFlips(lambda images, labels, idx, generator: (images, labels, idx))
    out, _, _ = flip(images, None, None, torch.Generator().manual_seed(3))
    again, _, _ = flip(images, None, None, torch.Generator().manual_seed(3))
    assert torch.equal(out, again)
    mirrors = [lambda x: x, lambda x: x.flip(-1), lambda x: x.flip(-2), lambda x: x.flip(-1, -2)]
    kinds = [next(k for k, m in enumerate(mirrors) if torch.equal(out[i], m(images[i]))) for i in range(8)]
    assert len(set(kinds)) > 1, kinds  # some images flipped, not all the same way


@pytest.mark.parametrize(("key", "value"), [
    ("eval.finetune_epochs", 0), ("eval.finetune_lr", 0.0), ("eval.finetune_backbone_lr_scale", 1.5),
    ("eval.finetune_backbone_lr_scale", 0.0), ("eval.finetune_batch_size", 0), ("eval.finetune_weight_decay", -0.1),
])
def test_config_errors_name_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} must be"):
        Config().replace({key: value})


def test_cli_config_error_is_one_line(source, capsys):
    assert run_step(source, "linear", "--finetune", "--set", "eval.finetune_lr=-1") == 2
    assert capsys.readouterr().err.strip() == "error: eval.finetune_lr must be > 0, got -1.0"


@pytest.mark.parametrize(("missing", "step"), [("checkpoint", "pretrain"), ("labels", "labels")])
def test_missing_input_names_the_step_to_run_first(source, tmp_path, capsys, missing, step):
    overrides = fresh_run(source, tmp_path / "run", checkpoint=missing != "checkpoint", labels=missing != "labels")
    capsys.readouterr()
    assert run_step(source, "linear", "--finetune", *overrides) == 2
    path = tmp_path / "run" / ("checkpoints/checkpoint.pth" if missing == "checkpoint" else "labels.json")
    assert f"not found at {path}: run `python -m training {step}` first" in capsys.readouterr().err


def test_stale_labels_are_refused(source, tmp_path, capsys):
    overrides = fresh_run(source, tmp_path / "run")
    labels = json.loads((tmp_path / "run" / "labels.json").read_text())
    labels["paths"] = labels["paths"][::-1]  # e.g. the dataset changed after `labels` ran
    (tmp_path / "run" / "labels.json").write_text(json.dumps(labels))
    capsys.readouterr()
    assert run_step(source, "linear", "--finetune", *overrides) == 2
    assert "labels.json describes other images than" in capsys.readouterr().err
    assert not (tmp_path / "run" / "linear").exists()


def test_report_shows_the_fine_tuning_table_only_when_it_ran(single, tmp_path):
    html = build_report(RunLayout(single[0]), "tiny")
    assert "Fine-tuned backbone" in html and "<td>fine-tuned (single)</td>" in html
    assert "12 reference images" in html
    assert "Fine-tuned backbone" not in build_report(RunLayout(tmp_path), "empty")
