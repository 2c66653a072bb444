"""scripts/gpu-bench.sh, the one command that measures a GPU node: its tiny CPU version runs every
benchmark it would run on a GPU and writes the summary; without a GPU the full version refuses."""

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[4]
SCRIPT = REPO / "scripts" / "gpu-bench.sh"


def run(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=600)


def test_smoke_run_writes_every_figure(tmp_path):
    result = run(tmp_path / "out", GPU_BENCH_SMOKE="1", GPU_BENCH_BUNDLE=str(tmp_path / "bundle.tar"))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert set(summary["step"]) == {"vits16_224", "vits16_224_reference", "vitb16_224", "vits8_native_bag"}
    for step in summary["step"].values():
        assert step["images_per_s"] > 0 and step["split_step_time_s"]["total"] > 0
    assert summary["step"]["vits16_224_reference"]["style"] == "dino_reference"
    assert summary["speedup_vs_dino_reference"] == pytest.approx(
        summary["step"]["vits16_224"]["images_per_s"] / summary["step"]["vits16_224_reference"]["images_per_s"], rel=0.01)
    assert set(summary["pretrain"]) == {"vits16_224", "vits8_native", "vits16_224_packed"}
    for loop in summary["pretrain"].values():
        assert loop["loop_images_per_s"] > 0 and loop["step_images_per_s"] > 0
    assert summary["pretrain"]["vits16_224_packed"]["loader"] == "packed"
    assert summary["loop_speedup_vs_dino_reference"] == pytest.approx(
        summary["pretrain"]["vits16_224"]["loop_images_per_s"] / summary["step"]["vits16_224_reference"]["images_per_s"],
        rel=0.01)
    assert [stage[0] for stage in summary["stages"]] == [
        "pretrain vits16_224", "pretrain vits8_native", "step vits16_224", "loader 224", "chain",
        "step vits16_224_reference", "step vitb16_224", "step vits8_native_bag", "loader native",
        "pretrain vits16_224_packed"]
    assert [stage[1] for stage in summary["stages"]] == ["ok"] * 10
    # the demo's chain ran through kNN: the trained model and both baselines were scored
    assert {"knn/knn.json:final", "knn/knn.json:random_init", "knn/knn.json:raw_pixels"} <= set(summary["chain"]["knn_top1"])
    step = json.loads((tmp_path / "out" / "step_vits16_224.json").read_text())
    scaling = json.loads((tmp_path / "out" / "scaling_vits16_224.json").read_text())
    assert scaling["model"]["params"] == step["params"] and scaling["model"]["backward_s"] == step["backward_s"]
    assert all(preset["rows"][0]["nodes"] == 1 for preset in scaling["presets"].values())
    assert set(summary["loader"]) == {"224", "native"}
    for loader in summary["loader"].values():
        assert loader["baseline_images_per_s"] > 0 and loader["packed_images_per_s"] > 0
        assert loader["device_augment_images_per_s"] > 0
        share = 24 * 1000 / loader["device_augment_cpu_ms_per_image"]  # a p5's 192 vCPUs over its 8 GPUs
        assert loader["device_augment_images_per_s_at_p5_cpu_share"] == pytest.approx(share, rel=1e-3)
        assert loader["supply_over_demand_at_p5_cpu_share"] == pytest.approx(share / loader["step_demand_images_per_s"],
                                                                         rel=0.01)
    assert tarfile.open(tmp_path / "bundle.tar").getnames() and \
        {"./summary.json", "./chain.json"} <= set(tarfile.open(tmp_path / "bundle.tar").getnames())
    assert summary["device"]["device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    assert f"figures: {tmp_path / 'out'}/summary.json" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_full_run_without_a_gpu_says_what_is_missing(tmp_path):
    result = run(tmp_path / "out")
    assert result.returncode == 1
    assert "no CUDA GPU visible to torch" in result.stderr and "GPU_BENCH_SMOKE=1" in result.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_a_part_that_does_not_exist_is_refused(tmp_path):
    result = run(tmp_path / "out", GPU_BENCH_PART="3", GPU_BENCH_SMOKE="1")
    assert result.returncode == 1 and "GPU_BENCH_PART=3: give 1, 2 or all" in result.stderr
    result = run(tmp_path / "out", GPU_BENCH_BUDGET="7m", GPU_BENCH_SMOKE="1")
    assert result.returncode == 1 and "GPU_BENCH_BUDGET=7m: give whole seconds" in result.stderr


def test_a_spent_budget_skips_the_remaining_stages_and_still_sums_up(tmp_path):
    """A lease's time is the bound: stages that would start with too little left are noted, not run."""
    result = run(tmp_path / "out", GPU_BENCH_SMOKE="1", GPU_BENCH_PART="1", GPU_BENCH_BUDGET="5", BENCH_STAGE_MIN="10")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [stage[1] for stage in summary["stages"]] == ["skipped (budget)"] * 5
    assert summary["step"] == {} and summary["pretrain"] == {}


def test_the_planners_default_mfu_is_the_committed_h200_measurement(tmp_path):
    """training/planning/inputs.py quotes the ViT-S/16 figures of docs/benchmarks/gpu_h200_2026-11-26/:
    the constants must be what those files say, and the folder's summary must follow from its files."""
    from training.benchmarks.speed.gpu_summary import summarise
    from training.planning.inputs import MEASURED_MFU

    folder = REPO / "docs" / "benchmarks" / "gpu_h200_2026-11-26"
    eager = json.loads((folder / "step_vits16_224.json").read_text())
    compiled = json.loads((folder / "step_vits16_224_compiled.json").read_text())
    assert (eager["compiled"], compiled["compiled"]) == (False, True) and eager["device"] == "NVIDIA H200"
    assert MEASURED_MFU == {False: pytest.approx(eager["mfu"], abs=5e-4), True: pytest.approx(compiled["mfu"], abs=5e-4)}
    copy = tmp_path / "figures"
    copy.mkdir()
    for path in folder.iterdir():
        if path.name not in ("summary.json", "scaling_vits16_224.json"):
            (copy / path.name).write_bytes(path.read_bytes())
    committed = json.loads((folder / "summary.json").read_text())
    assert summarise(copy)["step"] == committed["step"]
    assert summarise(copy)["speedup_vs_dino_reference"] == committed["speedup_vs_dino_reference"] == pytest.approx(
        compiled["images_per_s"] / json.loads((folder / "step_vits16_224_reference.json").read_text())["images_per_s"],
        abs=0.01)
