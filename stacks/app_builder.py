"""Compose the four stacks from `Settings` (kept apart from app.py so tests can build the same app).

The network, storage and image stacks are the same for both back ends; the cluster stack is
ParallelCluster's custom resource (backend=parallelcluster) or an AWS PCS cluster (backend=pcs)."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk

from stacks.parallelcluster.stack import ClusterStack
from stacks.pcs.stack import PcsClusterStack
from stacks.shared.image_stack import ImageStack
from stacks.shared.nag import enable_checks
from stacks.shared.network_stack import NetworkStack
from stacks.shared.settings import Settings
from stacks.shared.storage_stack import StorageStack


@dataclass(frozen=True)
class AppStacks:
    """The four stacks, for tests and for wiring."""

    network: NetworkStack
    storage: StorageStack
    image: ImageStack
    cluster: ClusterStack | PcsClusterStack


def build_app(app: cdk.App, settings: Settings) -> AppStacks:
    """Add the network, storage, image and cluster stacks to `app`, with cdk-nag checks."""
    env = cdk.Environment(account=settings.account or None, region=settings.region)
    prefix = settings.prefix
    names = settings.stack_names
    network = NetworkStack(app, names["network"], env=env, settings=settings.network,
                           description="scDINO: VPC, endpoints, flow logs, cluster and FSx security groups")
    storage = StorageStack(app, names["storage"], env=env, settings=settings.storage, vpc=network.vpc,
                           subnet=network.private_subnet, fsx_security_group=network.fsx_security_group,
                           description="scDINO: data bucket and FSx for Lustre (retained on destroy)")
    image = ImageStack(app, names["image"], env=env, settings=settings.image, backend=settings.backend,
                       ami_parameter=settings.ami_parameter, build_tag=prefix,
                       build_subnet_id=network.public_subnet.subnet_id, vpc_id=network.vpc.vpc_id,
                       description="scDINO: Packer GPU image pipeline (CodeBuild)"
                       + (", AWS PCS image" if settings.backend == "pcs" else ""))
    cluster = _cluster_stack(app, settings, env, network, storage)
    if settings.node_ami == "ssm":
        cluster.add_stack_dependency(image, "the cluster reads the AMI id the image stack's parameter holds")
    for stack in (network, storage, image, cluster):
        cdk.Tags.of(stack).add("project", prefix)
    enable_checks(app)
    return AppStacks(network, storage, image, cluster)


def _cluster_stack(app: cdk.App, settings: Settings, env: cdk.Environment, network: NetworkStack,
                   storage: StorageStack) -> ClusterStack | PcsClusterStack:
    """The back end's cluster stack, wired to the same network and storage."""
    shared = {"env": env, "settings": settings, "subnet_id": network.private_subnet.subnet_id,
              "route_table_id": network.private_subnet.route_table.route_table_id,
              "public_subnet_id": network.public_subnet.subnet_id,
              "security_group_id": network.cluster_security_group.security_group_id,
              "access_logs_bucket_name": storage.access_logs_bucket.bucket_name}
    name = settings.stack_names["cluster"]
    if settings.backend == "pcs":
        return PcsClusterStack(app, name, vpc=network.vpc, file_system_dns_name=storage.file_system.dns_name,
                               file_system_mount_name=storage.file_system.mount_name, data_policy=storage.data_policy,
                               description="scDINO: AWS PCS Slurm cluster", **shared)
    return ClusterStack(app, name, file_system_id=storage.file_system.file_system_id,
                        data_policy_arn=storage.data_policy.managed_policy_arn,
                        description="scDINO: AWS ParallelCluster Slurm cluster", **shared)
