"""Profiling new plates with a trained model (training/steps/profile.py): a tiny model trained for two
steps on one synthetic screen (its pilot) embeds a second screen (another seed, one TIFF per channel)
through the profile chain's jobs, planned as `chain --profile` plans them and run here in order, each
through the command line as its Slurm script runs it.

- the checkpoint carries the model card (training/models/card.py), made from the run's own files;
- the second screen stacked in another channel order (ingest.channels, named by data.channel_names)
  gives exactly the features of the same screen stacked in the model's order: the model reads its own
  order, mapped by name; its features' index, the h5ad and the Parquet files carry the card;
- a screen missing a channel, cut at another crop size, or whose DNA and Membrane channels are named
  the other way round (so that its per-channel statistics are not the model's) is refused in one line;
- a checkpoint saved before cards still profiles: its card is rebuilt from its config, with a note;
- with eval.profile_subpopulations, the new plates' cells are counted in the pilot's subpopulations
  (its export's centres, carried by `profile`), recounted here by scipy's nearest centre; a pilot
  with another number of them is not carried, and the profile says so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from scipy.spatial.distance import cdist

from tests.support.tiny import TINY_RUN, run_cli, tiny_config
from training.chain import ChainOptions, Site, plan
from training.cli import main
from training.config import Config, dump_config, load_config
from training.data.store.read import PackedImages
from training.data.synthetic.plates import DEFAULT_CHANNEL_NAMES, ScreenSpec, write_screen
from training.models.card import PARQUET_KEY, ModelCard, read_card
from training.rundir import RunLayout
from training.rundir.features import load_features

pytestmark = pytest.mark.slow  # trains a model and runs the profile chain (about a minute)

SIZES = {"plates": 2, "batches": 2, "wells_per_plate": 16, "sites": 1, "fov_size": 128, "cells_per_fov": 8}
CROP = 32
MODEL_ORDER = DEFAULT_CHANNEL_NAMES  # Membrane, Cytoplasm, DNA, Marker, Marker2: the generator's order
OTHER_ORDER = ("DNA", "Marker", "Membrane", "Marker2", "Cytoplasm")
SCREEN_SETTINGS = {"data.label_column": "Metadata_MOA", "data.batch_column": "Metadata_Batch",
                   "data.control_column": "Metadata_Treatment", "data.control_value": "DMSO",
                   "data.holdout_fraction": 0.5, "data.num_workers": 0, "ingest.objects": "Cells"}
SITE = Site("test", 1, 1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Config]:
    """The pilot screen, a model trained on it for two steps, and the new plates (seed 1, a file per channel)."""
    root = tmp_path_factory.mktemp("profile")
    write_screen(root / "pilot", ScreenSpec(**SIZES, seed=0))
    config = tiny_config({**TINY_RUN, **SCREEN_SETTINGS, "run.output_dir": str(root / "model"),
                          "data.source": str(root / "pilot"), "data.channel_names": list(MODEL_ORDER),
                          "ingest.table": str(root / "pilot" / "load_data.csv"), "ingest.crop_size": CROP,
                          "train.max_steps_per_epoch": 2})
    for step in ("ingest", "mean-std", "pretrain"):
        assert run_cli(config, step) == 0, step
    write_screen(root / "plates", ScreenSpec(**SIZES, seed=1, per_channel_files=True))
    return root, config


def screen_config(root: Path, name: str, channels=OTHER_ORDER, names=None, **overrides) -> Path:
    """The new plates' config: its channels stacked in `channels` order, named `names` (default: right)."""
    config = Config().replace({**SCREEN_SETTINGS, "run.output_dir": str(root / name),
                               "data.source": str(root / "plates"), "data.channels": "01234"[:len(channels)],
                               "data.channel_names": list(names or channels), "ingest.channels": list(channels),
                               "ingest.table": str(root / "plates" / "load_data.csv"), "eval.knn_k": [5],
                               "eval.batch_size": 64, "eval.profile_normalization": ["mad_robustize"], **overrides})
    path = root / f"{name}.yaml"
    dump_config(config, path)
    return path


