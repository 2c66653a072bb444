"""What the planner reads: the configuration, the dataset's size, the measured JSONs of `bench step`,
`bench loader` and the all-reduce benchmark, and the deployment settings; each turned into the
model's typed inputs (training/planning/model.py) with the source of every figure.

Without measured JSONs it uses this project's own measurement, and says so:
- MFU: 20.9 % with train.compile, 13.7 % eager: `bench step`, ViT-S/16 at 2 x 224 + 8 x 96 px,
  5 channels, bf16, 128 images per step, on one H200 with torch 2.11 (2026-11-26,
  docs/benchmarks/gpu_h200_2026-11-26/), taken for every GPU;
- loader: 3.95 CPU ms per image, the packed loader at 2 x 224 + 8 x 96 crops (docs/performance.md,
  measured on this project's 2-core machine), scaled by the crops' pixel count.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from training.config import Config
from training.config.dotted import DottedKeyError, context_pairs
from training.costs.flops import (
    activation_bytes_per_image,
    eval_flops_per_image,
    params_estimate,
    train_flops_per_image,
)
from training.costs.instances import InstanceFacts
from training.costs.prices import Price
from training.costs.scaling import Interconnect, StepProfile, profile_from_step_json, with_measured_busbw
from training.errors import UserError
from training.planning.model import Compute, Storage, Target, Workload, scaled_batch
from training.rundir import RunLayout

MEASURED_MFU = {True: 0.209, False: 0.137}
MFU_SOURCE = ("measured MFU {mfu:.1%} ({how}): bench step, ViT-S/16, 2 x 224 + 8 x 96 px, bf16, batch 128, one H200, "
              "torch 2.11, 2026-11-26 (docs/benchmarks/gpu_h200_2026-11-26/); taken for every GPU: give --step-json "
              "measured on yours")
LOADER_CPU_MS = 3.95
LOADER_CROP_PIXELS = 2 * 224**2 + 8 * 96**2
LOADER_SOURCE = ("published: the packed loader's 3.95 CPU ms per image at 2 x 224 + 8 x 96 (docs/performance.md, "
                 "2-core machine), scaled by the crops' pixel count")
BACKWARD_SHARE = 0.6
"""Backward's share of a step without a measurement: 2 of the ~3.3 forwards' worth of student and teacher FLOPs."""
NATIVE_SIDE = 48
"""Side in pixels of scDINO's single-cell images at native resolution (docs/performance.md's 48/24 crops)."""


@dataclass(frozen=True)
class PlanSettings:
    """The deployment settings the plan needs (stacks/shared/settings.py's Settings, read by the step)."""

    region: str
    presets: tuple[str, ...]
    max_nodes: int
    fsx_capacity_gib: int
    fsx_throughput_per_tib: int
    capacity_type: str
    backend: str = ""
    """The chosen back end; empty: the fixed cost of the back ends is not planned (training/planning/fixed.py)."""
    head_node_instance_type: str = ""
    login_node_instance_type: str = ""
    login_nodes: int = 0
    """ParallelCluster's login nodes (cluster.login_nodes)."""
    pcs_login_nodes: int = 0
    """PCS's login nodes: at least one, the only way in."""
    pcs_size: str = ""
    min_nodes: int = 0
    """Static GPU nodes per preset (cluster.min_nodes): billed while the cluster exists."""
    retain: bool = True
    """storage.retain: `cdk destroy --all` keeps the bucket, the file system and its key (training/planning/standing.py)."""
    root_volume_gib: int = 0
    """Each node's root volume (cluster.root_volume_gib); 0: not planned."""
    apps_volume_gib: int = 0
    """ParallelCluster's /apps volume on the head node (cluster.apps_volume_gib); 0: not planned."""

    @classmethod
    def of(cls, settings: Any) -> PlanSettings:
        """From stacks/shared/settings.py's Settings (passed in: the planner imports nothing of the CDK app)."""
        cluster = settings.cluster
        return cls(settings.region, cluster.presets, cluster.max_nodes, settings.storage.fsx_capacity_gib,
                   settings.storage.fsx_throughput_per_tib, cluster.capacity_type, backend=settings.backend,
                   head_node_instance_type=cluster.head_node_instance_type,
                   login_node_instance_type=cluster.login_node_instance_type, login_nodes=cluster.login_nodes,
                   pcs_login_nodes=settings.pcs_login_nodes, pcs_size=cluster.pcs_size, min_nodes=cluster.min_nodes,
                   retain=settings.storage.retain, root_volume_gib=cluster.root_volume_gib,
                   apps_volume_gib=cluster.apps_volume_gib)

    @property
    def storage(self) -> Storage:
        return Storage(self.fsx_capacity_gib, self.fsx_capacity_gib / 1024 * self.fsx_throughput_per_tib)


def cdk_context(given: Path | None, overrides: list[str]) -> dict[str, Any]:
    """The CDK context as `cdk` merges it: cdk.json's (`given`, else ./cdk.json, else the repository's),
    then each `-c KEY=VALUE`; the deployment settings are read from it by stacks/ (in the step)."""
    candidates = [given] if given else [Path("cdk.json"), Path(__file__).resolve().parents[2] / "cdk.json"]
    path = next((candidate for candidate in candidates if candidate.is_file()), None)
    if path is None:
        raise UserError(f"cdk.json not found ({given or 'in this folder or the repository'}): give --cdk-json PATH")
    try:
        return {**json.loads(path.read_text()).get("context", {}),
                **context_pairs(overrides, example="cluster.max_nodes=4")}
    except DottedKeyError as error:
        raise UserError(str(error)) from None


def read_json_file(path: Path | None, flag: str) -> dict[str, Any] | None:
    if path is None:
        return None
    if not path.is_file():
        raise UserError(f"{flag} {path}: no such file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{flag} {path} is not valid JSON ({exc}): give the file the benchmark wrote") from None
    if not isinstance(data, dict):
        raise UserError(f"{flag} {path}: expected a JSON object as the benchmark writes it")
    return data


def dataset_size(config: Config, layout: RunLayout, images: int | None,
                 image_bytes: float | None = None) -> tuple[int, float, str]:
    """(images, bytes per image, where from): the run's packed dataset when `prepare` made one, else
    --images with --image-bytes, or 16-bit images of the cells' native size."""
    from training.data.store.format import INDEX_FILE, is_packed
    from training.data.store.read import pixel_bytes, read_packed_index

    index = layout.packed / INDEX_FILE
    if images is None and is_packed(layout.packed):
        meta = read_packed_index(layout.packed)
        count = int(meta["n_cells"])
        return count, pixel_bytes(meta) / max(count, 1), f"packed dataset {index}"
    if images is None:
        raise UserError(f"no packed dataset at {layout.packed} to count: give --images N (the dataset's image "
                        "count) or run `python -m training prepare` first")
    if images < 1:
        raise UserError(f"--images {images}: give the number of images in the dataset (at least 1)")
    if image_bytes is not None:
        if image_bytes <= 0:
            raise UserError(f"--image-bytes {image_bytes}: give the stored size of one image in bytes (> 0)")
        return images, image_bytes, f"--images {images}, --image-bytes {image_bytes}"
    side = NATIVE_SIDE
    return images, config.data.in_chans * side * side * 2, (
        f"--images {images}; assumed 16-bit images of {config.data.in_chans} x {side} x {side} px (scDINO's cells at "
        "native resolution, docs/performance.md): give --image-bytes for yours")


def workload(config: Config, layout: RunLayout, images: int | None, image_bytes: float | None = None) -> Workload:
    count, image_bytes, source = dataset_size(config, layout, images, image_bytes)
    holdout = round(count * config.data.holdout_fraction)
    return Workload(
        train_images=count - holdout, holdout_images=holdout, image_bytes=image_bytes,
        epochs=config.optim.epochs, batch=config.optim.batch_size_per_gpu,
        flops_per_image=train_flops_per_image(config, config.data.in_chans),
        eval_flops_per_image=eval_flops_per_image(config, config.eval.image_size),
        params=params_estimate(config), activation_gb_per_image=activation_bytes_per_image(config) / 1e9,
        num_workers=config.data.num_workers, gpu_augment=config.data.gpu_augment, source=source)


def _measured_profile(step: dict[str, Any], flag: str) -> StepProfile:
    try:
        return profile_from_step_json(step)
    except SystemExit as exc:
        raise UserError(str(exc).removeprefix("error: ").replace("--step-json", flag)) from None


def _same_device(step: dict[str, Any], target: Target, gpu_model: str | None) -> bool:
    device = str(step.get("device", ""))
    return device == "cpu" if target.on_cpu else bool(gpu_model) and gpu_model in device


def _default_profile(config: Config, work: Workload, peak_tflops: float) -> tuple[StepProfile, str]:
    mfu = MEASURED_MFU[config.train.compile]
    flops = work.flops_per_image * work.batch
    step = flops / (mfu * peak_tflops * 1e12)
    how = "torch.compile" if config.train.compile else "eager"
    return (StepProfile(step, BACKWARD_SHARE * step, work.params, 0.0, flops, mfu),
            MFU_SOURCE.format(mfu=mfu, how=how))


def step_profile(config: Config, work: Workload, target: Target, gpu_model: str | None,
                 step: dict[str, Any] | None) -> tuple[StepProfile, str]:
    """The compute of one step on the target, and where it came from."""
    if step is None:
        if target.on_cpu:
            raise UserError("the local cluster has no published figure: give --step-json, the output of "
                            "`python -m training bench step --config ... --out step.json` on this machine")
        return _default_profile(config, work, target.net.peak_tflops)
    measured = scaled_batch(_measured_profile(step, "--step-json"), int(step.get("batch_size") or work.batch),
                            work.batch)
    where = f"bench step on {step.get('device')}"
    if step.get("batch_size") not in (None, work.batch):
        where += f" at batch {step['batch_size']}, scaled to {work.batch}"
    if _same_device(step, target, gpu_model):
        return measured, f"measured: {where}"
    if measured.mfu and not target.on_cpu:
        profile, basis = measured.on(target.net)
        return profile, f"{basis}: {where}"
    if target.on_cpu:
        raise UserError(f"--step-json was measured on {step.get('device')}, not on a CPU: give a `bench step` of "
                        "this machine for the local cluster")
    profile, basis = _default_profile(config, work, target.net.peak_tflops)
    return profile, basis + f" (the measured step ran on {step.get('device')}: not transferable without its MFU)"


def loader_seconds(config: Config, loader: dict[str, Any] | None) -> tuple[float, str]:
    """CPU seconds per image of the loader the config uses."""
    if config.data.gpu_augment:
        if loader and loader.get("device_augment", {}).get("cpu_ms_per_image") is not None:
            return loader["device_augment"]["cpu_ms_per_image"] / 1000, "measured: bench loader, device-side crops"
        return 0.0, "data.gpu_augment: crops made on the GPU; the loader's CPU time is not counted"
    if loader and loader.get("packed_cpu_ms_per_image") is not None:
        return loader["packed_cpu_ms_per_image"] / 1000, "measured: bench loader, packed loader"
    dino = config.dino
    pixels = 2 * dino.global_crop_size**2 + dino.local_crops_number * dino.local_crop_size**2
    return LOADER_CPU_MS / 1000 * pixels / LOADER_CROP_PIXELS, LOADER_SOURCE


def compute(config: Config, work: Workload, target: Target, gpu_model: str | None, step: dict[str, Any] | None,
            loader: dict[str, Any] | None, busbw: dict[str, Any] | None) -> Compute:
    profile, step_basis = step_profile(config, work, target, gpu_model, step)
    loader_s, loader_basis = loader_seconds(config, loader)
    measured = step or {}
    startup = float(measured.get("startup_s") or 0.0) + float((busbw or {}).get("init_s") or 0.0)
    warmup, raw_step = measured.get("warmup_step_s"), measured.get("step_time_s")
    scale = work.batch / int(measured.get("batch_size") or work.batch)
    basis = {"step": step_basis, "loader": loader_basis,
             "network": target.net.source,
             "startup": ("measured: bench step's import and build" + (" + the all-reduce benchmark's process-group "
                                                                        "start" if busbw else "")
                         if step and step.get("startup_s") is not None else "not counted: no bench step start-up"),
             "checkpoint": ("measured: bench step's save of the checkpointed state"
                            if step and step.get("checkpoint_s") is not None else "not counted")}
    if target.on_cpu:
        basis["overlap"] = "assumed 0: a CPU rank with one core has none spare to hide the all-reduce"
    return Compute(profile=profile, loader_s_per_image=loader_s, startup_s=startup,
                   warmup_extra_s=max(0.0, float(warmup) - float(raw_step)) * scale if warmup and raw_step else 0.0,
                   checkpoint_s=float(measured.get("checkpoint_s") or 0.0),
                   overlap=0.0 if target.on_cpu else 0.8, basis=basis)


def preset_target(facts: InstanceFacts, price: Price | None, busbw: dict[str, Any] | None) -> Target:
    net = Interconnect.of(facts)
    if busbw is not None:
        net = with_measured_busbw(net, busbw, "--busbw-json")
    return Target(facts.instance_type, facts.gpus, facts.cpus_per_gpu, facts.memory_gib, facts.local_nvme_gb,
                  net, facts.gpu.memory_gb, price)


def local_target(busbw: dict[str, Any] | None, ranks_per_node: int = 1) -> tuple[Target, list[str]]:
    """The local Slurm cluster (scripts/local-slurm.sh): this machine's cores and memory shared by its
    nodes, one rank per node with one thread (OMP_NUM_THREADS=1), gloo between them."""
    warnings = []
    if busbw is None:
        warnings.append("no measured all-reduce bandwidth for the local cluster: the all-reduce is not counted "
                        "(give --busbw-json from `python -m training.benchmarks.speed.allreduce` run under torchrun)")
        net = Interconnect(ranks_per_node, 0.0, float("inf"), float("inf"), 0.0, "not measured")
    else:
        measured = float(busbw["busbw_gbs"])
        net = Interconnect(ranks_per_node, 0.0, measured, measured, 0.0,
                           f"measured: all-reduce benchmark, {busbw.get('backend', 'gloo')} across "
                           f"{busbw.get('nodes', '?')} node(s), {measured} GB/s")
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return Target("local", ranks_per_node, 1, memory_gib, 0.0, net, None, None, on_cpu=True), warnings


def with_price(target: Target, price: Price | None) -> Target:
    return replace(target, price=price)
