"""The time and cost model of a run: what `python -m training plan` prints, per preset and node count.

Pretraining, weak-scaled (a fixed batch per GPU, or per rank on the local CPU cluster):

    steps per epoch = (training images / ranks, padded) // batch            (as the sampler draws them)
    step            = max(compute + exposed all-reduce, loader)              (the loader prefetches)
                      (+ the loader's whole time when data.num_workers is 0: it runs in the step)
    epoch 1         = max(steps x step, dataset bytes / FSx throughput)      (first read from FSx)
    later epochs    = steps x step, or FSx-bound again when the dataset fits neither the page cache
                      (half a node's memory) nor the node-local NVMe
    wall            = start-up + warm-up + epochs x (epoch + one checkpoint save)

Compute is `bench step`'s measured step where it ran on the same kind of device, its FLOPs at its
measured MFU on another GPU, or without a measurement the analytic FLOPs at the MFU measured on an
H200 (training/planning/inputs.py); the exposed all-reduce is training/costs/scaling.py's
model; the loader's CPU time per image is `bench loader`'s or a published figure. Each row says which
figures it used (`basis`) and names the bottleneck among "gpu step" (compute, CPU on the local
cluster), "loader cpu", "fsx" and "network".
Standard library only: the planner answers in well under a second per preset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from training.costs.prices import Price
from training.costs.scaling import Interconnect, StepProfile, efficiency, replicated_state_gb

GIB = 2**30
PAGE_CACHE_FRACTION = 0.5
"""Share of a node's memory the planner counts on for caching the dataset between epochs."""
GPU_MEMORY_FRACTION = 0.9
"""Share of a GPU's memory a batch may use before the planner warns (allocator, CUDA context)."""


@dataclass(frozen=True)
class Workload:
    """What the run asks for, from its configuration and its dataset."""

    train_images: int
    holdout_images: int
    image_bytes: float
    """Bytes per image as stored (the packed dataset's element size x its shape)."""
    epochs: int
    batch: int
    """Images per rank per step (optim.batch_size_per_gpu)."""
    flops_per_image: float
    eval_flops_per_image: float
    params: int
    activation_gb_per_image: float
    num_workers: int
    gpu_augment: bool
    source: str
    """Where the image count and size came from."""

    @property
    def dataset_bytes(self) -> float:
        return (self.train_images + self.holdout_images) * self.image_bytes


@dataclass(frozen=True)
class Target:
    """Where the run would train: one preset of the instance table, or the local Slurm cluster."""

    name: str
    ranks_per_node: int
    cpus_per_rank: int
    memory_gib: float
    local_nvme_gb: float
    net: Interconnect
    gpu_memory_gb: float | None
    """None on the CPU-only local cluster."""
    price: Price | None
    on_cpu: bool = False

    @property
    def unit(self) -> str:
        return "core_h" if self.on_cpu else "gpu_h"


@dataclass(frozen=True)
class Compute:
    """The per-step figures of one target, and where each came from."""

    profile: StepProfile
    """The step on this target (compute only), with its backward time and parameter count."""
    loader_s_per_image: float
    """CPU seconds the loader spends per image (0 when the crops are made on the GPU)."""
    startup_s: float
    warmup_extra_s: float
    checkpoint_s: float
    overlap: float
    """Fraction of backward that hides the all-reduce (0 on CPU ranks: no spare core to run it)."""
    basis: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Storage:
    fsx_capacity_gib: int
    fsx_throughput_mbps: float
    """Baseline throughput of the whole file system, MB/s (capacity x per-TiB throughput)."""


@dataclass(frozen=True)
class Plan:
    """One row: a target on a node count."""

    preset: str
    nodes: int
    wall_h: float
    gpu_h: float
    unit: str
    cost_usd: float | None
    bottleneck: str
    warnings: list[str]
    detail: dict

    def row(self) -> dict:
        return {"preset": self.preset, "nodes": self.nodes, "wall_h": round(self.wall_h, 4),
                "gpu_h": round(self.gpu_h, 4), "unit": self.unit,
                "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
                "bottleneck": self.bottleneck, "warnings": self.warnings, **self.detail}


