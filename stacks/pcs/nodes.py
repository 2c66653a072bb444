"""What a PCS node is launched with: its instance profile (as PCS requires it) and its launch template."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.pcs.config import NodeGroupSpec
from stacks.shared.constants import NODE_GROUP_TAG, SSM_POLICY
from stacks.shared.monitoring import Monitoring
from stacks.shared.nag import acknowledge

PCS_ROLE_PATH = "/aws-pcs/"
"""PCS passes only roles whose name starts with AWSPCS or whose path is /aws-pcs/; the path lets
CloudFormation name the role (unique per stack and region)."""
ROOT_DEVICES = {"alinux2023": "/dev/xvda", "ubuntu2204": "/dev/sda1"}
"""Root device of AWS's Deep Learning Base AMIs, which the PCS image starts from (its size is set here)."""


class PcsNodeProfile(Construct):
    """The role and instance profile of one kind of PCS node: register with this cluster only, read the
    deploy bucket and the data prefix (writes reach the bucket through /fsx: storage_stack._data_policy),
    Session Manager, and on GPU nodes put the CloudWatch agent's GPU metrics and log lines (`monitoring`)
    into this cluster's namespace and log group, the only ones it may write (no AWS managed agent policy)."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_arn: str,
                 policies: list[iam.IManagedPolicy], monitoring: Monitoring | None) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self, "Role", path=PCS_ROLE_PATH, assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="scDINO PCS nodes: register with the cluster, read the bundle and the data prefix",
            managed_policies=[*policies, iam.ManagedPolicy.from_aws_managed_policy_name(SSM_POLICY)])
        # AWSPCSComputeNodePolicy grants this on every cluster of the account; here, on this one only.
        self.role.add_to_policy(iam.PolicyStatement(actions=["pcs:RegisterComputeNodeGroupInstance"],
                                                    resources=[cluster_arn]))
        if monitoring is not None:
            self._allow_agent(monitoring)
        self.profile = iam.InstanceProfile(self, "Profile", role=self.role, path=PCS_ROLE_PATH)
        acknowledge(self, f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{SSM_POLICY}]",
                    "Session Manager is how people reach the nodes (no SSH key, no inbound port); AWS's managed "
                    "policy is the documented minimum for the SSM agent and changes with it.")

    def _allow_agent(self, monitoring: Monitoring) -> None:
        """The CloudWatch agent of a GPU node: metrics into the cluster's GPU namespace, lines into its log group."""
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": monitoring.names.gpu_namespace}}))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[monitoring.log_group.log_group_arn]))
        acknowledge(self, "IAM5[Resource::*]",
                    "cloudwatch:PutMetricData takes no resource ARN; the condition confines it to this cluster's GPU "
                    "metrics namespace.")


def _network(spec: NodeGroupSpec, subnet_id: str, security_group_ids: list[str]) -> dict:
    """EFA presets: one EFA interface per network card (the first on device 0), as ParallelCluster
    configures them; others: the security groups alone."""
    if not spec.efa_interfaces:
        return {"security_group_ids": security_group_ids}
    interfaces = [ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
        device_index=0 if card == 0 else 1, network_card_index=card, interface_type="efa",
        subnet_id=subnet_id, groups=security_group_ids, delete_on_termination=True)
        for card in range(spec.efa_interfaces)]
    return {"network_interfaces": interfaces}


def _capacity(spec: NodeGroupSpec, placement_group: str | None) -> dict:
    """A reservation (On-Demand or Capacity Block) decides placement; else the preset's placement group.
    A Capacity Block's template carries what PCS's guide asks of it: the market type capacity-block, the
    reservation, and the block's instance type (PCS otherwise takes the type from the node group alone)."""
    options: dict = {}
    if spec.capacity_reservation_id:
        options["capacity_reservation_specification"] = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
            capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                capacity_reservation_id=spec.capacity_reservation_id))
    if spec.capacity_block:
        options["instance_market_options"] = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
            market_type="capacity-block")
        options["instance_type"] = spec.instance_type
    if placement_group:
        options["placement"] = ec2.CfnLaunchTemplate.PlacementProperty(group_name=placement_group)
    return options


class NodeLaunchTemplate(Construct):
    """The launch template of one node group: IMDSv2 only, an encrypted root volume, the node script as
    MIME user data, EFA interfaces, placement or reservation, and the node-group tag."""

    def __init__(self, scope: Construct, construct_id: str, *, spec: NodeGroupSpec, subnet_id: str,
                 security_group_ids: list[str], user_data: str, root_device: str, root_gib: int,
                 group_tag: str) -> None:
        super().__init__(scope, construct_id)
        placement = None
        if spec.placement_group:
            placement = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster").ref
        tags = [cdk.CfnTag(key=NODE_GROUP_TAG, value=group_tag), cdk.CfnTag(key="Name", value=group_tag)]
        data = ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
            metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(http_endpoint="enabled",
                                                                          http_tokens="required"),
            block_device_mappings=[ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                device_name=root_device, ebs=ec2.CfnLaunchTemplate.EbsProperty(
                    volume_size=root_gib, volume_type="gp3", encrypted=True, delete_on_termination=True))],
            user_data=cdk.Fn.base64(user_data),
            tag_specifications=[ec2.CfnLaunchTemplate.TagSpecificationProperty(resource_type=kind, tags=tags)
                                for kind in ("instance", "volume")],
            **_network(spec, subnet_id, security_group_ids), **_capacity(spec, placement))
        self.template = ec2.CfnLaunchTemplate(self, "Template", launch_template_data=data)
