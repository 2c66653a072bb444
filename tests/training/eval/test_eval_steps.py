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