def steps_per_epoch(workload: Workload, ranks: int) -> int:
    """Full batches per rank: the shard is padded to a multiple of the ranks, the last batch dropped."""
    return math.ceil(workload.train_images / ranks) // workload.batch


def step_seconds(workload: Workload, target: Target, compute: Compute, nodes: int) -> dict[str, float]:
    """The parts of one step on `nodes` nodes: compute, exposed all-reduce, loader; and the step."""
    _, exposed = efficiency(compute.profile, target.net, nodes, grad_bytes_per_param=4, overlap=compute.overlap)
    loader_cpu = workload.batch * compute.loader_s_per_image
    if workload.num_workers == 0:
        step = compute.profile.step_time_s + exposed + loader_cpu
        loader = loader_cpu
    else:
        loader = loader_cpu / max(1, min(workload.num_workers, target.cpus_per_rank - 1))
        step = max(compute.profile.step_time_s + exposed, loader)
    return {"compute_s": compute.profile.step_time_s, "allreduce_exposed_s": exposed, "loader_s": loader,
            "step_s": step}


def fsx_epoch_seconds(workload: Workload, storage: Storage) -> float:
    return workload.dataset_bytes / (storage.fsx_throughput_mbps * 1e6)


def later_epochs_cached(workload: Workload, target: Target) -> bool:
    """Whether epochs after the first read from the page cache or the node-local NVMe, not FSx."""
    fits_memory = workload.dataset_bytes <= PAGE_CACHE_FRACTION * target.memory_gib * GIB
    return fits_memory or workload.dataset_bytes <= target.local_nvme_gb * 1e9


def bottleneck(parts: dict[str, float], fsx_s: float, steps: int, epochs: int, cached: bool) -> str:
    """The part that costs the most time over the run."""
    fsx_total = fsx_s * (1 if cached else epochs)
    step_total = steps * epochs
    costs = {"gpu step": parts["compute_s"] * step_total, "network": parts["allreduce_exposed_s"] * step_total,
             "loader cpu": parts["loader_s"] * step_total, "fsx": fsx_total}
    return max(costs, key=costs.get)


def pretrain_seconds(workload: Workload, target: Target, compute: Compute, storage: Storage | None,
                     nodes: int) -> dict[str, float | int]:
    """Wall seconds of pretraining on `nodes` nodes and its parts."""
    ranks = nodes * target.ranks_per_node
    steps = steps_per_epoch(workload, ranks)
    parts = step_seconds(workload, target, compute, nodes)
    compute_epoch = steps * parts["step_s"]
    fsx_s = fsx_epoch_seconds(workload, storage) if storage else 0.0
    cached = later_epochs_cached(workload, target)
    first = max(compute_epoch, fsx_s)
    later = compute_epoch if cached else max(compute_epoch, fsx_s)
    epochs_s = first + (workload.epochs - 1) * later + workload.epochs * compute.checkpoint_s
    wall = compute.startup_s + compute.warmup_extra_s + epochs_s
    return {**parts, "ranks": ranks, "steps_per_epoch": steps, "fsx_epoch_s": fsx_s, "later_epochs_cached": cached,
            "startup_s": compute.startup_s, "warmup_extra_s": compute.warmup_extra_s,
            "checkpoint_s": compute.checkpoint_s, "pretrain_s": wall,
            "bottleneck": bottleneck(parts, fsx_s, steps, workload.epochs, cached)}


def downstream_seconds(workload: Workload, compute: Compute) -> float:
    """Feature extraction (trained and random-init backbones, one forward each per held-out image)
    on one rank at the pretraining step's achieved FLOP rate, plus one start-up per downstream step
    (features, labels, knn, linear, plots, report); the kNN and the linear probe on features are
    seconds and are not modelled further."""
    profile = compute.profile
    achieved = profile.flops_per_step / profile.step_time_s if profile.flops_per_step and profile.step_time_s else 0.0
    forward = 2 * workload.holdout_images * workload.eval_flops_per_image / achieved if achieved else 0.0
    return forward + 6 * compute.startup_s


