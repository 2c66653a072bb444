"""`bench step`: the figures it reports on CPU, and its analytic FLOP count against PyTorch's counter."""

import argparse

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from training.benchmarks.step import run_step_benchmark, train_flops_per_image, vit_forward_flops, head_flops
from training.config import Config
from training.models import build_model

torch.set_num_threads(1)


def tiny_config() -> Config:
    return Config().replace({
        "data.channels": "01234", "model.arch": "vit_tiny", "model.patch_size": 8, "model.out_dim": 256,
        "dino.global_crop_size": 32, "dino.local_crop_size": 16, "dino.local_crops_number": 2,
        "optim.batch_size_per_gpu": 4,
    })


def test_step_benchmark_reports_throughput_and_time_split_on_cpu():
    result = run_step_benchmark(tiny_config(), argparse.Namespace(batches=2, warmup=1))
    assert result["device"] == "cpu" and result["precision"] == "fp32" and result["steps"] == 2
    split = result["split_step_time_s"]
    assert set(split) == {"data", "forward", "backward", "optimizer", "total"}
    assert split["total"] == pytest.approx(split["data"] + split["forward"] + split["backward"] + split["optimizer"], rel=1e-3)
    assert result["split_images_per_s"] == pytest.approx(4 / split["total"], rel=1e-2)
    assert result["images_per_s"] == pytest.approx(4 / result["step_time_s"], rel=1e-2)  # the free-running pass
    assert result["achieved_tflops"] == pytest.approx(result["images_per_s"] * result["gflops_per_image"] / 1e3, abs=1e-3)
    assert result["mfu"] is None and result["peak_memory_gb"] is None
    assert "3 x student forward" in result["flop_method"]


def test_analytic_flops_match_pytorch_flop_counter():
    config = tiny_config()
    student, _ = build_model(config, 5)
    for side in (32, 16):
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            student([torch.randn(1, 5, side, side)])
        analytic = vit_forward_flops("vit_tiny", 8, 5, side) + head_flops("vit_tiny", 256)
        # the counter sees matmuls and convolutions only; norms and softmax are a small remainder
        assert analytic == pytest.approx(counter.get_total_flops(), rel=0.02)
    per_image = train_flops_per_image(config, 5)
    def forward(side):
        return vit_forward_flops("vit_tiny", 8, 5, side) + head_flops("vit_tiny", 256)

    assert per_image == pytest.approx(3 * (2 * forward(32) + 2 * forward(16)) + 2 * forward(32))
