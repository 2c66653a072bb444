"""Each downstream step, run through the CLI, names the step to run first when its input is missing."""

import pytest

from training.cli import main


@pytest.fixture
def empty_run(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"run:\n  output_dir: {tmp_path / 'run'}\ndata:\n  source: {tmp_path / 'images'}\n")
    return config


@pytest.mark.parametrize(
    ("step", "needed"),
    [("features", "pretrain"), ("knn", "labels"), ("linear", "labels"), ("plots", "pretrain"),
     ("report", "plots")],
)
def test_missing_input_names_the_step_to_run_first(empty_run, capsys, step, needed):
    assert main([step, "--config", str(empty_run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"run `python -m training {needed}` first" in err[0]


def test_knn_with_labels_but_no_features_names_features(empty_run, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "labels.json").write_text('{"class_names": ["a"], "labels": [0], "indices": [0], "paths": ["a/x.tif"]}')
    assert main(["knn", "--config", str(empty_run)]) == 2
    assert "run `python -m training features` first" in capsys.readouterr().err


@pytest.mark.slow
def test_the_channel_adaptive_model_is_evaluated_on_a_combination_from_its_own_checkpoint(tmp_path):
    """data.compare_channel_adaptive end to end on CPU: one tiny bag-of-channels pretraining, then
    the evaluation steps on combination 02 read its checkpoint and only channels 0 and 2, each
    encoded on its own and concatenated; knn again with eval.knn_whiten says so in its files."""
    import json

    from tests.support.eval_tiny_run import run_dir, run_step, write_config, write_images
    from training.rundir import RunLayout
    from training.rundir.features import load_features

    write_images(tmp_path / "images")
    config = write_config(tmp_path, data={"channel_combinations": ["0", "02"], "compare_channel_adaptive": True},
                          optim={"epochs": 1})
    model_run = ["--set", "run.channel_adaptive=bag_of_channels"]
    assert run_step(config, "mean-std") == 0
    assert run_step(config, "pretrain", *model_run) == 0
    on_02 = [*model_run, "--set", "run.combination=02"]
    assert run_step(config, "features", *on_02, "--epochs", "none") == 0
    for step in ("labels", "knn", "linear"):
        assert run_step(config, step, *on_02) == 0, step
    parent = RunLayout(run_dir(config))
    model = parent.channel_adaptive("bag_of_channels")
    evaluation = model.evaluation("02")
    final = json.loads((evaluation.features("final") / "index.json").read_text())
    assert final["checkpoint"] == str(model.latest_checkpoint) and final["channels"] == "02"
    assert final["dim"] == 3 * 192 and final["bag_combine"] == "concat_pairs", \
        "ViT-tiny's CLS for channel 0, channel 2 and their mean image, concatenated"
    raw = load_features(evaluation.features("raw_pixels"))
    assert raw.features.shape[1] == 2 * 4 * 4, "two channels, pooled to eval.raw_pixels_size=4"
    assert not (evaluation.root / "checkpoints").exists() and not (parent.root / "checkpoints").exists()
    assert set(json.loads(evaluation.knn_json.read_text())["tags"]) == {"final", "raw_pixels", "random_init"}
    assert evaluation.linear_json.is_file()
    assert json.loads(evaluation.knn_json.read_text())["whitened"] is False
    assert run_step(config, "knn", *on_02, "--set", "eval.knn_whiten=true") == 0  # the concatenation whitened
    whitened = json.loads(evaluation.knn_json.read_text())
    assert whitened["whitened"] is True and set(whitened["tags"]) == {"final", "raw_pixels", "random_init"}
    assert "features whitened (eval.knn_whiten)" in evaluation.knn_md.read_text()
    assert run_step(config, "report", *on_02) == 0
    assert "features whitened (eval.knn_whiten)" in evaluation.report.read_text()
