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

CLUSTER_STACKS: dict[str, tuple[type[ClusterStack] | type[PcsClusterStack], str]] = {
    "parallelcluster": (ClusterStack, "scDINO: AWS ParallelCluster Slurm cluster"),
    "pcs": (PcsClusterStack, "scDINO: AWS PCS Slurm cluster")}
"""Each back end's cluster stack and its description; both take the same settings and outputs."""


@dataclass(frozen=True)
class AppStacks:
    """The four stacks, for tests and for wiring."""

    network: NetworkStack
    storage: StorageStack
    image: ImageStack
    cluster: ClusterStack | PcsClusterStack


def build_app(app: cdk.App, settings: Settings) -> AppStacks:
    """Add the network, storage, image and cluster stacks to `app`, with cdk-nag checks.

    What a stack takes from another is that stack's typed `outputs` (NetworkOutputs, StorageOutputs), passed
    by name: the network's to every other stack, the storage's to the cluster."""
    env = cdk.Environment(account=settings.account or None, region=settings.region)
    prefix = settings.prefix
    names = settings.stack_names
    network = NetworkStack(app, names["network"], env=env, settings=settings.network,
                           description="scDINO: VPC, endpoints, flow logs, cluster and FSx security groups")
    storage = StorageStack(app, names["storage"], env=env, settings=settings.storage, network=network.outputs,
                           description="scDINO: data bucket and FSx for Lustre (retained on destroy)")
    image = ImageStack(app, names["image"], env=env, settings=settings.image, backend=settings.backend,
                       ami_parameter=settings.ami_parameter, build_tag=prefix, network=network.outputs,
                       description="scDINO: Packer GPU image pipeline (CodeBuild)"
                       + (", AWS PCS image" if settings.backend == "pcs" else ""))
    cluster_stack, description = CLUSTER_STACKS[settings.backend]
    cluster = cluster_stack(app, names["cluster"], env=env, description=description, settings=settings,
                            network=network.outputs, storage=storage.outputs)
    if settings.node_ami == "ssm":
        cluster.add_stack_dependency(image, "the cluster reads the AMI id the image stack's parameter holds")
    for stack in (network, storage, image, cluster):
        cdk.Tags.of(stack).add("project", prefix)
    enable_checks(app)
    return AppStacks(network, storage, image, cluster)
