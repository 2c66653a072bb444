"""The AWS PCS cluster's node groups and queues, built by a pure function from the settings.

`pcs_node_groups(settings)` says what the PCS stack creates: one compute node group and queue per
enabled GPU preset, named like ParallelCluster's partitions so that slurm/ runs unchanged, the
optional Spot CPU queue, and the login node group (no queue). A group whose instance type is a setting
(login, cpu-spot) carries the type in its name: PCS cannot change a group's type in place, and
CloudFormation creates the replacement before it deletes the old group. `mime_user_data` wraps the node script
in the MIME multi-part archive PCS requires of a launch template's user data. Nothing here touches
CDK or AWS, so tests check every purchase option without synthesising.
"""

from __future__ import annotations

from dataclasses import dataclass

from stacks.shared.constants import CPU_SPOT_QUEUE
from stacks.shared.presets import PRESETS, GpuPreset
from stacks.shared.settings import PCS_GROUP_IDLE_SLURM, Settings, slurm_release

LOGIN_GROUP = "login"
COMPUTE_NODE = "ComputeFleet"
LOGIN_NODE = "LoginNode"
"""Node types as the node bootstrap knows them (ParallelCluster's cfn_node_type values)."""
PURCHASE_OPTIONS = {"ONDEMAND": "ONDEMAND", "SPOT": "SPOT", "CAPACITY_BLOCK": "CAPACITY_BLOCK"}
"""cluster.capacity_type -> the node group's PurchaseOption."""
MIME_BOUNDARY = "==SCDINO-PCS-NODE=="


@dataclass(frozen=True)
class NodeGroupSpec:
    """One PCS compute node group, its launch template's choices, and its queue (empty: none)."""

    key: str
    """What the group is, whatever its instance type: its construct id and its nodes' tag (<cluster>/<key>)."""
    name: str
    """Its name in PCS (unique in the cluster, at most 25 characters)."""
    instance_type: str
    min_count: int
    max_count: int
    purchase_option: str
    queue: str
    node_type: str
    efa_interfaces: int = 0
    """EFA interfaces in the launch template, one per network card; 0: the cluster security group only."""
    placement_group: bool = False
    capacity_reservation_id: str = ""
    gpu: bool = False
    default_queue: bool = False
    """The cluster's default partition: the first preset's queue (presets.node_shape)."""
    scaledown_idle_seconds: int = 0
    """Seconds an idle node of this group runs before PCS stops it; 0: the group carries none (the login group,
    or a Slurm release before 25.11, where only the cluster's applies)."""

    @property
    def capacity_block(self) -> bool:
        return self.purchase_option == "CAPACITY_BLOCK"


def idle_seconds(queue: str, settings: Settings) -> int:
    """The queue's group's scale-down idle time: its override, else the cluster's; 0 where the Slurm release
    takes none per group. Every queued group carries it, so that removing an override sets the group back
    to the cluster's time (a group keeps an override PCS is no longer sent)."""
    if slurm_release(settings.image.pcs_slurm_version) < slurm_release(PCS_GROUP_IDLE_SLURM):
        return 0
    return settings.cluster.idle_minutes_by_queue.get(queue, settings.cluster.scaledown_idle_minutes) * 60


def _gpu_group(preset: GpuPreset, settings: Settings) -> NodeGroupSpec:
    """A preset's group: named like its ParallelCluster partition, the first preset's queue the default; a
    reservation decides placement."""
    cluster = settings.cluster
    return NodeGroupSpec(
        key=preset.queue_name, name=preset.queue_name, instance_type=preset.instance_type, min_count=cluster.min_nodes,
        max_count=cluster.max_nodes, purchase_option=PURCHASE_OPTIONS[cluster.capacity_type],
        queue=preset.queue_name, node_type=COMPUTE_NODE,
        efa_interfaces=preset.network_cards if preset.efa else 0,
        placement_group=preset.placement_group and not cluster.capacity_reservation_id,
        capacity_reservation_id=cluster.capacity_reservation_id, gpu=True,
        default_queue=preset.instance_type == cluster.presets[0],
        scaledown_idle_seconds=idle_seconds(preset.queue_name, settings))


def pcs_node_groups(settings: Settings) -> list[NodeGroupSpec]:
    """Every node group of the cluster: GPU presets, the Spot CPU queue if enabled, the login nodes."""
    cluster = settings.cluster
    groups = [_gpu_group(PRESETS[name], settings) for name in cluster.presets]
    if cluster.cpu_spot_instance_type:
        groups.append(NodeGroupSpec(
            key=CPU_SPOT_QUEUE, name=settings.pcs_cpu_spot_group, instance_type=cluster.cpu_spot_instance_type,
            min_count=0, max_count=cluster.cpu_spot_max_nodes, purchase_option="SPOT", queue=CPU_SPOT_QUEUE,
            node_type=COMPUTE_NODE, scaledown_idle_seconds=idle_seconds(CPU_SPOT_QUEUE, settings)))
    logins = settings.pcs_login_nodes
    groups.append(NodeGroupSpec(
        key=LOGIN_GROUP, name=settings.pcs_login_group, instance_type=cluster.login_node_instance_type,
        min_count=logins, max_count=logins, purchase_option="ONDEMAND", queue="", node_type=LOGIN_NODE))
    return groups


def node_group_tag(settings: Settings, key: str) -> str:
    """The NODE_GROUP_TAG value on the nodes of the group `key` (a NodeGroupSpec's key): <cluster>/<key>. The login
    nodes are found by <cluster>/login (the ConnectCommand output, the REST client's port forwards,
    `python -m stacks.deployment ssm`), whatever their group's name."""
    return f"{settings.cluster_name}/{key}"


def group_id(spec: NodeGroupSpec) -> str:
    """A construct id for a group: PascalCase of its key (gpu-g4dn12xl -> GpuG4dn12xl), the same whatever its type."""
    return "".join(part[:1].upper() + part[1:] for part in spec.key.split("-"))


def mime_user_data(script: str) -> str:
    """`script` as the one text/x-shellscript part of a MIME multi-part archive, with the blank lines
    PCS asks for: before each boundary, after each part's headers, before the closing boundary. Such a
    part runs after the node registers with PCS and before slurmd starts."""
    return "\n".join([
        "MIME-Version: 1.0",
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"',
        "",
        f"--{MIME_BOUNDARY}",
        'Content-Type: text/x-shellscript; charset="us-ascii"',
        "MIME-Version: 1.0",
        "",
        script.rstrip("\n"),
        "",
        f"--{MIME_BOUNDARY}--",
        "",
    ])


def node_script(body: str, values: dict[str, str]) -> str:
    """The node script (bootstrap/pcs-node.sh) with its settings exported above it, shebang first."""
    lines = body.splitlines()
    shebang, rest = (lines[0], lines[1:]) if lines and lines[0].startswith("#!") else ("#!/bin/bash", lines)
    exports = [f"export {name}='{value}'" for name, value in values.items()]
    return "\n".join([shebang, *exports, *rest]) + "\n"

