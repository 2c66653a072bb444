"""mean_std.json is checked when read: a NaN, an infinity or a negative std is a damaged file, and a
zero std in a selected channel an error naming the channels, before any training step runs."""

import json

import pytest

from tests.support.tiny import run_cli
from training.data.stats import load_mean_std
from training.errors import DamagedFileError, UserError
from training.rundir import RunLayout

GOOD = {"mean": [0.1, 0.2, 0.3, 0.4, 0.5], "std": [0.1, 0.2, 0.3, 0.4, 0.5]}


def write_stats(config, **changes):
    path = RunLayout.from_config(config).mean_std
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**GOOD, **changes}))  # json writes NaN and Infinity as such
    return path


@pytest.mark.parametrize("changes, shown", [
    ({"mean": [0.1, float("nan"), 0.3, 0.4, 0.5]}, "mean[1] = nan"),
    ({"std": [0.1, 0.2, float("inf"), 0.4, 0.5]}, "std[2] = inf"),
    ({"std": [0.1, 0.2, 0.3, -0.4, 0.5]}, "std[3] = -0.4"),
])
def test_values_no_normalisation_can_use_are_a_damaged_file(make_config, changes, shown):
    config = make_config()
    path = write_stats(config, **changes)
    with pytest.raises(DamagedFileError) as error:
        load_mean_std(config)
    assert str(error.value) == (f"{path} holds values no normalisation can use ({shown}): "
                                "rerun `python -m training mean-std`")


def test_a_zero_std_in_a_selected_channel_names_the_channel_and_the_fix(make_config):
    config = make_config({"data.channels": "024"})
    write_stats(config, std=[0.1, 0.2, 0.0, 0.4, 0.0])
    with pytest.raises(UserError, match=r"channel\(s\) \[2, 4\] of data.channels='024' have std 0 .*: drop them from "
                                        r"data.channels, or rerun `python -m training mean-std`"):
        load_mean_std(config)
    assert load_mean_std(config.replace({"data.channels": "01"})) == ([0.1, 0.2], [0.1, 0.2])  # others are fine


def test_pretraining_stops_before_its_first_step_with_one_line(make_config, capsys):
    config = make_config()
    assert run_cli(config, "prepare") == 0
    path = write_stats(config, std=[0.1, float("nan"), 0.3, 0.4, 0.5])
    assert run_cli(config, "pretrain") == 2
    err = capsys.readouterr().err
    assert f"error: {path} holds values no normalisation can use (std[1] = nan)" in err
    assert "Traceback" not in err and "learning rate" not in err
    assert not RunLayout.from_config(config).latest_checkpoint.exists()
