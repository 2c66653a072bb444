"""`bench step`: the figures it reports on CPU, its analytic FLOP count against PyTorch's counter,
and the flags: typed requests, `--warmup 0` meaning 0, one-line errors naming a bad flag."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.support.tiny import tiny_config
from training.benchmarks.request import LoaderBenchRequest, StepBenchRequest, loader_request, step_request
from training.benchmarks.speed import step as step_module
from training.benchmarks.speed.step import run_step_benchmark
from training.cli import build_parser, main
from training.config import Config, dump_config
from training.costs.flops import head_flops, train_flops_per_image, vit_forward_flops
from training.errors import UserError
from training.models import build_model

torch.set_num_threads(1)


def bench_config() -> Config:
    return tiny_config({"data.channels": "01234", "optim.batch_size_per_gpu": 4})


@pytest.mark.slow
def test_step_benchmark_reports_throughput_and_time_split_on_cpu():
    result = run_step_benchmark(bench_config(), StepBenchRequest(steps=2, warmup=1))
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
    config = bench_config()
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


def _args(*argv: str):
    return build_parser().parse_args(["bench", *argv])


def test_flags_become_typed_requests_and_warmup_zero_stays_zero():
    assert step_request(_args("step", "--batches", "5", "--warmup", "0")) == StepBenchRequest(steps=5, warmup=0)
    assert loader_request(_args("loader", "--warmup", "0", "--workers", "0", "--size", "48/24")) == \
        LoaderBenchRequest(warmup=0, workers=0, crop_sizes=(48, 24))
    # without flags each benchmark gets its documented defaults (docs/performance.md)
    assert (step_request(_args("step")).steps, step_request(_args("step")).warmup) == (20, 3)
    assert not step_request(_args("step")).reference and step_request(_args("step", "--dino-reference")).reference
    assert (loader_request(_args("loader")).batches, loader_request(_args("loader")).warmup) == (10, 2)


@pytest.mark.slow
def test_warmup_zero_runs_no_untimed_step(tmp_path, capsys, monkeypatch):
    drawn = []

    class CountedCrops(step_module.SyntheticCrops):
        def __iter__(self):
            for batch in super().__iter__():
                drawn.append(batch)
                yield batch

    monkeypatch.setattr(step_module, "SyntheticCrops", CountedCrops)
    config = tmp_path / "tiny.yaml"
    dump_config(bench_config(), config)
    out = tmp_path / "step.json"
    assert main(["bench", "step", "--config", str(config), "--batches", "1", "--warmup", "0",
                 "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    assert printed["steps"] == 1 and printed["warmup_steps"] == 0
    # The timed pass draws every batch of a loader of steps + warmup = 1 batch, and the free-running
    # pass stages the first min(4, 1) of them again: 2 in all (8 if --warmup 0 had become 3).
    assert len(drawn) == 1 + 1


@pytest.mark.parametrize(("argv", "flag"), [
    (["step", "--batches", "0"], "--batches"),
    (["step", "--warmup", "-1"], "--warmup"),
    (["step", "--size", "48/24"], "--size"),
    (["loader", "--batches", "0"], "--batches"),
    (["loader", "--warmup", "-2"], "--warmup"),
    (["loader", "--workers", "-1"], "--workers"),
    (["loader", "--images", "0"], "--images"),
    (["loader", "--size", "48/0"], "--size"),
    (["loader", "--size", "48x24"], "--size"),
    (["loader", "--dino-reference"], "--dino-reference:"),
])
def test_bad_flags_fail_in_one_line_naming_the_flag(argv, flag, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} ") and "\n" not in err


def test_requests_reject_bad_values_built_in_code():
    with pytest.raises(UserError, match="^--batches 0: "):
        StepBenchRequest(steps=0)
    with pytest.raises(UserError, match="^--warmup True: "):
        LoaderBenchRequest(warmup=True)
    with pytest.raises(UserError, match="^--size "):
        LoaderBenchRequest(crop_sizes=(48,))


def test_the_bench_step_module_imports_no_torch():
    code = "import sys, training.steps.bench; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[4])
    assert imported.stdout.strip() == "[]"


def test_the_dino_reference_step_trains_as_ours_does():
    """`--dino-reference` changes how the step runs, not what it computes: from the same weights and
    crops, one step of each moves every weight alike (unfused attention, looped AdamW, clipping with
    host reads and a looped EMA round differently: a rounding flip of a near-zero gradient moves an
    element by up to ~2 learning rates, and such elements are rare)."""
    from training.dino.step import backward, forward_loss, optimizer_step
    from training.distributed.groups import DistContext, DistEnv
    from training.trainer import build_state

    config = tiny_config({"data.channels": "01234", "optim.batch_size_per_gpu": 4, "model.drop_path_rate": 0.0,
                          "optim.warmup_epochs": 0})
    ctx = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)
    ours, reference = build_state(config, ctx, steps_per_epoch=4), build_state(config, ctx, steps_per_epoch=4)
    step_module.dino_reference_style(reference)
    attention = [m for m in reference.models.student.modules() if hasattr(m, "fused_attn")]
    assert attention and not any(m.fused_attn for m in attention)
    assert all(g["foreach"] is False and g["fused"] is False for g in reference.optimizer.param_groups)
    crops, _ = next(iter(step_module.SyntheticCrops(config, batches=1)))
    before = torch.cat([p.detach().flatten().clone() for p in ours.models.student.parameters()])
    losses = []
    for state, update in ((ours, lambda s, loss: optimizer_step(s, 0)),
                          (reference, lambda s, loss: step_module._reference_optimizer_step(s, 0, loss))):
        loss = forward_loss(state, crops, epoch=0)
        backward(state, loss)
        update(state, loss)
        losses.append(float(loss))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    lr = ours.schedules.at(0)[0]
    after = torch.cat([p.detach().flatten() for p in ours.models.student.parameters()])
    assert float((after - before).abs().max()) > 0.5 * lr  # the step moved the weights: the check below can fail
    for which in ("student", "teacher"):
        one = dict(getattr(ours.models, which).named_parameters())
        diffs = torch.cat([(p.detach() - one[name].detach()).abs().flatten()
                           for name, p in getattr(reference.models, which).named_parameters()])
        assert float(diffs.max()) <= 2.1 * lr, which
        assert float((diffs > 0.05 * lr).double().mean()) <= 1e-3, which
