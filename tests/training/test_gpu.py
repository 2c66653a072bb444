"""On a CUDA GPU: mixed precision against fp32, and DDP and FSDP2 through NCCL against no wrapper.

Skipped, with the reason, where there is no GPU (tests/conftest.py); `pytest -m gpu` on a GPU node,
or `scripts/gpu-bench.sh`, runs them.

Mixed precision is held to fp32 computed on the same GPU with TF32 off, on the same weights, crops
and loss centre. The bounds follow from each format's unit roundoff u (bf16: 2^-8, fp16: 2^-11),
since autocast rounds every matmul input to it while accumulating and reducing in fp32:
- the loss, a cross-entropy of fp32 softmaxes over rounded logits, within 8 u relative;
- the gradient of every parameter tensor that has one: the whole gradient within 32 u relative (in
  the 2-norm over all tensors), and no tensor pointing elsewhere: 1 - cosine <= (32 u)^2 / 2, what a
  relative error of 32 u at right angles to the tensor would give.
Measured on an H200 (torch 2.11, 2026-11-26), bf16 / fp16: loss 0.007 u / 0.010 u, gradient 2.8 u /
2.6 u, lowest 1 - cosine 7.4 u^2 / 8.4 u^2 (the patch embedding's weight in both).
fp16 is checked through the gradient scaler, as training runs it: scaled backward, then unscale.
"""

from __future__ import annotations

import copy
import socket

import pytest
import torch
import torch.distributed as dist

from tests.support.tiny import tiny_config
from tests.training.distributed.test_distributed import STEPS, fixed_loader, run_config, step_sizes, trained_alike
from training.dino.step import forward_loss
from training.distributed.groups import DistContext, DistEnv
from training.precision import Precision
from training.trainer import build_state, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}


def _cuda() -> DistContext:
    return DistContext(env=DistEnv(), device=torch.device("cuda"), backend=None)


def _loss_and_gradients(state, crops, centre, precision: Precision) -> tuple[float, dict[str, torch.Tensor]]:
    state.precision = precision
    state.loss_fn.load_state_dict(centre)  # the loss moves its centre on every call
    state.optimizer.zero_grad(set_to_none=True)
    scaler = torch.amp.GradScaler("cuda", enabled=precision.name == "fp16")
    loss = forward_loss(state, crops, epoch=0)
    scaler.scale(loss).backward()
    loss = loss.detach()
    scaler.unscale_(state.optimizer)
    grads = {name: p.grad.detach().double().clone() for name, p in state.models.student.named_parameters()
             if p.grad is not None}
    return float(loss), grads


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_loss_and_gradients_match_fp32(precision):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = tiny_config({"model.arch": "vit_small", "model.patch_size": 16, "model.out_dim": 4096,
                          "model.drop_path_rate": 0.0, "data.channels": "01234", "dino.global_crop_size": 96,
                          "dino.local_crop_size": 48, "dino.local_crops_number": 4,
                          "optim.batch_size_per_gpu": 8, "train.precision": "fp32"})
    state = build_state(config, _cuda(), steps_per_epoch=1)
    generator = torch.Generator().manual_seed(0)
    sizes = [96, 96] + [48] * 4
    crops = [torch.randn(8, 5, s, s, generator=generator).cuda() for s in sizes]
    centre = copy.deepcopy(state.loss_fn.state_dict())
    ref_loss, ref = _loss_and_gradients(state, crops, centre, Precision("fp32", "cuda"))
    loss, grads = _loss_and_gradients(state, crops, centre, Precision(precision, "cuda"))

    u = UNIT_ROUNDOFF[precision]
    assert set(grads) == set(ref) and len(ref) > 100
    loss_error = abs(loss - ref_loss) / abs(ref_loss)
    diff = torch.cat([(grads[k] - ref[k]).flatten() for k in ref])
    whole = torch.cat([ref[k].flatten() for k in ref])
    grad_error = float(diff.norm() / whole.norm())
    cosines = {k: float(torch.nn.functional.cosine_similarity(grads[k].flatten(), ref[k].flatten(), dim=0))
               for k in ref if float(ref[k].norm()) > 0}
    worst = min(cosines, key=cosines.get)
    print(f"\n{precision}: loss {loss:.6f} vs fp32 {ref_loss:.6f} (rel {loss_error:.2e}, bound {8 * u:.2e}); "
          f"gradient rel error {grad_error:.2e} (bound {32 * u:.2e}); lowest cosine {cosines[worst]:.6f} "
          f"({worst}, bound {1 - (32 * u) ** 2 / 2:.6f})")
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert loss_error <= 8 * u
    assert grad_error <= 32 * u
    assert 1 - cosines[worst] <= (32 * u) ** 2 / 2, worst


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_ddp_and_fsdp2_through_nccl_train_as_the_unwrapped_model(tmp_path, parallel):
    """One rank in an NCCL group: DDP's bucketed all-reduce and FSDP2's all-gather and reduce-scatter
    on the GPU, checked against the same steps without a wrapper (the tolerance of the two-rank CPU test)."""
    train(run_config(tmp_path / "plain", 1, parallel), _cuda(), loader_factory=fixed_loader)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        ctx = DistContext(env=DistEnv(), device=torch.device("cuda", 0), backend="nccl")
        result = train(run_config(tmp_path / "wrapped", 1, parallel), ctx, loader_factory=fixed_loader)
        assert result.state.models.sharded == (parallel == "fsdp")
    finally:
        dist.destroy_process_group()
    # the unwrapped run saves its tensors where they were (the GPU); FSDP gathers them to the CPU
    one = torch.load(tmp_path / "plain/checkpoints/checkpoint.pth", weights_only=False, map_location="cpu")
    two = torch.load(tmp_path / "wrapped/checkpoints/checkpoint.pth", weights_only=False, map_location="cpu")
    lr, ema = step_sizes(tmp_path / "plain")
    bound = 2 * STEPS * lr * 1.05
    assert trained_alike(one["student"], two["student"], lr, bound) == []
    assert trained_alike(one["teacher"], two["teacher"], ema * lr, ema * STEPS * bound) == []


