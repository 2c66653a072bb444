"""The weak-scaling model of training/benchmarks/scaling.py."""

import json

import pytest

from training.benchmarks import scaling
from training.benchmarks.scaling import PRESETS, StepProfile, allreduce_seconds, efficiency


def test_allreduce_time_follows_the_bus_bandwidth_definition():
    # 8 ranks, 1 GB at a bus bandwidth of 100 GB/s: 2 * 7/8 * 1e9 / 1e11 seconds.
    assert allreduce_seconds(1e9, 100.0, 8) == pytest.approx(0.0175)
    assert allreduce_seconds(1e9, 100.0, 1) == 0.0


def test_exposed_communication_lowers_efficiency_and_compression_helps():
    profile = StepProfile(step_time_s=0.02, backward_s=0.01, params=44_000_000)
    net = PRESETS["g4dn.12xlarge"]
    full, exposed = efficiency(profile, net, 4, grad_bytes_per_param=4)
    half, _ = efficiency(profile, net, 4, grad_bytes_per_param=2)
    fsdp, _ = efficiency(profile, net, 4, grad_bytes_per_param=4, volume_factor=1.5)
    assert exposed > 0
    assert fsdp < full < half <= 1.0
    p5, _ = efficiency(profile, PRESETS["p5.48xlarge"], 4, grad_bytes_per_param=4)
    assert p5 > full


def test_cli_reads_step_and_measured_bandwidth(tmp_path, capsys):
    step = tmp_path / "step.json"
    step.write_text(json.dumps({"step_time_s": 0.05, "params": 44_000_000}))
    busbw = tmp_path / "busbw.json"
    busbw.write_text(json.dumps({"busbw_gbs": 1.0}))
    scaling.main(["--step-json", str(step), "--busbw-json", str(busbw), "--preset", "p4d.24xlarge",
                  "--nodes", "1,2"])
    out = json.loads(capsys.readouterr().out)
    preset = out["presets"]["p4d.24xlarge"]
    assert preset["interconnect"]["inter_busbw_gbs"] == 1.0
    one, two = preset["rows"]
    assert one["efficiency_ddp"] == 1.0 and two["efficiency_ddp"] < 0.5
    assert two["compression_pays"] is True
    assert "DDP" in preset["fsdp"]


def test_cli_reads_what_bench_step_writes(tmp_path, capsys):
    """The scaling model is fed the step benchmark's own JSON, not a hand-written stand-in."""
    from training.benchmarks.request import StepBenchRequest
    from training.benchmarks.step import run_step_benchmark
    from training.config import Config

    config = Config().replace({"data.channels": "01", "model.arch": "vit_tiny", "model.patch_size": 8,
                               "model.out_dim": 64, "dino.global_crop_size": 16, "dino.local_crop_size": 8,
                               "dino.local_crops_number": 1, "optim.batch_size_per_gpu": 2})
    measured = run_step_benchmark(config, StepBenchRequest(steps=1, warmup=1))
    step = tmp_path / "step.json"
    step.write_text(json.dumps(measured))
    capsys.readouterr()
    scaling.main(["--step-json", str(step), "--preset", "p4d.24xlarge", "--nodes", "1,2"])
    preset = json.loads(capsys.readouterr().out)["presets"]["p4d.24xlarge"]
    assert preset["step_time_s"] == measured["step_time_s"] and measured["params"] > 1e6
    assert preset["rows"][0]["efficiency_ddp"] == 1.0 and 0.5 < preset["rows"][1]["efficiency_ddp"] <= 1.0
