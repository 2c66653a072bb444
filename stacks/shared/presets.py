"""GPU instance presets: one Slurm queue per enabled preset.

The facts of each instance type (GPUs, vCPUs, EFA, NVMe, GPU memory, peaks) come from the one
table in training/costs/instances.py, which the nodes, the scaling model and the planner read
too; this module adds what only the cluster needs (queue and compute resource names). It is also
the machine-readable contract between the cluster and the Slurm scripts: the deploy tells the nodes
each enabled preset's queue, GPUs per node and CPUs per GPU (`node_shape`, in the bundle pointer;
slurm/env.sh reads what the node bootstrap renders from it), and without that `slurm/env.sh`
defaults to those of `DEFAULT_PRESET` (tests run both files and compare them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from training.costs.instances import DEFAULT_INSTANCE, INSTANCES, InstanceFacts, compute_resource_name, queue_name


@dataclass(frozen=True)
class GpuPreset:
    """What the cluster and the sbatch scripts need to know about one GPU instance type."""

    instance_type: str
    gpus_per_node: int
    vcpus: int
    gpu_model: str
    efa: bool
    """Elastic Fabric Adapter supported: NCCL traffic bypasses the kernel between nodes."""
    placement_group: bool
    """Cluster placement group: nodes on the same network spine (useful only with EFA)."""
    local_nvme: bool
    """Instance-store NVMe mounted as scratch (by ParallelCluster, or by the PCS nodes' user data)."""
    network_cards: int = 1
    """Network cards: the PCS launch template gives each an EFA interface (ParallelCluster does it itself)."""

    @property
    def cpus_per_gpu(self) -> int:
        """vCPUs Slurm gives each GPU task (data loading workers live there)."""
        return self.vcpus // self.gpus_per_node

    @property
    def queue_name(self) -> str:
        """Slurm partition name: `gpu-` + instance type without dots and `arge` (g4dn.12xlarge -> gpu-g4dn12xl)."""
        return queue_name(self.instance_type)

    @property
    def compute_resource_name(self) -> str:
        return compute_resource_name(self.instance_type)


def preset_of(facts: InstanceFacts) -> GpuPreset:
    """The cluster's view of one instance type of the table: EFA types get a placement group too."""
    return GpuPreset(facts.instance_type, gpus_per_node=facts.gpus, vcpus=facts.vcpus, gpu_model=facts.gpu.model,
                     efa=facts.efa, placement_group=facts.efa, local_nvme=facts.local_nvme_gb > 0,
                     network_cards=facts.network_cards)


PRESETS: dict[str, GpuPreset] = {name: preset_of(facts) for name, facts in INSTANCES.items()}

DEFAULT_PRESET = DEFAULT_INSTANCE

# The defaults slurm/env.sh must carry, by the variable name it uses.
SLURM_DEFAULTS: dict[str, str] = {
    "SCDINO_PARTITION": PRESETS[DEFAULT_PRESET].queue_name,
    "SCDINO_GPUS_PER_NODE": str(PRESETS[DEFAULT_PRESET].gpus_per_node),
    "SCDINO_CPUS_PER_GPU": str(PRESETS[DEFAULT_PRESET].cpus_per_gpu),
}


def node_shape(presets: Sequence[str]) -> dict[str, Any]:
    """The cluster's shape as its nodes learn it (the bundle pointer's "cluster" entry): each enabled
    preset's instance type, queue, GPUs per node and vCPUs per GPU, in `cluster.presets` order. The
    first is the cluster's default partition on both back ends: ParallelCluster makes its first queue
    the default, and the PCS stack sets Default=YES on that queue. bootstrap/cluster-env.py renders it
    for slurm/env.sh."""
    return {"presets": [{"instance_type": PRESETS[name].instance_type, "queue": PRESETS[name].queue_name,
                         "gpus_per_node": PRESETS[name].gpus_per_node, "cpus_per_gpu": PRESETS[name].cpus_per_gpu}
                        for name in presets]}
