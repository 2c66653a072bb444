"""slurm/profile.slurm on the local Slurm cluster, as `submit_pipeline.sh --profile` submits its first
job: the setup stage as a batch job writes the profile's config with the model's channels mapped by
name, and a screen cut at another crop size fails its job with the one-line refusal in its log. The
whole profile chain, every job in order, is tests/training/steps/test_profile.py (each job's command
run in-process) and was run on this cluster as docs/training.md reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.local_slurm import log_of
from tests.support.model_card import card_only_checkpoint
from training.config import Config, dump_config, load_config
from training.rundir import RunLayout

pytestmark = [pytest.mark.slurm]


def screen(tmp_path: Path, name: str, **overrides) -> Path:
    config = Config().replace({"run.output_dir": str(tmp_path / name), "data.channels": "012",
                               "data.channel_names": ["c", "a", "b"], "ingest.table": str(tmp_path / "load_data.csv"),
                               **overrides})
    path = tmp_path / f"{name}.yaml"
    dump_config(config, path)
    return path


def test_the_setup_stage_runs_as_a_job_and_refuses_another_crop_size_in_one_line(cluster, tmp_path):
    checkpoint = card_only_checkpoint(tmp_path / "model")  # the stage reads its config and card, not weights
    (tmp_path / "logs").mkdir()
    jobs = {name: cluster.sbatch("profile.slurm", str(screen(tmp_path, name, **overrides)), "--model",
                                 str(tmp_path / "model"), "--stage", "setup", cwd=tmp_path)
            for name, overrides in (("fits", {}), ("cut_larger", {"ingest.crop_size": 48}))}
    fits, larger = (cluster.wait(jobs[name], timeout=300) for name in ("fits", "cut_larger"))
    assert fits["JobState"] == "COMPLETED", log_of(tmp_path, fits)
    profile = load_config(RunLayout(tmp_path / "fits").profile_config)
    assert profile.data.channels == "120" and profile.data.channel_names == ("a", "b", "c")
    assert profile.ingest.crop_size == 40 and profile.model.arch == Config().model.arch
    assert larger["JobState"] == "FAILED"
    errors = [line for line in log_of(tmp_path, larger).splitlines() if line.startswith("error: ")]
    assert errors == [f"error: ingest.crop_size=48, but {checkpoint} learnt from 40 px crops: set ingest.crop_size=40 "
                      "(or 0), so that cells are seen at the scale it learnt"]
