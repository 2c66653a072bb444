"""The ParallelCluster 3 cluster configuration, built by a pure function.

`build_cluster_config(settings, refs)` takes resource references as plain strings: CDK tokens
when the cluster stack builds it, placeholder ids when tests validate it against
ParallelCluster's own schema. Nothing here touches CDK or AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stacks.shared.constants import (
    APPS_MOUNT_DIR,
    BOOTSTRAP_SCRIPT_KEY,
    BUNDLE_DIR,
    BUNDLE_POINTER_KEY,
    CLOUDWATCH_AGENT_POLICY,
    CPU_SPOT_QUEUE,
    FSX_MOUNT_DIR,
    SCRATCH_DIR,
    SSM_POLICY,
)
from stacks.shared.presets import PRESETS, GpuPreset
from stacks.shared.settings import Settings
from training.costs.instances import compute_resource_name


@dataclass(frozen=True)
class ClusterRefs:
    """Ids and ARNs of resources made by the other stacks (tokens or literal strings)."""

    subnet_id: str
    security_group_id: str
    file_system_id: str
    data_policy_arn: str
    """Managed policy giving nodes read access to the data prefix of the bucket (they write through /fsx)."""
    deploy_bucket: str
    """Bucket holding the bootstrap script, the bundle pointer and the bundles, at fixed keys."""
    bundle_id: str
    """Id (content hash) of the bundle this rendering deploys; only the head node's OnNodeUpdated names it."""
    deploy_read_policy_arn: str = ""
    """Managed policy reading the deploy bucket, for login nodes (their Iam has no S3Access)."""
    partition: str = "aws"
    custom_ami: str = ""
    """An AMI id for the compute queues, or empty for the official ParallelCluster AMI."""
    agent_limits_policy_arn: str = ""
    """Managed policy capping the CloudWatch agent's policy to this cluster's namespaces and log groups, on every
    node (the cluster stack's `AgentLimitsPolicy`); empty: none (a configuration rendered without the stack)."""
    rest_token_policy_arn: str = ""
    """Managed policy letting the head node write the Slurm REST API's token into its secret
    (stacks/shared/rest_api.py); empty: none."""


def _s3_uri(refs: ClusterRefs, key: str) -> str:
    return f"s3://{refs.deploy_bucket}/{key}"


def _node_policies(refs: ClusterRefs) -> list[dict[str, str]]:
    """Every node's: the data prefix, Session Manager, and the limits on the CloudWatch agent's managed policy,
    which ParallelCluster attaches to every node role itself while Monitoring/Logs/CloudWatch is on."""
    policies = [{"Policy": refs.data_policy_arn}, {"Policy": f"arn:{refs.partition}:iam::aws:policy/{SSM_POLICY}"}]
    if refs.agent_limits_policy_arn:
        policies.append({"Policy": refs.agent_limits_policy_arn})
    return policies


def _node_iam(refs: ClusterRefs, *, monitored: bool = False) -> dict[str, Any]:
    """Read-only access to the deploy bucket, the data policy, Session Manager, and on compute nodes
    (`monitored`) the CloudWatch agent's metrics and logs."""
    policies = _node_policies(refs)
    if monitored:
        policies.append({"Policy": f"arn:{refs.partition}:iam::aws:policy/{CLOUDWATCH_AGENT_POLICY}"})
    return {"S3Access": [{"BucketName": refs.deploy_bucket, "EnableWriteAccess": False}],
            "AdditionalIamPolicies": policies}


def _bootstrap_action(refs: ClusterRefs, *extra_args: str) -> dict[str, Any]:
    """The bootstrap script: it installs the bundle the pointer names into BUNDLE_DIR."""
    return {"Script": _s3_uri(refs, BOOTSTRAP_SCRIPT_KEY),
            "Args": [_s3_uri(refs, BUNDLE_POINTER_KEY), BUNDLE_DIR, *extra_args]}


