"""Shared fixtures for the training tests: a tiny synthetic dataset and configs pointing at it.

    synth_root            session-scoped: root folder of 4 classes x 24 five-channel 50x50 TIFFs
    make_config(...)      a Config whose run directory is this test's tmp_path and whose data is
                          synth_root, sized to run in seconds on CPU; overrides as a dict of dotted
                          keys and/or keyword arguments with "__" for the dot (optim__epochs=2)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tests.support.tiny import TINY_RUN, tiny_config
from training.config import Config
from training.data.synthetic.folders import write_dataset

SYNTH_CLASSES = 4
SYNTH_PER_CLASS = 24


@pytest.fixture(scope="session", autouse=True)
def _few_torch_threads() -> None:
    """The test machine has two cores shared by several processes: keep torch to one thread."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "images"
    write_dataset(root, classes=SYNTH_CLASSES, per_class=SYNTH_PER_CLASS, channels=5, size=50, seed=0)
    return root


@pytest.fixture
def make_config(synth_root: Path, tmp_path: Path) -> Callable[..., Config]:
    def make(overrides: dict[str, Any] | None = None, **keywords: Any) -> Config:
        base = {"run.output_dir": str(tmp_path / "run"), "data.source": str(synth_root), **TINY_RUN}
        return tiny_config({**base, **(overrides or {})}, **keywords)

    return make


@pytest.fixture
def slurm_job(monkeypatch):
    """This process runs as attempt 0 of Slurm job 4242, first start under torchrun (the recovery records
    and the pretrain step's restart guard read these variables)."""
    for name in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    return monkeypatch