def profile(config: Path, model: Path, last: str = "report") -> list[str]:
    """The profile chain's jobs, run in order as their scripts run them; the labels of those that ran."""
    done = []
    for job in plan(config, ChainOptions(profile=str(model), last=last), SITE).jobs:
        if main([job.step, "--config", *job.args]) != 0:
            break
        done.append(job.label)
    return done


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), lines
    return lines[-1]


def test_the_checkpoint_carries_the_model_card_made_from_the_runs_own_files(trained):
    root, config = trained
    layout = RunLayout.from_config(config)
    saved = torch.load(layout.latest_checkpoint, map_location="cpu", mmap=True, weights_only=False)
    card = ModelCard.from_dict(saved["model_card"])
    stats = json.loads(layout.mean_std.read_text())
    assert card.channels == MODEL_ORDER and card.channel_ids == (0, 1, 2, 3, 4)
    assert card.mean == tuple(stats["mean"]) and card.std == tuple(stats["std"])
    assert (card.crop_size, card.patch_size, card.eval_image_size, card.normalization) == (CROP, 8, 32, "dataset")
    packed = PackedImages(layout.packed)
    table = root / "pilot" / "load_data.csv"
    assert card.provenance.table_sha256 == hashlib.sha256(table.read_bytes()).hexdigest()
    assert card.provenance.packed_sha256 == hashlib.sha256((layout.packed / "index.json").read_bytes()).hexdigest()
    assert (card.provenance.generator_seed, card.provenance.cells) == (0, len(packed))
    assert card.provenance.plates == ("Plate01", "Plate02") and card.provenance.batches == ("Batch1", "Batch2")
    assert (card.recipe.epochs_done, card.recipe.global_step) == (saved["epoch"], saved["global_step"]) == (1, 2)
    assert card.recipe.config_sha256 == hashlib.sha256(json.dumps(saved["config"], sort_keys=True).encode()).hexdigest()
    assert card.notes == ()


def test_another_channel_order_gives_the_features_of_the_models_order_and_the_export_carries_the_card(trained):
    root, config = trained
    model = Path(config.run.output_dir)
    assert profile(screen_config(root, "in_model_order", MODEL_ORDER), model, last="features")[-1] == "features"
    # the screen's config asks for another reading; the model's card decides it (training/eval/profiles/new_plates.py)
    asks = {"eval.tta": "dihedral"}
    assert profile(screen_config(root, "in_other_order", OTHER_ORDER, **asks), model) == [
        "profile-setup", "ingest", "mean-std", "profile-check", "features", "labels", "knn", "export"]
    same, other = RunLayout(root / "in_model_order"), RunLayout(root / "in_other_order")
    # the two packs hold the channels in different orders (DNA first in the other), so the map did the work
    first = PackedImages(same.packed).read(0), PackedImages(other.packed).read(0)
    np.testing.assert_array_equal(first[1][0], first[0][2])
    assert not np.array_equal(first[0], first[1])
    assert load_config(other.profile_config).data.channels == "24013"
    assert load_config(other.profile_config).eval.tta == "none"  # the card's, not the screen config's dihedral
    expected, got = load_features(same.features("final")), load_features(other.features("final"))
    np.testing.assert_array_equal(got.indices, expected.indices)
    np.testing.assert_array_equal(got.features, expected.features)
    assert got.meta["model_card"]["channels"] == list(MODEL_ORDER)
    card = json.loads(other.model_card.read_text())
    assert card["channel_map"] == {"Membrane": 2, "Cytoplasm": 4, "DNA": 0, "Marker": 1, "Marker2": 3}
    assert card["statistics"]["problems"] == [] and card["crop_size"] == CROP
    assert anndata.read_h5ad(other.profiles_h5ad).uns["scdino"]["model_card"]["channels"].tolist() == list(MODEL_ORDER)
    for table in (other.profiles_cells, other.profiles_wells, other.profiles_wells_normalized):
        assert json.loads(pq.read_schema(table).metadata[PARQUET_KEY])["channels"] == list(MODEL_ORDER)
    assert "map" in json.loads(other.knn_json.read_text())["tags"]["final"]