def _head_node(settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    cluster = settings.cluster
    return {
        "InstanceType": cluster.head_node_instance_type,
        "Networking": {"SubnetId": refs.subnet_id, "AdditionalSecurityGroups": [refs.security_group_id]},
        # No key pair: people connect through SSM Session Manager; SSH stays inside the VPC.
        "Ssh": {"AllowedIps": settings.network.vpc_cidr},
        "LocalStorage": {"RootVolume": _root_volume(settings)},
        "SharedStorageType": "Ebs",
        "Imds": {"Secured": True},
        # OnNodeConfigured never changes; OnNodeUpdated names the bundle id, so a new bundle is a
        # (supported) configuration change that makes the head node run it and switch /apps/scdino.
        "CustomActions": {"OnNodeConfigured": _bootstrap_action(refs),
                          "OnNodeUpdated": _bootstrap_action(refs, refs.bundle_id)},
        "Iam": _head_node_iam(refs),
    }


def _head_node_iam(refs: ClusterRefs) -> dict[str, Any]:
    """Every node's, and the REST API token's write policy: the head node runs slurmrestd."""
    iam = _node_iam(refs)
    if refs.rest_token_policy_arn:
        iam["AdditionalIamPolicies"] = [*iam["AdditionalIamPolicies"], {"Policy": refs.rest_token_policy_arn}]
    return iam


def _compute_resource(preset: GpuPreset, settings: Settings) -> dict[str, Any]:
    cluster = settings.cluster
    resource: dict[str, Any] = {
        "Name": preset.compute_resource_name,
        "InstanceType": preset.instance_type,
        "MinCount": cluster.min_nodes,
        "MaxCount": cluster.max_nodes,
    }
    if preset.efa:
        resource["Efa"] = {"Enabled": True}
    if cluster.capacity_reservation_id:
        resource["CapacityReservationTarget"] = {"CapacityReservationId": cluster.capacity_reservation_id}
    return resource


def _placement_group(preset: GpuPreset, settings: Settings) -> dict[str, Any]:
    """A cluster placement group for EFA presets, except where a reservation decides placement:
    a Capacity Block needs none, and an On-Demand reservation brings its own (if any)."""
    if not preset.placement_group:
        return {}
    return {"PlacementGroup": {"Enabled": not settings.cluster.capacity_reservation_id}}


def _root_volume(settings: Settings) -> dict[str, Any]:
    return {"Size": settings.cluster.root_volume_gib, "VolumeType": "gp3", "Encrypted": True}


def _slurm_queue(name: str, capacity_type: str, resource: dict[str, Any], local_storage: dict[str, Any],
                 refs: ClusterRefs, placement: dict[str, Any]) -> dict[str, Any]:
    """What every queue shares: subnet and groups, the bootstrap action, node IAM, the pipeline's AMI."""
    queue = {
        "Name": name,
        "CapacityType": capacity_type,
        "Networking": {"SubnetIds": [refs.subnet_id], "AdditionalSecurityGroups": [refs.security_group_id],
                       **placement},
        "ComputeResources": [resource],
        "ComputeSettings": {"LocalStorage": local_storage},
        "CustomActions": {"OnNodeConfigured": _bootstrap_action(refs)},
        "Iam": _node_iam(refs, monitored=True),
    }
    # The pipeline's AMI goes to the queues, not to Image/CustomAmi: a queue's AMI may change on
    # an existing cluster (QueueUpdateStrategy), the cluster-wide one never can.
    if refs.custom_ami:
        queue["Image"] = {"CustomAmi": refs.custom_ami}
    return queue


def _gpu_queue(preset: GpuPreset, settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    local_storage: dict[str, Any] = {"RootVolume": _root_volume(settings)}
    if preset.local_nvme:
        local_storage["EphemeralVolume"] = {"MountDir": SCRATCH_DIR}
    queue = _slurm_queue(preset.queue_name, settings.cluster.capacity_type, _compute_resource(preset, settings),
                         local_storage, refs, _placement_group(preset, settings))
    if settings.cluster.gpu_health_checks:
        queue["HealthChecks"] = {"Gpu": {"Enabled": True}}
    return queue


def _cpu_spot_queue(settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    """Spot CPU nodes for the steps that need no GPU; Slurm requeues a job whose node is reclaimed."""
    instance_type = settings.cluster.cpu_spot_instance_type
    resource = {"Name": compute_resource_name(instance_type), "InstanceType": instance_type, "MinCount": 0,
                "MaxCount": settings.cluster.cpu_spot_max_nodes}
    return _slurm_queue(CPU_SPOT_QUEUE, "SPOT", resource, {"RootVolume": _root_volume(settings)}, refs, {})


def _login_nodes(settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    """One pool of login nodes, installed like every other node."""
    cluster = settings.cluster
    return {"Pools": [{
        "Name": "login",
        "InstanceType": cluster.login_node_instance_type,
        "Count": cluster.login_nodes,
        "Networking": {"SubnetIds": [refs.subnet_id], "AdditionalSecurityGroups": [refs.security_group_id]},
        "CustomActions": {"OnNodeConfigured": _bootstrap_action(refs)},
        "Iam": {"AdditionalIamPolicies": [*_node_policies(refs), {"Policy": refs.deploy_read_policy_arn}]},
    }]}


def _shared_storage(settings: Settings, refs: ClusterRefs) -> list[dict[str, Any]]:
    return [
        {"Name": "fsx", "StorageType": "FsxLustre", "MountDir": FSX_MOUNT_DIR,
         "FsxLustreSettings": {"FileSystemId": refs.file_system_id}},
        {"Name": "apps", "StorageType": "Ebs", "MountDir": APPS_MOUNT_DIR,
         "EbsSettings": {"VolumeType": "gp3", "Size": settings.cluster.apps_volume_gib,
                         "Encrypted": True, "DeletionPolicy": "Delete"}},
    ]


def _monitoring(settings: Settings) -> dict[str, Any]:
    return {
        "DetailedMonitoring": True,
        "Logs": {"CloudWatch": {"Enabled": True, "RetentionInDays": settings.cluster.log_retention_days,
                                # Kept: a failed create must not delete the logs that say why.
                                "DeletionPolicy": "Retain"}},
        "Dashboards": {"CloudWatch": {"Enabled": True}},
        "Alarms": {"Enabled": True},
    }


def _slurm_settings(settings: Settings) -> dict[str, Any]:
    """Scale-down, queue updates, and the accounting database when one is configured. ParallelCluster
    itself grants the head node secretsmanager:GetSecretValue on the password secret."""
    slurm: dict[str, Any] = {"ScaledownIdletime": settings.cluster.scaledown_idle_minutes,
                             "QueueUpdateStrategy": "DRAIN"}
    accounting = settings.cluster.slurm_accounting
    if accounting.enabled:
        slurm["Database"] = {"Uri": accounting.uri, "UserName": accounting.user_name,
                             "PasswordSecretArn": accounting.password_secret_arn}
        if accounting.database_name:
            slurm["Database"]["DatabaseName"] = accounting.database_name
    return slurm


def build_cluster_config(settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    """The whole cluster configuration as ParallelCluster's YAML would hold it."""
    config = {
        "Region": settings.region,
        "Image": {"Os": settings.image.os},
        "Imds": {"ImdsSupport": "v2.0"},
        "HeadNode": _head_node(settings, refs),
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": _slurm_settings(settings),
            # The first queue is the cluster's default partition (ParallelCluster's rule): the first preset's,
            # as the nodes' site file says (presets.node_shape).
            "SlurmQueues": [_gpu_queue(PRESETS[name], settings, refs) for name in settings.cluster.presets]
            + ([_cpu_spot_queue(settings, refs)] if settings.cluster.cpu_spot_instance_type else []),
        },
        "SharedStorage": _shared_storage(settings, refs),
        "Monitoring": _monitoring(settings),
        "Tags": [{"Key": "project", "Value": settings.prefix}],
    }
    if settings.cluster.login_nodes:
        config["LoginNodes"] = _login_nodes(settings, refs)
    return config
