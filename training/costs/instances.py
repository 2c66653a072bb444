"""The one table of GPU instance facts: the cluster's presets, slurm/env.sh's defaults, the scaling
model, the planner and the bill all read it.

    stacks/shared/presets.py          one Slurm queue per enabled preset (GPUs, vCPUs, EFA, NVMe)
    slurm/env.sh                      defaults of DEFAULT_PRESET (tests/infra/shared/test_presets_match_slurm.py)
    training/costs/scaling.py         GPUs per node, GPU memory, peaks and bus bandwidths
    training/planning/                the planner (`python -m training plan`)
    training/costs/bill.py            the bill after a run (partition -> preset)

It sits on the ground floor of the training package, in training/costs/: standard library only,
importing nothing of the package, so that every room above it (and the nodes, where stacks/ is not
installed) reads the same table without importing the rooms that read it
(tests/training/test_structure.py). Adding a preset is one `InstanceFacts` entry here and its price
in training/costs/prices.py. Every fact names its source and the date it was read; a figure no
source gives says "assumed" and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

READ = "2026-11-24"
"""The date every source below was read."""

_BATCH_GPU_TABLE = f"AWS Batch User Guide, 'Run GPU jobs' instance table (GPUs, GPU memory, vCPUs, memory, network), read {READ}"
_EFA_LIST = f"Amazon EC2 User Guide, Elastic Fabric Adapter, supported instance types, read {READ}"
_HYPERPOD = f"aws/sagemaker-hyperpod-cli INSTANCE_RESOURCES (ml.<type>: vCPUs, GPUs, memory GiB), read {READ}"
_P5EN_OFFER = f"dstack PR #4110, `dstack offer` of p5en.48xlarge (192 vCPU, 2048 GB, 8x H200 141 GB), read {READ}"
_P_SPECS = f"Amazon EC2 P4/P5 product pages (8 GPUs, 96/192 vCPUs, 1152/2048 GiB, 400/3200 Gbps EFA), read {READ}"
_NVME_ASSUMED = ("assumed: the EC2 instance-store table as known to the authors (not re-read here); the planner uses "
                 "it only to say whether a dataset fits node-local NVMe")
_NCCL_PUBLISHED = ("nccl-tests, published: awsome-distributed-training micro-benchmarks (2x p4de 78.3 GB/s, 2x p5 "
                   "443.7 GB/s at 2 GiB), nccl-tests issues #149 (8x A100 ~200 GB/s) and #212 (8x H100 ~370 GB/s), "
                   f"read {READ}")
_CARDS_ADT = ("awsome-distributed-training, architectures/aws-pcs README and add-cng-p5.yaml: p5.48xlarge 32 EFA "
              "network interfaces, p5en.48xlarge 16, one per network card; read 2026-11-26")
_CARDS_ASSUMED = ("assumed: {cards} network card(s), as the EC2 network specifications are known to the authors "
                  "(not re-read here); with fewer EFA interfaces than cards a node gets part of its bandwidth")
_PCIE_ASSUMED = ("assumed: no published nccl-tests figure; 80% of the bounds: PCIe {pcie} x16 inside the node "
                 "({intra_bound} GB/s usable), the {gbps} Gbps network line rate across nodes")


@dataclass(frozen=True)
class Gpu:
    """One GPU model: what the planner and the scaling model need, with the source."""

    model: str
    memory_gb: float
    peak_tflops: float
    """Dense tensor-core peak, TFLOP/s, in `peak_precision` (no sparsity)."""
    peak_precision: str
    """"bf16", or "fp16" where the GPU has no bf16 tensor cores (T4: training runs fp16 there)."""
    source: str


GPUS: dict[str, Gpu] = {gpu.model: gpu for gpu in (
    Gpu("T4", 16, 65.0, "fp16",
        f"NVIDIA T4 datasheet: 65 TFLOPS mixed precision (FP16), no bf16; 16 GB GDDR6; read {READ}"),
    Gpu("A10G", 24, 70.0, "bf16",
        "secondary: NVIDIA publishes no A10G datasheet; 70 TFLOPS dense FP16/BF16 tensor as in Baseten's "
        f"'NVIDIA A10 vs A10G' comparison; 24 GB from the AWS Batch GPU table (96 GiB / 4 GPUs); read {READ}"),
    Gpu("L40S", 48, 362.05, "bf16",
        f"NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS dense (733 sparse), 48 GB GDDR6; read {READ}"),
    Gpu("A100", 40, 312.0, "bf16",
        f"NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS dense (SXM), 40 GB HBM2 on p4d; read {READ}"),
    Gpu("H100", 80, 989.0, "bf16",
        f"NVIDIA H100 datasheet: BF16 tensor 1,979 TFLOPS with sparsity, 989 dense (SXM), 80 GB; read {READ}"),
    Gpu("H200", 141, 989.0, "bf16",
        f"NVIDIA H200 datasheet: BF16 tensor 1,979 TFLOPS with sparsity, 989 dense (SXM), 141 GB; read {READ}"),
    # GPUs of no preset, for `bench step`'s MFU where it runs on one (training/benchmarks/speed/step.py).
    Gpu("H100 PCIe", 80, 756.0, "bf16", "NVIDIA H100 datasheet: BF16 tensor 1,513 TFLOPS with sparsity, 756 dense "
        f"(PCIe), 80 GB; read {READ}"),
    Gpu("L4", 24, 121.0, "bf16", f"NVIDIA L4 datasheet: BF16 tensor 242 TFLOPS with sparsity, 121 dense, 24 GB; "
        f"read {READ}"),
    Gpu("V100", 16, 125.0, "fp16", f"NVIDIA V100 datasheet: 125 TFLOPS tensor (FP16), no bf16; 16 GB; read {READ}"),
)}


def peak_flops_of(device_name: str) -> float | None:
    """Dense tensor-core peak (FLOP/s) of the GPU a device name names (`torch.cuda.get_device_name`),
    the longest matching model first ("H100 PCIe" before "H100"); None for an unknown GPU."""
    for model in sorted(GPUS, key=len, reverse=True):
        if model in device_name:
            return GPUS[model].peak_tflops * 1e12
    return None


@dataclass(frozen=True)
class InstanceFacts:
    """One GPU instance type: what the cluster, the Slurm scripts, the scaling model and the planner use."""

    instance_type: str
    gpu: Gpu
    gpus: int
    vcpus: int
    memory_gib: int
    efa: bool
    """Elastic Fabric Adapter supported: NCCL traffic bypasses the kernel between nodes."""
    local_nvme_gb: int
    """Instance-store NVMe (total GB) that ParallelCluster mounts as scratch; 0: none."""
    network_gbps: int
    intra_busbw_gbs: float
    """All-reduce bus bandwidth (nccl-tests' busbw, large messages) inside one node."""
    inter_busbw_gbs: float
    """The same across nodes."""
    network_cards: int
    """Network cards, each of which gets one EFA interface where the launch template is ours (backend=pcs;
    ParallelCluster adds them itself)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Source of each fact above, by field name (the GPU's own facts: `gpu.source`)."""

    @property
    def cpus_per_gpu(self) -> int:
        return self.vcpus // self.gpus

    @property
    def busbw_source(self) -> str:
        return self.sources["intra_busbw_gbs"]


SOURCED_FACTS = ("gpus", "vcpus", "memory_gib", "efa", "local_nvme_gb", "network_gbps", "intra_busbw_gbs",
                 "inter_busbw_gbs", "network_cards")
"""The facts of InstanceFacts that each entry must source (a test checks it)."""


def _sources(shape: str, efa: str, nvme: str, busbw: str, cards: str) -> dict[str, str]:
    return {"gpus": shape, "vcpus": shape, "memory_gib": shape, "network_gbps": shape, "efa": efa,
            "local_nvme_gb": nvme, "intra_busbw_gbs": busbw, "inter_busbw_gbs": busbw, "network_cards": cards}


INSTANCES: dict[str, InstanceFacts] = {facts.instance_type: facts for facts in (
    InstanceFacts("g4dn.12xlarge", GPUS["T4"], gpus=4, vcpus=48, memory_gib=192, efa=True, local_nvme_gb=900,
                  network_gbps=50, intra_busbw_gbs=9.6, inter_busbw_gbs=5.0, network_cards=1,
                  sources=_sources(_BATCH_GPU_TABLE, _EFA_LIST, _NVME_ASSUMED,
                                   _PCIE_ASSUMED.format(pcie="3.0", intra_bound=12, gbps=50), _CARDS_ASSUMED.format(cards=1))),
    InstanceFacts("g5.12xlarge", GPUS["A10G"], gpus=4, vcpus=48, memory_gib=192, efa=True, local_nvme_gb=3800,
                  network_gbps=40, intra_busbw_gbs=20.0, inter_busbw_gbs=4.0, network_cards=1,
                  sources=_sources(_BATCH_GPU_TABLE, _EFA_LIST, _NVME_ASSUMED,
                                   _PCIE_ASSUMED.format(pcie="4.0", intra_bound=25, gbps=40), _CARDS_ASSUMED.format(cards=1))),
    InstanceFacts("g6e.12xlarge", GPUS["L40S"], gpus=4, vcpus=48, memory_gib=384, efa=True, local_nvme_gb=3800,
                  network_gbps=100, intra_busbw_gbs=20.0, inter_busbw_gbs=10.0, network_cards=1,
                  sources={**_sources(_HYPERPOD, _EFA_LIST, _NVME_ASSUMED,
                                      _PCIE_ASSUMED.format(pcie="4.0", intra_bound=25, gbps=100), _CARDS_ASSUMED.format(cards=1)),
                           "network_gbps": "assumed: 100 Gbps as AWS's G6e page states for the 12xlarge, not re-read here"}),
    InstanceFacts("p4d.24xlarge", GPUS["A100"], gpus=8, vcpus=96, memory_gib=1152, efa=True, local_nvme_gb=8000,
                  network_gbps=400, intra_busbw_gbs=200.0, inter_busbw_gbs=78.3, network_cards=4,
                  sources=_sources(_P_SPECS, _EFA_LIST, _NVME_ASSUMED, _NCCL_PUBLISHED, _CARDS_ASSUMED.format(cards=4))),
    InstanceFacts("p5.48xlarge", GPUS["H100"], gpus=8, vcpus=192, memory_gib=2048, efa=True, local_nvme_gb=30720,
                  network_gbps=3200, intra_busbw_gbs=370.0, inter_busbw_gbs=443.7, network_cards=32,
                  sources=_sources(_P_SPECS, _EFA_LIST, _NVME_ASSUMED, _NCCL_PUBLISHED, _CARDS_ADT)),
    InstanceFacts("p5en.48xlarge", GPUS["H200"], gpus=8, vcpus=192, memory_gib=2048, efa=True, local_nvme_gb=30720,
                  network_gbps=3200, intra_busbw_gbs=370.0, inter_busbw_gbs=443.7, network_cards=16,
                  sources=_sources(_P5EN_OFFER, _EFA_LIST, _NVME_ASSUMED,
                                   "assumed: p5.48xlarge's published figures (same NVLink 4 inside the node, "
                                   "3200 Gbps EFA across nodes); no published p5en nccl-tests figure", _CARDS_ADT)),
)}

LOCAL = "local"
"""The local Slurm cluster (scripts/local-slurm.sh): the planner's target name and Slurm's ClusterName there."""
DEFAULT_INSTANCE = "g4dn.12xlarge"
"""The preset a deployment gets when cdk.json names none, and slurm/env.sh's defaults."""


def instance(instance_type: str) -> InstanceFacts:
    """The facts of one instance type; a ValueError naming the known ones otherwise."""
    try:
        return INSTANCES[instance_type]
    except KeyError:
        raise ValueError(f"unknown instance type {instance_type!r}; known: {', '.join(INSTANCES)}") from None


def compute_resource_name(instance_type: str) -> str:
    """ParallelCluster compute resource name (lowercase, starts with a letter, <= 25 chars): g4dn.12xlarge -> g4dn12xl."""
    return instance_type.replace(".", "").replace("xlarge", "xl")


def queue_name(instance_type: str) -> str:
    """The Slurm partition of a preset's queue: `gpu-` + its compute resource name (gpu-g4dn12xl)."""
    return "gpu-" + compute_resource_name(instance_type)


def instance_of_partition(partition: str) -> InstanceFacts | None:
    """The preset whose queue a Slurm partition is, None for any other partition."""
    return next((facts for name, facts in INSTANCES.items() if queue_name(name) == partition), None)
