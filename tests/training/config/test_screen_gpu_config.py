"""configs/screen-gpu.yaml, a real screen on the GPU cluster: it loads with the package's loader and
passes the checks its steps make before they start; it carries configs/screen.yaml's profiling
recipe; ViT-S/16 at a batch every preset's GPU holds by the planner's memory model; its paths are
where the cluster's nodes see the bucket's data/; and every key its comment block tells a lab to
edit is a real key."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

import pytest

from training.config import load_config
from training.config.dotted import hint_of
from training.config.schema import Config
from training.costs.flops import activation_bytes_per_image, params_estimate
from training.costs.instances import INSTANCES
from training.data.ingest.checks import check_settings
from training.eval.profiles.new_plates import EVALUATION_SETTINGS
from training.eval.profiles.normalization import check_steps
from training.planning.model import GPU_MEMORY_FRACTION, replicated_state_gb
from training.upload.screen_table import FSX_DATA

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
GPU_SCREEN = CONFIGS / "screen-gpu.yaml"
PROFILING = ("data.label_column", "data.batch_column", "data.control_column", "data.control_value",
             "eval.perturbation_column", "eval.consistency_column", "eval.profile_normalization",
             "eval.mad_robustize_samples", "eval.spherize_shrinkage", "eval.activity_negatives", "eval.knn_whiten",
             "eval.knn_folds", "eval.feature", "eval.tta", "eval.profile_subpopulations",
             "eval.profile_subpopulations_weight",
             "ingest.edge", "ingest.min_area", "ingest.cellprofiler")
"""The screen recipe's reading of a screen (configs/screen.yaml), which the GPU config keeps."""


@pytest.fixture(scope="module")
def config() -> Config:
    return load_config(GPU_SCREEN)


def value(config: Config, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def test_it_loads_and_passes_the_checks_its_steps_make(config):
    check_settings(config)
    check_steps(config.eval.profile_normalization, controls=bool(config.data.control_column),
                batches=bool(config.data.batch_column), mad_samples=config.eval.mad_robustize_samples)
    assert config.ingest.crop_size >= config.model.patch_size
    assert config.data.in_chans == len(config.ingest.channels) == len(config.data.channel_names) == 5


def test_it_keeps_the_screen_recipes_profiling(config):
    recipe = load_config(CONFIGS / "screen.yaml")
    assert {key: value(config, key) for key in PROFILING} == {key: value(recipe, key) for key in PROFILING}


THE_SCREENS_OWN = {"data.source", "data.channel_names", "ingest.table", "ingest.channels"}
"""Where the new plates are and how their files name and stack the channels."""
THE_MODELS = {"ingest.crop_size"} | {f"eval.{key}" for key in EVALUATION_SETTINGS}
"""What `profile` takes from the model's card (training/eval/profiles/new_plates.py)."""


def test_the_new_plates_are_read_as_the_model_was():
    """configs/screen_new_plates.yaml repeats screen.yaml's reading of a screen by hand: every data,
    ingest and eval setting is the recipe's but where the screen's files or the model's card decide."""
    recipe, new_plates = load_config(CONFIGS / "screen.yaml"), load_config(CONFIGS / "screen_new_plates.yaml")
    differ = sorted(f"{section}.{key}" for section in ("data", "ingest", "eval")
                    for key, setting in asdict(getattr(recipe, section)).items()
                    if setting != asdict(getattr(new_plates, section))[key])
    assert set(differ) <= THE_SCREENS_OWN | THE_MODELS, sorted(set(differ) - THE_SCREENS_OWN - THE_MODELS)
    assert {"data.source", "data.channel_names"} <= set(differ), "the check would pass on a copy of the recipe"


@pytest.mark.parametrize("name", ["screen.yaml", "screen-gpu.yaml", "screen_new_plates.yaml"])
def test_mean_well_profiles_go_with_the_imaging_step(name):
    """Mean well profiles paid only with the imaging step (docs/performance.md, "Wells by their mean"):
    without it they cost the model activity on all seven CPU screens. So a screen config trains with the
    step exactly when it profiles by the mean; the new plates' config reads as the model it profiles with
    (make screen's) was read."""
    config = load_config(CONFIGS / name)
    trained_by = load_config(CONFIGS / "screen.yaml") if name == "screen_new_plates.yaml" else config
    stepped = trained_by.dino.noise_p > 0 and trained_by.dino.black_level_p > 0
    assert (config.eval.profile_aggregation == "mean") == stepped, name


def test_vit_s16_at_a_batch_every_presets_gpu_holds(config):
    assert (config.model.arch, config.model.patch_size) == ("vit_small", 16)
    needed = replicated_state_gb(params_estimate(config)) + (
        config.optim.batch_size_per_gpu * activation_bytes_per_image(config) / 1e9)
    smallest = min(facts.gpu.memory_gb for facts in INSTANCES.values())
    assert needed <= GPU_MEMORY_FRACTION * smallest, f"{needed:.1f} GB at batch {config.optim.batch_size_per_gpu}"
    assert needed > GPU_MEMORY_FRACTION * smallest / 2, "the batch should use the GPU, not a sliver of it"


def test_its_paths_are_where_the_nodes_see_the_bucket(config):
    assert config.data.source.startswith(FSX_DATA + "/")
    assert config.ingest.table.startswith(config.data.source + "/")
    assert not config.run.output_dir.startswith("/"), "runs land in the folder the pipeline is submitted from"


def test_every_key_the_comment_block_names_is_a_key():
    header = GPU_SCREEN.read_text().split("\nrun:")[0]
    block = header[header.index("What a lab edits"):]
    named = set(re.findall(r"\b(?:data|ingest|eval|optim|model|dino|train|run)\.[a-z_]+", block))
    bare = set(re.findall(r"(?<=, )(batch_column|control_column|control_value)\b", block))
    named |= {f"data.{key}" for key in bare}
    assert len(named) >= 12
    assert sorted(key for key in named if hint_of(Config, key) is None) == []
    edited = {line.split(":")[0].strip() for line in GPU_SCREEN.read_text().splitlines() if "# EDIT" in line}
    assert edited <= {key.split(".")[1] for key in named}, edited
