"""Training-step benchmark: `python -m training bench step --config run.yaml [--batches 20] [--warmup 3]`.

`--batches` is the number of timed steps (StepBenchRequest.steps); `--set train.compile=true`
compares compiled with eager; `--dino-reference` runs the same model as facebookresearch/dino's
main_dino.py runs it, the baseline our speed is quoted against: eager, fp16 autocast with a gradient
scaler, attention as explicit matmuls and softmax (no fused kernel), AdamW looping over tensors,
per-tensor clipping that reads each norm back to the host, the EMA one tensor at a time, and the
loss read back every step.

Runs the real DINO step (teacher + student forward, loss, backward, clipping, AdamW, EMA) on
synthetic crops, so the figure is the model's speed, not the loader's, in two passes:
- split: each phase (data transfer, forward, backward, optimiser) ends with a device
  synchronisation, which gives the time split but keeps the host from queueing ahead;
- free-running: the same steps on crops already on the device, one synchronisation at the end, as
  training runs. images/s and the model FLOP utilisation (MFU, against the device's dense bf16/fp16
  peak) come from this pass; on a GPU it is the higher figure.
Also prints the peak memory and what the planner (`python -m training plan`) adds to the steps: the
start-up (`startup_s`: importing what `pretrain` imports, then building model, teacher and optimizer),
the mean warm-up step (`warmup_step_s`) and one save of the checkpointed state (`checkpoint_s`).

FLOP count (stated in the output): analytic, per image,
  3 x (student forward on all crops)  [forward + backward = 3 x forward]
  + 1 x (teacher forward on the 2 global crops),
where one ViT forward on a crop of N tokens (N = (side / patch)^2 + 1) costs, per block,
24 N d^2 (qkv, projection, MLP) + 4 N^2 d (attention scores and weighted sum) FLOPs, plus the patch
embedding 2 (N - 1) C p^2 d and the DINO head 2 (d h + h^2 + h b + b K) (h = 2048, b = 256, K = out_dim).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any

import torch

from training.benchmarks.request import StepBenchRequest
from training.config import Config
from training.costs.flops import train_flops_per_image
from training.costs.instances import peak_flops_of
from training.distributed.groups import DistContext, DistEnv

log = logging.getLogger(__name__)


class SyntheticCrops:
    """A loader of random multi-crop batches, deterministic per (seed, epoch, batch index, rank).

    Has the pretraining loader's interface: `len`, iteration over (crops, labels), `set_epoch`.
    Used by the step benchmark and by tests that must not depend on image files.
    """

    def __init__(self, config: Config, *, batches: int, rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.batches = batches
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        dino, batch = self.config.dino, self.config.optim.batch_size_per_gpu
        chans = self.config.data.in_chans
        for index in range(self.batches):
            generator = torch.Generator().manual_seed(
                hash((self.config.run.seed, self.epoch, index, self.rank)) % 2**31
            )
            sizes = [dino.global_crop_size] * 2 + [dino.local_crop_size] * dino.local_crops_number
            crops = [torch.randn(batch, chans, s, s, generator=generator) for s in sizes]
            yield crops, torch.zeros(batch, dtype=torch.long)


def device_peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dino_reference_style(state: Any) -> None:
    """Make `state` step as main_dino.py does (see the module docstring); its precision (fp16 on a
    GPU) and eager mode come from the config the caller built it with."""
    for module in [*state.models.student.modules(), *state.models.teacher.modules()]:
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    from training.dino.optim import build_optimizer

    state.optimizer = build_optimizer(state.models.student, implementation="for-loop")


def _reference_optimizer_step(state: Any, epoch: int, loss: torch.Tensor) -> None:
    """main_dino.py's update: the loss read back (its finiteness check), unscale, clipping with one
    host read per tensor, last-layer freezing, the scaled AdamW step, then the EMA tensor by tensor."""
    import math

    from training.dino.optim import cancel_last_layer_gradients

    if not math.isfinite(loss.item()):
        raise RuntimeError("loss is not finite")
    optim, student = state.config.optim, state.models.student
    state.scaler.unscale_(state.optimizer)
    for param in student.parameters():
        if param.grad is not None:
            norm = param.grad.norm(2)
            coefficient = optim.clip_grad / (norm.item() + 1e-6)
            if coefficient < 1:
                param.grad.mul_(coefficient)
    cancel_last_layer_gradients(student, epoch, optim.freeze_last_layer)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    _, _, momentum = state.schedules.at(state.global_step)
    with torch.no_grad():
        for student_param, teacher_param in zip(student.parameters(), state.models.teacher.parameters()):
            teacher_param.mul_(momentum).add_((1 - momentum) * student_param.detach())


def _step_functions(reference: bool):
    """(forward_loss, backward, optimizer_step(state, epoch, loss)) of our step or main_dino.py's."""
    from training.dino.step import backward, forward_loss, optimizer_step

    if reference:
        return forward_loss, backward, _reference_optimizer_step
    return forward_loss, backward, lambda state, epoch, loss: optimizer_step(state, epoch)


