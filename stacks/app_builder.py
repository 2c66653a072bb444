"""Compose the four stacks from `Settings` (kept apart from app.py so tests can build the same app)."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk

from stacks.cluster_stack import ClusterStack
from stacks.image_stack import ImageStack
from stacks.nag import enable_checks
from stacks.network_stack import NetworkStack
from stacks.settings import Settings
from stacks.storage_stack import StorageStack


@dataclass(frozen=True)
class AppStacks:
    """The four stacks, for tests and for wiring."""

    network: NetworkStack
    storage: StorageStack
    image: ImageStack
    cluster: ClusterStack


def build_app(app: cdk.App, settings: Settings) -> AppStacks:
    """Add the network, storage, image and cluster stacks to `app`, with cdk-nag checks."""
    env = cdk.Environment(account=settings.account or None, region=settings.region)
    prefix = settings.prefix
    network = NetworkStack(app, f"{prefix}-network", env=env, settings=settings.network,
                           description="scDINO: VPC, endpoints, flow logs, cluster and FSx security groups")
    storage = StorageStack(app, f"{prefix}-storage", env=env, settings=settings.storage, vpc=network.vpc,
                           subnet=network.private_subnet, fsx_security_group=network.fsx_security_group,
                           description="scDINO: data bucket and FSx for Lustre (retained on destroy)")
    image = ImageStack(app, f"{prefix}-image", env=env, settings=settings.image,
                       ami_parameter=settings.ami_parameter, build_tag=prefix,
                       build_subnet_id=network.public_subnet.subnet_id, vpc_id=network.vpc.vpc_id,
                       description="scDINO: Packer GPU image pipeline (CodeBuild)")
    cluster = ClusterStack(app, f"{prefix}-cluster", env=env, settings=settings,
                           subnet_id=network.private_subnet.subnet_id,
                           route_table_id=network.private_subnet.route_table.route_table_id,
                           public_subnet_id=network.public_subnet.subnet_id,
                           security_group_id=network.cluster_security_group.security_group_id,
                           file_system_id=storage.file_system.file_system_id,
                           data_policy_arn=storage.data_policy.managed_policy_arn,
                           description="scDINO: AWS ParallelCluster Slurm cluster")
    if settings.cluster.custom_ami == "ssm":
        cluster.add_stack_dependency(image, "the cluster reads the AMI id the image stack's parameter holds")
    for stack in (network, storage, image, cluster):
        cdk.Tags.of(stack).add("project", prefix)
    enable_checks(app)
    return AppStacks(network, storage, image, cluster)
