"""scripts/gpu-bench.sh, the one command that measures a GPU node: its tiny CPU version runs every
benchmark it would run on a GPU and writes the summary; without a GPU the full version refuses."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu-bench.sh"


def run(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=600)


def test_smoke_run_writes_every_figure(tmp_path):
    result = run(tmp_path / "out", GPU_BENCH_SMOKE="1")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert set(summary["step"]) == {"vits16_224", "vits8_native"}
    for step in summary["step"].values():
        assert step["images_per_s"] > 0 and step["split_step_time_s"]["total"] > 0
    step = json.loads((tmp_path / "out" / "step_vits16_224.json").read_text())
    scaling = json.loads((tmp_path / "out" / "scaling_vits16_224.json").read_text())
    assert scaling["model"]["params"] == step["params"] and scaling["model"]["backward_s"] == step["backward_s"]
    assert all(preset["rows"][0]["nodes"] == 1 for preset in scaling["presets"].values())
    assert set(summary["loader"]) == {"224", "native"}
    for loader in summary["loader"].values():
        assert loader["baseline_images_per_s"] > 0 and loader["packed_images_per_s"] > 0
        assert loader["device_augment_images_per_s"] > 0
    assert summary["device"]["device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    assert f"figures: {tmp_path / 'out'}/summary.json" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_full_run_without_a_gpu_says_what_is_missing(tmp_path):
    result = run(tmp_path / "out")
    assert result.returncode == 1
    assert "no CUDA GPU visible to torch" in result.stderr and "GPU_BENCH_SMOKE=1" in result.stderr
    assert not (tmp_path / "out" / "summary.json").exists()