def test_a_screen_missing_a_channel_is_refused_in_one_line(trained, capsys):
    root, config = trained
    path = screen_config(root, "missing", OTHER_ORDER[:4])
    assert main(["profile", "--config", str(path), "--model", config.run.output_dir, "--stage", "setup"]) == 2
    assert error_line(capsys) == ("error: the new screen lacks channel Cytoplasm of the model (it reads Membrane, "
                                  "Cytoplasm, DNA, Marker, Marker2, in that order; the screen has DNA, Marker, "
                                  "Membrane, Marker2): name the screen's channels as the model's card does with "
                                  "data.channel_names")


def test_another_crop_size_is_refused_in_one_line(trained, capsys):
    root, config = trained
    path = screen_config(root, "crop", **{"ingest.crop_size": 40})
    assert main(["profile", "--config", str(path), "--model", config.run.output_dir, "--stage", "setup"]) == 2
    assert error_line(capsys).endswith(f"learnt from {CROP} px crops: set ingest.crop_size={CROP} (or 0), so that "
                                       "cells are seen at the scale it learnt")


def test_channels_named_the_other_way_round_are_refused_by_their_statistics(trained, capsys):
    """DNA and Membrane swapped in data.channel_names: DNA's mean is about half the others' (card.STATS_FACTOR)."""
    root, config = trained
    swapped = ("Membrane", "Marker", "DNA", "Marker2", "Cytoplasm")
    path = screen_config(root, "swapped", OTHER_ORDER, names=swapped)
    assert profile(path, Path(config.run.output_dir)) == ["profile-setup", "ingest", "mean-std"]
    line = error_line(capsys)
    assert line.startswith("error: the screen's per-channel statistics are not the model's (allowed: within 1.5x "
                           "either way): Membrane: mean ") and "x below the model's" in line and "DNA: mean " in line
    assert not RunLayout(root / "swapped").features_root.exists()


def test_a_checkpoint_saved_before_cards_profiles_with_its_card_rebuilt(trained, caplog):
    root, config = trained
    layout = RunLayout.from_config(config)
    saved = torch.load(layout.latest_checkpoint, map_location="cpu", weights_only=False)
    old = layout.epoch_checkpoint(0)  # beside the latest, as a run's numbered checkpoint lies
    torch.save({key: value for key, value in saved.items() if key != "model_card"}, old)
    try:
        rebuilt = read_card(old)
        assert "saved before model cards" in caplog.text
        assert rebuilt.notes[0].startswith("rebuilt when read from checkpoint_0000.pth, saved before model cards")
        assert rebuilt.to_dict() | {"notes": []} == saved["model_card"] | {"notes": []}
        path = screen_config(root, "old")
        assert main(["profile", "--config", str(path), "--model", str(old), "--stage", "setup"]) == 0
        assert json.loads(RunLayout(root / "old").model_card.read_text())["card"]["notes"] == list(rebuilt.notes)
    finally:
        old.unlink()


def test_the_whole_profile_here_stops_at_the_first_refusal(trained, capfd):
    """`profile` without --stage runs each job in its own process; the setup's refusal ends it."""
    root, config = trained
    path = screen_config(root, "whole", **{"ingest.crop_size": 48})
    assert main(["profile", "--config", str(path), "--model", config.run.output_dir]) == 2
    err = capfd.readouterr().err
    assert "error: ingest.crop_size=48" in err and not RunLayout(root / "whole").profile_config.exists()


