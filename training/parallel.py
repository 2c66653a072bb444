"""The one place that applies DDP, FSDP2 and torch.compile, and reads/writes their state dicts.

Everything else works on the *raw* student and teacher modules (parameters, EMA, clipping); the
wrapped modules returned here are used only for the forward and backward passes.

- DDP (default) replicates the student; gradients are averaged during backward. The teacher is never
  trained, so it is not wrapped: every rank applies the same EMA update and stays identical.
- FSDP2 (`train.parallel: fsdp`) shards each transformer block, the head and the rest of the student
  *and* the teacher over all ranks, so the EMA update runs shard by shard. Model state dicts are
  gathered to full tensors for checkpoints, so the weights load into any mode (the optimizer state
  is keyed by parameter name under FSDP, so resume keeps the mode).
- `train.compile` compiles the backbones in place (`nn.Module.compile`), which keeps parameter names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.config import Config
from training.distributed import DistContext

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


def parallelize(student: nn.Module, teacher: nn.Module, config: Config, ctx: DistContext) -> ParallelModels:
    """Move the models to the device, optionally compile, then wrap for data parallelism."""
    student.to(ctx.device)
    teacher.to(ctx.device)
    if config.train.compile:
        for model in (student, teacher):
            model.backbone.compile()
    mode = config.train.parallel
    if not ctx.distributed:
        return ParallelModels(student, teacher, student, sharded=False)
    if mode == "fsdp":
        _fully_shard(student, ctx)
        _fully_shard(teacher, ctx)
        return ParallelModels(student, teacher, student, sharded=True)
    if config.model.use_bn_in_head and ctx.device.type == "cuda":
        student = nn.SyncBatchNorm.convert_sync_batchnorm(student)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    wrapped = DistributedDataParallel(student, device_ids=device_ids)
    return ParallelModels(student, teacher, wrapped, sharded=False)


def _fully_shard(model: nn.Module, ctx: DistContext) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for unit in [*model.backbone.blocks, model.head]:
        fully_shard(unit, mesh=mesh)
    # Reshard the root too: the teacher has no backward that would do it, and the EMA update
    # needs sharded parameters on both sides. What is left in the root is small.
    fully_shard(model, mesh=mesh, reshard_after_forward=True)


def model_state(models: ParallelModels, which: str) -> dict[str, Any]:
    """Full (unsharded) state dict of the student or teacher; under FSDP a collective on all ranks."""
    model = getattr(models, which)
    if not models.sharded:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_model_state(models: ParallelModels, which: str, state: dict[str, Any]) -> None:
    model = getattr(models, which)
    if not models.sharded:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


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

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(models.student, optimizer, optim_state_dict=state, options=options)