def _timed_steps(state: Any, loader: SyntheticCrops, device: torch.device,
                 warmup: int, reference: bool = False) -> tuple[dict[str, float], float]:
    """Seconds per phase of the timed steps, and the seconds of the warm-up steps before them."""
    forward_loss, backward, optimizer_step = _step_functions(reference)

    totals = dict.fromkeys(("data", "forward", "backward", "optimizer"), 0.0)
    warmup_s = 0.0
    for index, (crops, _) in enumerate(loader):
        if index == warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        marks = [time.perf_counter()]
        crops = [c.to(device, non_blocking=True) for c in crops]
        _sync(device)
        marks.append(time.perf_counter())
        loss = forward_loss(state, crops, epoch=0)
        _sync(device)
        marks.append(time.perf_counter())
        backward(state, loss)
        _sync(device)
        marks.append(time.perf_counter())
        optimizer_step(state, 0, loss)
        state.global_step += 1
        _sync(device)
        marks.append(time.perf_counter())
        if index >= warmup:
            for key, start, end in zip(totals, marks, marks[1:]):
                totals[key] += end - start
        else:
            warmup_s += marks[-1] - marks[0]
    return totals, warmup_s


def _checkpoint_seconds(state: Any) -> tuple[float, int]:
    """Seconds and bytes of one save of what a checkpoint holds most of (student, teacher, optimizer
    state), to a temporary file: the planner's per-epoch cost of checkpointing on this machine."""
    import tempfile

    payload = {"student": state.models.student.state_dict(), "teacher": state.models.teacher.state_dict(),
               "optimizer": state.optimizer.state_dict()}
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/bench-state.pt"
        start = time.perf_counter()
        torch.save(payload, path)
        os.fsync(os.open(path, os.O_RDONLY))
        seconds = time.perf_counter() - start
        return seconds, os.path.getsize(path)


def run_step_benchmark(config: Config, request: StepBenchRequest) -> dict[str, Any]:
    """Time the DINO step on synthetic crops; returns the figures (the caller prints them as JSON).

    The keys are what training/costs/scaling.py reads (`profile_from_step_json`).
    """
    from training.trainer import build_state

    steps, warmup = request.steps, request.warmup
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if request.reference:
        config = config.replace({"train.compile": False, "train.compile_mode": "default", "train.parallel": "ddp",
                                 "train.precision": "fp16" if device.type == "cuda" else "fp32"})
    ctx = DistContext(env=DistEnv(), device=device, backend=None)
    start = time.perf_counter()
    state = build_state(config, ctx, steps_per_epoch=2 * steps + warmup)
    build_s = time.perf_counter() - start
    if request.reference:
        dino_reference_style(state)
    loader = SyntheticCrops(config, batches=steps + warmup)
    log.info("bench step: %d warm-up + %d timed steps on %s, then %d free-running%s", warmup, steps, device, steps,
             " (as main_dino.py runs it)" if request.reference else "")
    totals, warmup_s = _timed_steps(state, loader, device, warmup, request.reference)
    free_running_s = _free_running(state, loader, device, steps, request.reference)
    checkpoint_s, checkpoint_bytes = _checkpoint_seconds(state)
    params = sum(p.numel() for p in state.models.student.parameters() if p.requires_grad)
    return {**summarise(config, state.precision.name, device, steps, totals, free_running_s),
            "style": "dino_reference" if request.reference else "scdino_pcluster",
            "torch": torch.__version__, "warmup_steps": warmup, "params": params, "build_s": round(build_s, 3),
            "warmup_step_s": round(warmup_s / warmup, 5) if warmup else None,
            "checkpoint_s": round(checkpoint_s, 3), "checkpoint_bytes": checkpoint_bytes}


