"""The run configuration: defaults, YAML loading, overrides and the errors users see."""

import pytest

from training.cli import main
from training.config import Config, ConfigError, load_config
from training.rundir import RunLayout


def test_defaults_follow_scdino_published_run():
    config = Config()
    assert config.optim.batch_size_per_gpu == 30
    assert config.dino.local_crops_number == 8
    assert config.eval.knn_k == (5, 10, 50, 100, 200, 500)
    assert config.data.in_chans == 5


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  epochs: 3\ndata:\n  channels: '24'\n")
    config = load_config(path, ["optim.lr=1e-3", "dino.local_crops_scale=[0.1, 0.3]"])
    assert config.optim.epochs == 3
    assert config.optim.lr == pytest.approx(1e-3)
    assert config.data.channel_indices == (2, 4)
    assert config.dino.local_crops_scale == (0.1, 0.3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr': did you mean 'lr'?"),
        ("data.loader=fast", "data.loader must be one of 'auto', 'tiff', 'packed', 'dali'"),
        ("optim.epochs=many", "optim.epochs must be an integer"),
        ("data.channels=0a", "data.channels must be digits"),
        ("dino.global_crops_scale=[0.5, 0.2]", "dino.global_crops_scale must satisfy"),
        ("nosuch.key=1", "unknown config section 'nosuch.key': allowed: data, dino, eval, ingest, model, optim, run, train"),
        ("optm.lr=1", "unknown config section 'optm.lr': did you mean 'optim'?"),
    ],
)
def test_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        load_config(None, [override])


def test_cli_prints_one_line_error(capsys, tmp_path):
    rc = main(["mean-std", "--config", str(tmp_path / "missing.yaml")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config file not found") and "\n" not in err


def test_every_key_the_docs_name_exists():
    """docs/training.md and the README name config keys; a renamed key must not leave them stale."""
    import dataclasses
    import re
    from pathlib import Path

    from training.config import Config

    repo = Path(__file__).resolve().parents[3]
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    named = set()
    for doc in (repo / "docs" / "training.md", repo / "README.md"):
        named |= set(re.findall(r"`(?:--set )?(%s)\.([a-z_]+)" % "|".join(sections), doc.read_text()))
    assert len(named) > 30
    fields = {name: {f.name for f in dataclasses.fields(getattr(Config(), name))} for name in sections}
    unknown = sorted(f"{section}.{key}" for section, key in named if key not in fields[section])
    assert not unknown, f"docs name keys the config does not have: {unknown}"


def test_channels_keep_their_leading_zero():
    """YAML reads 01234 as the octal number 668: `--set` keeps string keys as written, and an
    unquoted number in a YAML file is refused with the fix rather than silently misread."""
    from training.config import load_config

    assert load_config(None, ["data.channels=01234"]).data.channels == "01234"
    assert load_config(None, ["data.channels='012'", "run.name=007"]).data.channels == "012"
    assert load_config(None, ["optim.epochs=12", "train.compile=true"]).train.compile is True  # others: YAML
    with pytest.raises(ConfigError, match=r'data.channels must be quoted, e.g. channels: "01234"'):
        Config().replace({"data.channels": 668})


@pytest.mark.parametrize(("env", "written"), [({"SLURM_PROCID": "1"}, False), ({"RANK": "1", "SLURM_PROCID": "0"}, False),
                                              ({"RANK": "0", "SLURM_PROCID": "3"}, True), ({}, True)])
def test_only_rank_zero_writes_the_resolved_config(tmp_path, monkeypatch, env, written):
    """torchrun's RANK wins over Slurm's SLURM_PROCID; other ranks leave config.yaml to rank 0."""
    for name in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["report", "--set", f"run.output_dir={tmp_path / 'run'}"]) == 2  # nothing to report yet
    assert RunLayout(tmp_path / "run").config.is_file() == written
