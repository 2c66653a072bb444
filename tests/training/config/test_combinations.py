"""Channel combinations: the config list, a combination's run (run.combination) and its directory."""

from __future__ import annotations

import json
import logging

import pytest

from training.cli import main
from training.config import Config, ConfigError, load_config
from training.rundir import RunLayout

COMBINATIONS = {"data.channel_combinations": ["01234", "0", "13"]}


def test_no_combinations_is_one_run_on_data_channels():
    config = Config()
    assert config.data.channel_combinations == () and config.run.combination == ""
    assert RunLayout.from_config(config).root == RunLayout(config.run.output_dir).root


@pytest.mark.parametrize("combinations, message", [
    (["01", "0x"], "data.channel_combinations entries must be digits without repeats.*'0x'"),
    (["011"], "data.channel_combinations entries must be digits without repeats.*'011'"),
    ([""], "data.channel_combinations entries must be digits"),
    (["0", "1", "0"], "data.channel_combinations lists a combination twice"),
])
def test_bad_combinations_name_the_key(combinations, message):
    with pytest.raises(ConfigError, match=message):
        Config().replace({"data.channel_combinations": combinations})


def test_unquoted_yaml_combination_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  channel_combinations: [\"01\", 012]\n")  # YAML reads 012 as 10
    with pytest.raises(ConfigError, match=r"data.channel_combinations\[1\] must be quoted"):
        load_config(path)


def test_combinations_from_set_keep_leading_zeros():
    config = load_config(None, ["data.channel_combinations=01234,0,13"])
    assert config.data.channel_combinations == ("01234", "0", "13")
    assert load_config(None, ["data.channel_combinations=012"]).data.channel_combinations == ("012",)
    assert load_config(None, ['data.channel_combinations=["012", "3"]']).data.channel_combinations == ("012", "3")


def test_combination_must_be_listed_and_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"run.combination='2' is not in data.channel_combinations; "
                                          r"allowed: '01234', '0', '13'"):
        Config().replace({**COMBINATIONS, "run.combination": "2"})
    with pytest.raises(ConfigError, match=r"allowed: none"):
        Config().replace({"run.combination": "0"})


def test_combination_trains_on_its_channels_with_their_names():
    names = ["dapi", "tub", "actin", "mito", "er"]
    config = Config().replace({**COMBINATIONS, "data.channel_names": names, "run.combination": "13"})
    assert config.data.channels == "13" and config.data.channel_indices == (1, 3)
    assert config.data.channel_names == ("tub", "mito")
    again = Config().replace(config.to_dict())  # the config.yaml a combination's step writes reloads the same
    assert again == config


def test_combination_layout_has_its_own_directory_and_the_parent_data(tmp_path):
    parent = RunLayout(tmp_path / "run")
    child = parent.combination("13")
    assert child.root == tmp_path / "run" / "channels_13"
    assert child.knn_json == tmp_path / "run" / "channels_13" / "knn" / "knn.json"
    assert child.latest_checkpoint.parent == tmp_path / "run" / "channels_13" / "checkpoints"
    for name in ("split", "mean_std", "bad_images", "packed"):
        assert getattr(child, name) == getattr(parent, name), name
    config = Config().replace({**COMBINATIONS, "run.output_dir": str(tmp_path / "run"), "run.combination": "13",
                               "data.packed_dir": str(tmp_path / "nvme")})
    layout = RunLayout.from_config(config)
    assert layout.root == child.root and layout.packed == tmp_path / "nvme" and layout.split == parent.split


def test_paths_prints_combinations_and_a_combination_directory(tmp_path, capsys):
    base = ["paths", "--set", f"run.output_dir={tmp_path}", "--set", "data.channel_combinations=0,01"]
    assert main([*base, "--combinations"]) == 0
    assert capsys.readouterr().out.split() == ["0", "01"]
    assert main([*base, "--set", "run.combination=01", "root", "split", "report"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "channels_01"), str(tmp_path / "split.json"),
                                               str(tmp_path / "channels_01" / "report.html")]
    assert main(["paths", "--set", f"run.output_dir={tmp_path}", "--combinations"]) == 0
    assert capsys.readouterr().out == ""


def test_mean_std_of_a_combination_comes_from_the_parent_run(tmp_path):
    from training.data.stats import load_mean_std

    (tmp_path / "mean_std.json").write_text(json.dumps({"mean": [1, 2, 3, 4, 5], "std": [.1, .2, .3, .4, .5]}))
    config = Config().replace({**COMBINATIONS, "run.output_dir": str(tmp_path), "run.combination": "13"})
    assert load_mean_std(config) == ([2.0, 4.0], [0.2, 0.4])


def test_scdino_list_becomes_every_combination(tmp_path, caplog):
    path = tmp_path / "scDINO_full_pipeline.yaml"
    path.write_text("meta:\n  name_of_run: r\n  output_dir: /o\n  channel_dict: {0: A, 1: B, 2: C}\n"
                    "  selected_channel_combination_per_run: ['012', '0', '12']\n")
    with caplog.at_level(logging.WARNING, logger="training.config.scdino"):
        config = load_config(path)
    assert config.data.channel_combinations == ("012", "0", "12")
    assert config.data.channels == "012" and config.data.channel_names == ("A", "B", "C")
    assert not [r for r in caplog.records if "selected_channel_combination" in r.getMessage()]
    single = tmp_path / "single.yaml"
    single.write_text("meta:\n  selected_channel_combination_per_run: ['2']\n")
    assert load_config(single).data.channel_combinations == () and load_config(single).data.channels == "2"


ADAPTIVE = {**COMBINATIONS, "data.compare_channel_adaptive": True}


