"""The local Slurm cluster for the integration tests: started once per session, stopped at the end
only if this session started it. Needs root; without it every slurm test fails saying so."""

from __future__ import annotations

import subprocess

import pytest
from slurm_helpers import LOCAL_SLURM, Cluster, start_cluster


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    try:
        local, was_up = start_cluster()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield local
    if not was_up:
        subprocess.run([str(LOCAL_SLURM), "stop"], capture_output=True, timeout=120)
