"""The one place that applies DDP, FSDP2 and torch.compile, and reads/writes their state dicts.

`wrap_model` prepares any module with a `backbone` (a ViT with `blocks`) and a `head` for
data-parallel training: the DINO student (`parallelize`, which adds the teacher) and the classifier
that `linear --finetune` trains (training/eval/finetune.py). Everything else works on the *raw*
modules (parameters, EMA, clipping, optimizer); the wrapped ones are used only for the forward and
backward passes.

- DDP (default) replicates the module; gradients are averaged during backward. The DINO teacher is
  never trained, so it is not wrapped: every rank applies the same EMA update and stays identical.
- FSDP2 (`train.parallel: fsdp`) shards each transformer block, the head and the rest of the module
  (for DINO, of the student *and* the teacher, so the EMA update runs shard by shard) over all ranks.
  Every forward then gathers parameters collectively, so all ranks must run the same number of them.
  Model state dicts are gathered to full tensors for saving, so the weights load into any mode (the
  optimizer state is keyed by parameter name under FSDP, so resume keeps the mode).
- `train.compile` compiles the backbones in place (`nn.Module.compile`), which keeps parameter names,
  in `train.compile_mode`; a mode with CUDA graphs needs each step to start a new graph
  generation (`mark_step_begin`), since the graphs' outputs are reused buffers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.config import Config
from training.distributed.groups import DistContext

log = logging.getLogger(__name__)


@dataclass
class ParallelModels:
    student: nn.Module
    """Raw student (MultiCropWrapper): parameters, state dict, EMA source."""
    teacher: nn.Module
    """Raw teacher: EMA target, state dict."""
    student_forward: nn.Module
    """What the training step calls for the student (DDP-wrapped, sharded or the raw module)."""
    sharded: bool
    """True under FSDP: state dicts need gathering."""


@dataclass
class WrappedModel:
    """A module prepared for data-parallel training by `wrap_model`."""

    module: nn.Module
    """The raw module (under FSDP the sharded module itself): parameters, optimizer, evaluation."""
    forward: nn.Module
    """What the training step calls (DDP-wrapped, sharded or the raw module)."""
    sharded: bool
    """True under FSDP: forwards are collective and state dicts need gathering."""

    def full_state_dict(self) -> dict[str, Any]:
        """Full weights; under FSDP a collective on all ranks whose result only rank 0 holds."""
        return full_state_dict(self.module, sharded=self.sharded)


def wrap_model(model: nn.Module, config: Config, ctx: DistContext, *, sync_batchnorm: bool = False) -> WrappedModel:
    """Move `model` to the device, compile its backbone (train.compile), wrap it (train.parallel).

    `model` needs `backbone.blocks` and `head`, the units FSDP shards. One process: no wrapper.
    `sync_batchnorm` turns BatchNorm layers into SyncBatchNorm under DDP on GPUs.
    """
    model.to(ctx.device)
    if config.train.compile:
        model.backbone.compile(dynamic=False, mode=config.train.compile_mode)
    if not ctx.distributed:
        return WrappedModel(model, model, sharded=False)
    if config.train.parallel == "fsdp":
        _fully_shard(model, ctx)
        return WrappedModel(model, model, sharded=True)
    if sync_batchnorm and ctx.device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return WrappedModel(model, DistributedDataParallel(model, device_ids=device_ids), sharded=False)


def parallelize(student: nn.Module, teacher: nn.Module, config: Config, ctx: DistContext) -> ParallelModels:
    """The DINO pair: the student wrapped for training, the teacher on the device (sharded under FSDP)."""
    teacher.to(ctx.device)
    if config.train.compile:
        teacher.backbone.compile(dynamic=False, mode=config.train.compile_mode)
    wrapped = wrap_model(student, config, ctx, sync_batchnorm=config.model.use_bn_in_head)
    if wrapped.sharded:
        _fully_shard(teacher, ctx)
    return ParallelModels(wrapped.module, teacher, wrapped.forward, sharded=wrapped.sharded)


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""torch.compile modes that replay CUDA graphs."""


def mark_step_begin(config: Config) -> None:
    """Tell torch.compile's CUDA graphs that a training step begins: the outputs of the previous
    step's replays may now be overwritten (without it, each step would hold on to them or copy them)."""
    if config.train.compile and config.train.compile_mode in CUDA_GRAPH_MODES:
        torch.compiler.cudagraph_mark_step_begin()


def _fully_shard(model: nn.Module, ctx: DistContext) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for unit in [*model.backbone.blocks, model.head]:
        fully_shard(unit, mesh=mesh)
    # Reshard the root too: the teacher has no backward that would do it, and the EMA update
    # needs sharded parameters on both sides. What is left in the root is small.
    fully_shard(model, mesh=mesh, reshard_after_forward=True)


def full_state_dict(model: nn.Module, *, sharded: bool) -> dict[str, Any]:
    """The unsharded state dict; under FSDP a collective on all ranks, gathered to rank 0's CPU."""
    if not sharded:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dict(model: nn.Module, state: dict[str, Any], *, sharded: bool) -> None:
    """Load an unsharded state dict; under FSDP each rank keeps its shard of it."""
    if not sharded:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def model_state(models: ParallelModels, which: str) -> dict[str, Any]:
    """Full (unsharded) state dict of the student or teacher; under FSDP a collective on all ranks."""
    return full_state_dict(getattr(models, which), sharded=models.sharded)


def load_model_state(models: ParallelModels, which: str, state: dict[str, Any]) -> None:
    load_full_state_dict(getattr(models, which), state, sharded=models.sharded)


def optimizer_state(models: ParallelModels, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    if not models.sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(models.student, optimizer, options=options)


def load_optimizer_state(models: ParallelModels, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    if not models.sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # A checkpoint of the first optim.freeze_last_layer epochs holds no state for the frozen last
    # layer, which has had no step yet. Loading makes one for every parameter (a step with zero
    # gradients); it is dropped again where the checkpoint had none, so that the first real step
    # starts it, as in a run that was never interrupted (names: fully_shard and compile keep them).
    options = StateDictOptions(full_state_dict=True, strict=False)
    set_optimizer_state_dict(models.student, optimizer, optim_state_dict=state, options=options)
    for name, param in models.student.named_parameters():
        if name not in state["state"]:
            optimizer.state.pop(param, None)