def test_channel_adaptive_comparison_needs_combinations_within_data_channels():
    with pytest.raises(ConfigError, match="data.compare_channel_adaptive needs data.channel_combinations"):
        Config().replace({"data.compare_channel_adaptive": True})
    with pytest.raises(ConfigError, match=r"trains on data.channels='012', so it cannot be evaluated on '13'"):
        Config().replace({**ADAPTIVE, "data.channels": "012", "data.channel_combinations": ["012", "0", "13"]})


def test_channel_adaptive_run_needs_the_comparison_and_is_of_its_kind():
    with pytest.raises(ConfigError, match="run.channel_adaptive=bag_of_channels .* set data.compare_channel_adaptive=true"):
        Config().replace({**COMBINATIONS, "run.channel_adaptive": "bag_of_channels"})
    with pytest.raises(ConfigError, match="run.channel_adaptive=channel_vit is not in data.channel_adaptive_kinds"):
        Config().replace({**ADAPTIVE, "run.channel_adaptive": "channel_vit"})
    with pytest.raises(ConfigError, match="run.channel_adaptive must be one of .*'bag_of_channels'.*got 'true'"):
        Config().replace({**ADAPTIVE, "run.channel_adaptive": "true"})
    model = Config().replace({**ADAPTIVE, "run.channel_adaptive": "bag_of_channels"})
    assert model.model.kind == "bag_of_channels" and model.data.channels == "01234", "trained on every channel"
    both = {**ADAPTIVE, "data.channel_adaptive_kinds": ["bag_of_channels", "channel_vit"]}
    evaluation = Config().replace({**both, "run.channel_adaptive": "channel_vit", "run.combination": "13"})
    assert evaluation.model.kind == "channel_vit" and evaluation.data.channels == "13"
    assert Config().replace(evaluation.to_dict()) == evaluation, "its config.yaml reloads the same"
    assert Config().replace(ADAPTIVE).model.kind == "vit", "the per-combination runs keep model.kind"
    with pytest.raises(ConfigError, match="data.channel_adaptive_kinds must list distinct kinds among"):
        Config().replace({**ADAPTIVE, "data.channel_adaptive_kinds": ["vit"]})


def test_channel_adaptive_layout_evaluates_the_models_checkpoints(tmp_path):
    parent = RunLayout(tmp_path / "run")
    model = parent.channel_adaptive("bag_of_channels")
    evaluation = model.evaluation("13")
    root = tmp_path / "run" / "channel_adaptive_bag_of_channels"
    assert model.root == root
    assert model.latest_checkpoint == root / "checkpoints" / "checkpoint.pth"
    assert evaluation.root == root / "channels_13"
    assert evaluation.knn_json == evaluation.root / "knn" / "knn.json"
    assert evaluation.latest_checkpoint == model.latest_checkpoint
    assert evaluation.numbered_checkpoints() == [] and evaluation.checkpoints == model.checkpoints
    for name in ("split", "mean_std", "bad_images", "packed"):
        assert getattr(model, name) == getattr(parent, name) == getattr(evaluation, name), name
    base = {**ADAPTIVE, "run.output_dir": str(tmp_path / "run"), "run.channel_adaptive": "bag_of_channels"}
    assert RunLayout.from_config(Config().replace(base)).root == model.root
    assert RunLayout.from_config(Config().replace({**base, "run.combination": "13"})) == evaluation


def test_paths_lists_the_channel_adaptive_combinations_only_when_asked(tmp_path, capsys):
    base = ["paths", "--set", f"run.output_dir={tmp_path}", "--set", "data.channel_combinations=0,01"]
    assert main([*base, "--channel-adaptive"]) == 0
    assert capsys.readouterr().out == ""
    assert main([*base, "--set", "data.compare_channel_adaptive=true", "--channel-adaptive"]) == 0
    assert capsys.readouterr().out.split() == ["0", "01"]
    assert main([*base, "--channel-adaptive-kinds"]) == 0
    assert capsys.readouterr().out == ""
    kinds = ["--set", "data.compare_channel_adaptive=true", "--set", "data.channel_adaptive_kinds=channel_vit,bag_of_channels"]
    assert main([*base, *kinds, "--channel-adaptive-kinds"]) == 0
    assert capsys.readouterr().out.split() == ["channel_vit", "bag_of_channels"]
    adaptive = ["--set", "data.compare_channel_adaptive=true", "--set", "run.channel_adaptive=bag_of_channels"]
    assert main([*base, *adaptive, "--set", "run.combination=01", "linear_json", "latest_checkpoint"]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "channel_adaptive_bag_of_channels" / "channels_01" / "linear" / "linear.json"),
        str(tmp_path / "channel_adaptive_bag_of_channels" / "checkpoints" / "checkpoint.pth")]


def test_pretrain_refuses_to_train_an_evaluation_of_the_channel_adaptive_model(tmp_path, capsys):
    adaptive = ["--set", "data.channel_combinations=0,01", "--set", "data.compare_channel_adaptive=true",
                "--set", "run.channel_adaptive=bag_of_channels", "--set", f"run.output_dir={tmp_path}"]
    assert main(["pretrain", *adaptive, "--set", "run.combination=0"]) == 2
    assert "run pretrain with run.channel_adaptive=bag_of_channels and without run.combination" in capsys.readouterr().err
    assert not (tmp_path / "channel_adaptive_bag_of_channels" / "checkpoints").exists()


def test_a_channel_adaptive_comparison_without_combinations_is_one_line_from_the_cli(tmp_path, capsys):
    assert main(["paths", "--set", f"run.output_dir={tmp_path}", "--set", "data.compare_channel_adaptive=true",
                 "root"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["error: data.compare_channel_adaptive needs data.channel_combinations: the channel-adaptive "
                     "model is evaluated on each of them (e.g. --set data.channel_combinations=01234,0,3)"]
