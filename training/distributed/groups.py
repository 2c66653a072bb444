"""Process-group setup for every way this package is launched.

- `torchrun` (one machine or `srun torchrun` across Slurm nodes): RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR and MASTER_PORT come from torchrun.
- Slurm ranks without torchrun (`srun python -m training pretrain ...`, one task per process):
  SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS) and SLURM_LOCALID give the ranks; the master
  is the first host of SLURM_JOB_NODELIST (`scontrol show hostnames`) and the port is derived from
  the job id unless MASTER_PORT is set. A batch shell outside `srun` counts as a single process.
- Otherwise a single process, without a process group.

gloo on CPU, NCCL on GPU. Failures of collectives end the process instead of hanging it, so the
launcher can restart training (slurm/heal.sh):
- every collective times out after `timeout_min` (30 min): gloo raises, NCCL (with
  TORCH_NCCL_ASYNC_ERROR_HANDLING=1, set here as torchrun sets it for its workers) aborts its
  communicators and ends the process. The progress watchdog (train.hang_timeout_minutes, 20 min by
  default, training/recovery/watchdog.py) usually fires first; this timeout is the backstop, long
  enough for the other ranks to wait at the barrier while rank 0 writes a large checkpoint.
- NCCL's heartbeat monitor keeps its default (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=480): it ends a
  process whose NCCL watchdog thread itself is stuck.
Values already in the environment win.

A finished run must also exit cleanly, or the launcher counts it as failed. Two things make gloo
abort a process after its last step ("terminate called without an active exception", SIGABRT):
- a rank that tears down while another still talks to it: `cleanup` waits at a barrier first;
- a group that outlives `destroy_process_group`: its worker threads then release their last work
  during interpreter shutdown, when they can no longer take the GIL. The functions of
  torch.distributed.nn.functional take `group=group.WORLD` as a default argument, bound at their
  first import, and DDP and FSDP import that module lazily: imported after the group exists, they
  hold it for the life of the process. So this module imports it first, while no group exists,
  and `cleanup` collects garbage before the barrier. Measured with examples/ddp_minimal.py, two
  gloo ranks under torchrun on one machine: 4 aborts in 30 runs as it was, none in 80 with the
  import, none in 40 with only the garbage collection.
  (Under FSDP2, DTensor's caches still hold the group through its device mesh; the same teardown
  through `cleanup` ran 40 times without an abort.)
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before any group exists: see the module docstring

from training.logs import RANKS_LOGGER

log = logging.getLogger(__name__)
ranks_log = logging.getLogger(RANKS_LOGGER)
"""Logged by every rank, not only rank 0 (training/logs.py configure_logging): which ranks joined, what each did."""

NCCL_FAILURE_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
"""Set (unless already set) before an NCCL group starts: a failed or timed-out collective aborts
the communicators and ends the process, which the launcher sees as a failed worker."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: its ranks and how to reach rank 0."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "single"


@dataclass(frozen=True)
class DistContext:
    env: DistEnv
    device: torch.device
    backend: str | None

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def slurm_hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list such as "node[1-2]" with `scontrol show hostnames`."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True
    ).stdout
    return out.split()


def detect_env(
    environ: Mapping[str, str] | None = None,
    hostnames: Callable[[str], list[str]] = slurm_hostnames,
) -> DistEnv:
    """Read the launcher's environment variables (torchrun first, then Slurm, else single)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            launcher="torchrun",
        )
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", "0") or 0)
    if tasks > 1 and "SLURM_PROCID" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
        master = env.get("MASTER_ADDR") or hostnames(nodelist)[0]
        port = int(env.get("MASTER_PORT") or 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=tasks,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            master_addr=master,
            master_port=port,
            launcher="slurm",
        )
    return DistEnv()


def init_distributed(env: DistEnv | None = None, *, timeout_min: float = 30.0) -> DistContext:
    """Join the process group described by `env` (detected when None) and pick the device."""
    env = env or detect_env()
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if env.world_size == 1:
        return DistContext(env=env, device=device, backend=None)
    backend = "nccl" if use_cuda else "gloo"
    if backend == "nccl":
        for name, value in NCCL_FAILURE_ENV.items():
            os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_ADDR", env.master_addr)
    os.environ.setdefault("MASTER_PORT", str(env.master_port))
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}" if env.launcher == "slurm" else "env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(minutes=timeout_min),
        device_id=device if use_cuda else None,
    )
    ranks_log.info("rank %d/%d joined (%s, %s, launcher %s)", env.rank, env.world_size, backend, device, env.launcher)
    return DistContext(env=env, device=device, backend=backend)


def cleanup(ctx: DistContext, *, failed: bool = False) -> None:
    """Barrier, then destroy the group, so that the process exits cleanly (see the module docstring).

    After a failure the barrier is skipped: the other ranks may never reach it.
    """
    if not (ctx.distributed and dist.is_initialized()):
        return
    # Frees models left in reference cycles (they would hold the group), and lets gloo's threads
    # release the works already finished before the barrier takes them as prior work.
    gc.collect()
    if not failed:
        dist.barrier()
    dist.destroy_process_group()


@contextmanager
def process_group(env: DistEnv | None = None) -> Iterator[DistContext]:
    """`init_distributed` for the length of a step, then `cleanup`: the barrier only after a clean
    exit, since after an exception the other ranks may never reach it."""
    ctx = init_distributed(env)
    failed = True
    try:
        yield ctx
        failed = False
    finally:
        cleanup(ctx, failed=failed)


def all_reduce_sum(ctx: DistContext, values: torch.Tensor) -> list[float]:
    """Sum a small vector over all ranks and bring it to the host: one synchronisation per call."""
    values = values.detach().float()
    if ctx.distributed:
        dist.all_reduce(values)
    return values.tolist()


class HostValues:
    """A small device vector, summed over all ranks and on its way to the host (`all_reduce_sum_later`).

    On a GPU the sum is queued (NCCL runs it on its own stream, ordered after the values), then
    copied into pinned host memory without waiting, and an event is recorded right after the copy:
    `values()` waits for that event only, not for whatever was queued after it (the backward pass,
    the optimizer), so reading a step's flags once the next step has been queued never stalls the
    GPU. On a CPU everything has already run and `values()` just reads.
    """

    def __init__(self, ctx: DistContext, values: torch.Tensor) -> None:
        values = values.detach().float()
        if ctx.distributed:
            dist.all_reduce(values)
        self._event: torch.cuda.Event | None = None
        if values.device.type == "cuda":
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = values

    def ready(self) -> bool:
        """Whether `values()` would return without waiting."""
        return self._event is None or self._event.query()

    def values(self) -> list[float]:
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


def all_reduce_sum_later(ctx: DistContext, values: torch.Tensor) -> HostValues:
    """Sum a small vector over all ranks without waiting for it: read it later with `.values()`."""
    return HostValues(ctx, values)


def all_reduce_max(ctx: DistContext, value: int) -> int:
    """The largest of every rank's `value`."""
    if not ctx.distributed:
        return value
    box = torch.tensor([value], device=ctx.device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return int(box.item())


def all_gather_object(ctx: DistContext, value: object) -> list[object]:
    """Every rank's `value`, in rank order."""
    if not ctx.distributed:
        return [value]
    values: list[object] = [None] * ctx.world_size
    dist.all_gather_object(values, value)
    return values


def broadcast_object(ctx: DistContext, value: object) -> object:
    """Rank 0's value on every rank."""
    if not ctx.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