def memory_gb(workload: Workload) -> float:
    """GPU memory a rank needs: the replicated state (weights, gradients, AdamW, teacher) plus the
    activations of one batch."""
    return replicated_state_gb(workload.params) + workload.batch * workload.activation_gb_per_image


def warnings_for(workload: Workload, target: Target, storage: Storage | None, parts: dict,
                 compute: Compute) -> list[str]:
    """Each warning names its fix."""
    found = []
    if storage and workload.dataset_bytes > storage.fsx_capacity_gib * GIB:
        found.append(f"the dataset ({workload.dataset_bytes / 1e9:.0f} GB) is larger than the file system "
                     f"(storage.fsx_capacity_gib={storage.fsx_capacity_gib}): raise it to a multiple of 2400")
    if storage and parts["fsx_epoch_s"] > parts["steps_per_epoch"] * parts["step_s"]:
        found.append(f"FSx for Lustre at {storage.fsx_throughput_mbps:.0f} MB/s needs "
                     f"{parts['fsx_epoch_s'] / 60:.1f} min to read the dataset, longer than an epoch's compute: "
                     "raise storage.fsx_throughput_per_tib or the capacity, or stage it to NVMe "
                     "(slurm/stage_nvme.slurm) before training")
    if not workload.gpu_augment and not target.on_cpu and parts["loader_s"] > parts["compute_s"]:
        found.append(loader_warning(workload, target, parts))
    if target.gpu_memory_gb and memory_gb(workload) > GPU_MEMORY_FRACTION * target.gpu_memory_gb:
        found.append(f"a batch of {workload.batch} needs about {memory_gb(workload):.1f} GB, more than "
                     f"{GPU_MEMORY_FRACTION:.0%} of the GPU's {target.gpu_memory_gb:.0f} GB: lower "
                     "optim.batch_size_per_gpu or shard the state (train.parallel=fsdp)")
    return found


def loader_warning(workload: Workload, target: Target, parts: dict) -> str:
    """The loader is slower than the GPU: more workers where the vCPUs allow, else crops on the GPU."""
    slower = f"the loader ({parts['loader_s']:.3f} s per batch) is slower than the GPU ({parts['compute_s']:.3f} s)"
    if workload.num_workers < target.cpus_per_rank - 1:
        return (f"{slower} with data.num_workers={workload.num_workers}: raise it towards the "
                f"{target.cpus_per_rank - 1} spare vCPUs per GPU, or set data.gpu_augment=true")
    return (f"{slower}: {target.cpus_per_rank} vCPUs per GPU cannot make the crops as fast as the GPU uses them: "
            "set data.gpu_augment=true")


def plan(workload: Workload, target: Target, compute: Compute, storage: Storage | None, nodes: int,
         extra_warnings: list[str] | None = None) -> Plan:
    """One row of the plan: wall time, GPU-hours (core-hours locally), cost, bottleneck, warnings."""
    parts = pretrain_seconds(workload, target, compute, storage, nodes)
    downstream = downstream_seconds(workload, compute)
    wall_h = parts["pretrain_s"] / 3600
    per_node = target.ranks_per_node * (target.cpus_per_rank if target.on_cpu else 1)
    cost = wall_h * nodes * target.price.usd_per_hour if target.price else None
    warnings = warnings_for(workload, target, storage, parts, compute) + list(extra_warnings or [])
    detail = {"pretrain": {k: (round(v, 5) if isinstance(v, float) else v) for k, v in parts.items()},
              "downstream_h": round(downstream / 3600, 5),
              "price": None if target.price is None else {"usd_per_hour": target.price.usd_per_hour,
                                                          "source": target.price.source, "date": target.price.date},
              "basis": compute.basis}
    return Plan(target.name, nodes, wall_h, wall_h * nodes * per_node, target.unit, cost, parts["bottleneck"],
                warnings, detail)


def scaled_batch(profile: StepProfile, measured_batch: int, batch: int) -> StepProfile:
    """A step measured at another batch, scaled linearly (per-image work dominates at these sizes)."""
    if measured_batch == batch:
        return profile
    factor = batch / measured_batch
    return replace(profile, step_time_s=profile.step_time_s * factor, backward_s=profile.backward_s * factor,
                   flops_per_step=profile.flops_per_step * factor)