def test_the_device_multicrop_never_waits_for_the_gpu():
    """data.gpu_augment: with the plan made by the loader thread, the training process's multi-crop
    copies it through pinned memory and launches the products without one host synchronisation,
    so the next batch's crops queue behind the running step instead of stalling it."""
    from training.config import Config
    from training.data.loading.torch_loader import RawTransform

    config = Config().replace({"data.channels": "01234"})
    transform = RawTransform(config, [0.5] * 5, [0.2] * 5)
    images = torch.randint(0, 60000, (32, 5, 50, 50), dtype=torch.int32).to(torch.uint16).pin_memory()
    raw, _ = transform(images, None, None, 3)
    reference = [c.cpu() for c in raw.crops(torch.device("cuda"))]  # warm-up: allocator, pinned blocks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        crops = raw.crops(torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(crops, reference):
        torch.testing.assert_close(a.cpu(), b)


class PinnedCrops:
    """Two batches of crops in pinned memory, cycled, as the ring loader hands them out on a GPU node."""

    def __init__(self, config, batches: int) -> None:
        from training.benchmarks.speed.step import SyntheticCrops

        staged = list(SyntheticCrops(config, batches=2))
        self.batches = [([c.pin_memory() for c in crops], labels) for crops, labels in staged]
        self.length = batches

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        for index in range(self.length):
            yield self.batches[index % 2]


@pytest.mark.parametrize("setting", ["bf16", "fp16", "bf16-ddp"])
def test_the_training_loop_never_waits_for_the_gpu(tmp_path, setting):
    """`pretrain`'s loop, counted with torch.cuda.set_sync_debug_mode from the end of step 2 to the
    end of step 6: fetching the batch, the step (forward, flags, backward, clipping, AdamW, EMA; the
    gradient scaler under fp16; DDP through NCCL), reading the previous step's flags and logging
    every step make no synchronising call. (Reading a step's flags waits on an event recorded after
    its forward, which the GPU has passed while the host queued its backward: no synchronising call.)"""
    import warnings

    precision = setting.split("-")[0]
    config = tiny_config({"run.output_dir": str(tmp_path), "data.channels": "01234", "optim.batch_size_per_gpu": 8,
                          "optim.epochs": 1, "train.precision": precision, "train.log_every": 1,
                          "train.tensorboard": False})
    loader = PinnedCrops(config, batches=6)
    syncs: list[str] = []

    def count_from_step_two(step: int) -> None:
        torch.cuda.set_sync_debug_mode("warn" if 2 <= step < 6 else "default")

    ctx = _cuda()
    if setting.endswith("ddp"):
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        ctx = DistContext(env=DistEnv(), device=torch.device("cuda", 0), backend="nccl")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = train(config, ctx, loader_factory=lambda config, ctx: (loader, loader),
                           on_step=count_from_step_two)
        syncs = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "synchroniz" in str(w.message)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
        if dist.is_initialized():
            dist.destroy_process_group()
    assert result.global_step == 6
    print(f"\n{setting}: {len(syncs)} synchronising calls in steps 3 to 6")
    assert syncs == [], "\n".join(syncs[:5])