def test_new_plates_are_counted_in_the_pilots_subpopulations(trained, caplog):
    """The pilot's export fits 4 subpopulations; the new plates' export counts its cells in those
    (profile copies them beside its config), so that its shares and the pilot's are of the same
    cell states. A screen config asking for 3 gets its own, with a warning that they do not compare."""
    import logging

    root, config = trained
    pilot = config.replace({"eval.profile_subpopulations": 4})
    for step in ("features", "export"):
        assert run_cli(pilot, step) == 0, step
    fitted = RunLayout.from_config(pilot).profiles_subpopulations
    model = Path(config.run.output_dir)
    assert profile(screen_config(root, "counted", **{"eval.profile_subpopulations": 4}), model, last="export")[-1] == \
        "export"
    layout = RunLayout(root / "counted")
    assert load_config(layout.profile_config).eval.profile_subpopulation_centres == str(layout.model_subpopulations)
    assert json.loads(layout.model_card.read_text())["subpopulations"] == {"centres": str(layout.model_subpopulations),
                                                                         "from": str(fitted)}
    assert layout.model_subpopulations.read_bytes() == fitted.read_bytes()
    centres = pd.read_parquet(fitted)
    names = [c for c in centres.columns if not c.startswith("Metadata_")]
    cells = pd.read_parquet(layout.profiles_cells)
    unit = cells[names].to_numpy(np.float64)
    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
    cells["nearest"] = np.argmin(cdist(unit, centres[names].to_numpy(np.float64)), axis=1)
    strata = ["Metadata_Plate", "Metadata_Well"]
    expected = pd.crosstab([cells[s] for s in strata], cells["nearest"], normalize="index").reindex(
        columns=range(4), fill_value=0.0).sort_index()
    shares = pd.read_parquet(layout.profiles_wells_subpopulations).set_index(strata).sort_index()
    np.testing.assert_allclose(shares[centres["Metadata_Subpopulation"]].to_numpy(), expected.to_numpy(), atol=1e-6)
    about = json.loads(pq.read_schema(layout.profiles_subpopulations).metadata[b"scdino.subpopulations"])
    assert about["carried_from"] == str(layout.model_subpopulations) and about["fitted"]["run"] == pilot.run.name
    # the drift of the new plates' DMSO wells from the pilot's, as half the L1 distance of their mean shares
    pilot_shares = pd.read_parquet(RunLayout.from_config(pilot).profiles_wells_subpopulations)
    columns = list(centres["Metadata_Subpopulation"])

    def dmso(table):
        return table[table["Metadata_Treatment"] == "DMSO"][columns].to_numpy().mean(axis=0)

    shift = 0.5 * np.abs(dmso(shares) - dmso(pilot_shares)).sum()
    record = json.loads(layout.profiles_manifest.read_text())["wells"]
    versus = record["subpopulations_versus_pilot"]
    assert versus["controls_shift"] == pytest.approx(shift, abs=1e-4) and 0 < shift < 1
    assert record["subpopulation_centres"] == str(layout.model_subpopulations)

    # each mechanism's signature (its treated wells' mean shares less DMSO's), new plates against the pilot's
    def signatures(table):
        treated = table[table["Metadata_Treatment"] != "DMSO"]
        means = treated.groupby("Metadata_MOA", observed=True)[columns].mean() - dmso(table)
        return means / np.linalg.norm(means.to_numpy(), axis=1, keepdims=True)

    ours, theirs = signatures(shares), signatures(pilot_shares)
    cosine = ours.to_numpy() @ theirs.loc[ours.index].to_numpy().T  # both in the same mechanism order
    n = len(cosine)
    assert versus["perturbations"] == n >= 2
    assert versus["nearest_is_itself"] == int((cosine.argmax(axis=1) == np.arange(n)).sum())
    assert versus["cosine_same"] == pytest.approx(np.trace(cosine) / n, abs=1e-3)
    assert versus["cosine_others"] == pytest.approx((cosine.sum() - np.trace(cosine)) / (n * n - n), abs=1e-3)
    with caplog.at_level(logging.WARNING):
        assert profile(screen_config(root, "own", **{"eval.profile_subpopulations": 3}), model,
                       last="profile-setup") == ["profile-setup"]
    record = json.loads(RunLayout(root / "own").model_card.read_text())["subpopulations"]
    assert record["fitted"] == "on the new plates' cells" and "holds 4 subpopulations" in record["why"]
    assert "compare among these plates only" in caplog.text
    assert not load_config(RunLayout(root / "own").profile_config).eval.profile_subpopulation_centres
