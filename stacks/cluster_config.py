"""The ParallelCluster 3 cluster configuration, built by a pure function.

`build_cluster_config(settings, refs)` takes resource references as plain strings: CDK tokens
when the cluster stack builds it, placeholder ids when tests validate it against
ParallelCluster's own schema. Nothing here touches CDK or AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stacks.presets import APPS_MOUNT_DIR, BUNDLE_DIR, FSX_MOUNT_DIR, PRESETS, SCRATCH_DIR, GpuPreset
from stacks.settings import Settings


@dataclass(frozen=True)
class ClusterRefs:
    """Ids and ARNs of resources made by the other stacks (tokens or literal strings)."""

    subnet_id: str
    security_group_id: str
    file_system_id: str
    data_policy_arn: str
    """Managed policy giving nodes read/write on the data prefix of the bucket."""
    assets_bucket: str
    script_key: str
    bundle_key: str
    vpc_cidr: str
    custom_ami: str = ""
    """An AMI id, or empty for the official ParallelCluster AMI."""


def _s3_uri(refs: ClusterRefs, key: str) -> str:
    return f"s3://{refs.assets_bucket}/{key}"


def _node_iam(refs: ClusterRefs) -> dict[str, Any]:
    """Read-only access to exactly the two asset objects, plus the data policy."""
    return {
        "S3Access": [{"BucketName": refs.assets_bucket, "KeyName": key, "EnableWriteAccess": False}
                     for key in (refs.script_key, refs.bundle_key)],
        "AdditionalIamPolicies": [{"Policy": refs.data_policy_arn}],
    }


def _custom_actions(refs: ClusterRefs, *, events: tuple[str, ...] = ("OnNodeConfigured",)) -> dict[str, Any]:
    """The bootstrap script with its arguments: the bundle's S3 URI and where to install it."""
    action = {"Script": _s3_uri(refs, refs.script_key), "Args": [_s3_uri(refs, refs.bundle_key), BUNDLE_DIR]}
    return {event: dict(action) for event in events}


def _head_node(settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    cluster = settings.cluster
    return {
        "InstanceType": cluster.head_node_instance_type,
        "Networking": {"SubnetId": refs.subnet_id, "AdditionalSecurityGroups": [refs.security_group_id]},
        # No key pair: people connect through SSM Session Manager; SSH stays inside the VPC.
        "Ssh": {"AllowedIps": refs.vpc_cidr},
        "LocalStorage": {"RootVolume": {"Size": cluster.root_volume_gib, "VolumeType": "gp3", "Encrypted": True}},
        "SharedStorageType": "Ebs",
        "Imds": {"Secured": True},
        # OnNodeUpdated too: a `cdk deploy` with a new bundle reinstalls it on the head node.
        "CustomActions": _custom_actions(refs, events=("OnNodeConfigured", "OnNodeUpdated")),
        "Iam": _node_iam(refs),
    }


def _compute_resource(preset: GpuPreset, settings: Settings) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "Name": preset.compute_resource_name,
        "InstanceType": preset.instance_type,
        "MinCount": settings.cluster.min_nodes,
        "MaxCount": settings.cluster.max_nodes,
    }
    if preset.efa:
        resource["Efa"] = {"Enabled": True}
    return resource


def _queue(preset: GpuPreset, settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    local_storage: dict[str, Any] = {
        "RootVolume": {"Size": settings.cluster.root_volume_gib, "VolumeType": "gp3", "Encrypted": True}}
    if preset.local_nvme:
        local_storage["EphemeralVolume"] = {"MountDir": SCRATCH_DIR}
    networking: dict[str, Any] = {"SubnetIds": [refs.subnet_id], "AdditionalSecurityGroups": [refs.security_group_id]}
    if preset.placement_group:
        networking["PlacementGroup"] = {"Enabled": True}
    return {
        "Name": preset.queue_name,
        "CapacityType": "ONDEMAND",
        "Networking": networking,
        "ComputeResources": [_compute_resource(preset, settings)],
        "ComputeSettings": {"LocalStorage": local_storage},
        "CustomActions": _custom_actions(refs),
        "Iam": _node_iam(refs),
    }


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
                                "DeletionPolicy": "Delete"}},
        "Dashboards": {"CloudWatch": {"Enabled": True}},
        "Alarms": {"Enabled": True},
    }


def build_cluster_config(settings: Settings, refs: ClusterRefs) -> dict[str, Any]:
    """The whole cluster configuration as ParallelCluster's YAML would hold it."""
    image: dict[str, Any] = {"Os": settings.image.os}
    if refs.custom_ami:
        image["CustomAmi"] = refs.custom_ami
    return {
        "Region": settings.region,
        "Image": image,
        "Imds": {"ImdsSupport": "v2.0"},
        "HeadNode": _head_node(settings, refs),
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": {"ScaledownIdletime": settings.cluster.scaledown_idle_minutes,
                              "QueueUpdateStrategy": "DRAIN"},
            "SlurmQueues": [_queue(PRESETS[name], settings, refs) for name in settings.cluster.presets],
        },
        "SharedStorage": _shared_storage(settings, refs),
        "Monitoring": _monitoring(settings),
        "Tags": [{"Key": "project", "Value": settings.prefix}],
    }