def _free_running(state: Any, loader: SyntheticCrops, device: torch.device, steps: int,
                  reference: bool = False) -> float:
    """Seconds for `steps` steps with no synchronisation between them (but main_dino.py's own), on a
    few batches staged on the device beforehand (cycled), as a training loop with a prefetching loader runs."""
    forward_loss, backward, optimizer_step = _step_functions(reference)

    staged = [[c.to(device) for c in crops] for crops, _ in itertools.islice(iter(loader), 4)]
    _sync(device)
    start = time.perf_counter()
    for index in range(steps):
        loss = forward_loss(state, staged[index % len(staged)], epoch=0)
        backward(state, loss)
        optimizer_step(state, 0, loss)
        state.global_step += 1
    _sync(device)
    return time.perf_counter() - start


def throughput(config: Config, device: torch.device, steps: int, seconds: float) -> dict[str, Any]:
    """images/s, step time, achieved TFLOP/s and MFU of `steps` steps that took `seconds`."""
    batch = config.optim.batch_size_per_gpu
    images_per_s = batch * steps / seconds if seconds > 0 else 0.0
    peak = device_peak_flops(device)
    achieved = train_flops_per_image(config, config.data.in_chans) * images_per_s
    return {"images_per_s": round(images_per_s, 2), "step_time_s": round(seconds / steps, 5),
            "achieved_tflops": round(achieved / 1e12, 3), "mfu": round(achieved / peak, 4) if peak else None}


def summarise(config: Config, precision: str, device: torch.device, steps: int, totals: dict[str, float],
              free_running_s: float) -> dict:
    batch, in_chans = config.optim.batch_size_per_gpu, config.data.in_chans
    total = sum(totals.values())
    split_images_per_s = batch * steps / total if total > 0 else 0.0
    flops = train_flops_per_image(config, in_chans)
    peak = device_peak_flops(device)
    return {
        **model_settings(config, precision, device), "steps": steps,
        **throughput(config, device, steps, free_running_s),
        "split_images_per_s": round(split_images_per_s, 2),
        "split_step_time_s": {k: round(v / steps, 5) for k, v in {**totals, "total": total}.items()},
        "backward_s": round(totals["backward"] / steps, 5),
        "flops_per_step": flops * batch,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None,
        "gflops_per_image": round(flops / 1e9, 3),
        "flop_method": "analytic: 3 x student forward (all crops) + teacher forward (2 global crops)",
        "device_peak_tflops": peak / 1e12 if peak else None,
    }


def model_settings(config: Config, precision: str, device: torch.device) -> dict[str, Any]:
    """What was stepped, and where: the keys both `bench step` and `bench pretrain` start with."""
    return {
        "benchmark": "step",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "arch": config.model.arch, "patch_size": config.model.patch_size, "in_chans": config.data.in_chans,
        "out_dim": config.model.out_dim, "global_crop_size": config.dino.global_crop_size,
        "local_crop_size": config.dino.local_crop_size, "local_crops_number": config.dino.local_crops_number,
        "batch_size": config.optim.batch_size_per_gpu, "precision": precision, "compiled": config.train.compile,
        "compile_mode": config.train.compile_mode if config.train.compile else None,
    }
