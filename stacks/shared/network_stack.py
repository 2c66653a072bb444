"""Network: one-AZ VPC, gateway endpoints, flow logs, and the cluster and FSx security groups."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.shared.common import logs_key, retention
from stacks.shared.nag import log_cdk_handler, skip_checkov_on_cdk_handler
from stacks.shared.settings import NetworkSettings

LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


@dataclass(frozen=True)
class NetworkOutputs:
    """What the other stacks take from the network stack (stacks/app_builder.py passes it to each)."""

    vpc: ec2.IVpc
    """The file system's VPC, the PCS nodes' egress group's, and the one Packer's temporary group must be in."""
    private_subnet: ec2.ISubnet
    """The nodes, the file system and PCS's controller; its route table gets the cluster stack's NAT route."""
    public_subnet: ec2.ISubnet
    """The cluster stack's NAT gateway and Packer's build instance."""
    cluster_security_group: ec2.ISecurityGroup
    """Every node's: all traffic within the group (EFA, Slurm), Lustre to the file system."""
    fsx_security_group: ec2.ISecurityGroup
    """The file system's: Lustre from the cluster group."""


class NetworkStack(cdk.Stack):
    """The VPC every other stack lives in; nothing stateful, and no instance billed by the hour."""

    def __init__(self, scope: Construct, construct_id: str, *, env: cdk.Environment, description: str,
                 settings: NetworkSettings) -> None:
        super().__init__(scope, construct_id, env=env, description=description)
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(settings.vpc_cidr),
            availability_zones=[settings.availability_zone],
            # No NAT here: the cluster stack adds it (stacks/shared/egress.py), so it lives only as long as
            # the cluster; until then the private subnet reaches AWS through the gateway endpoints.
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="Private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED,
                                        cidr_mask=20),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDb": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            },
        )
        # The feature flag restrictDefaultSecurityGroup adds CDK's handler that empties the default group.
        skip_checkov_on_cdk_handler(self, "Custom::VpcRestrictDefaultSGCustomResourceProvider",
                                    "CDK's handler that removes the default security group's rules")
        key = logs_key(self, "FlowLogKey", description="scDINO: VPC flow logs")
        flow_log_group = logs.LogGroup(
            self, "FlowLogGroup",
            retention=retention(settings.flow_log_retention_days),
            encryption_key=key,
            removal_policy=cdk.RemovalPolicy.DESTROY)
        log_cdk_handler(self, "Custom::VpcRestrictDefaultSGCustomResourceProvider",
                        retention_days=settings.flow_log_retention_days, key=key)
        self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group))
        self.private_subnet = self.vpc.isolated_subnets[0]
        self.public_subnet = self.vpc.public_subnets[0]
        self.cluster_security_group = self._cluster_security_group()
        self.fsx_security_group = self._fsx_security_group()
        self.outputs = NetworkOutputs(vpc=self.vpc, private_subnet=self.private_subnet, public_subnet=self.public_subnet,
                                      cluster_security_group=self.cluster_security_group,
                                      fsx_security_group=self.fsx_security_group)

    def _cluster_security_group(self) -> ec2.SecurityGroup:
        """Head and compute nodes: all traffic among themselves, as EFA requires (in and out).

        Outbound traffic to the internet is not restricted by this project: ParallelCluster gives
        every node its own security group as well, which allows all egress, so a narrower rule here
        would have no effect (only replacing ParallelCluster's groups through Networking/SecurityGroups would)."""
        group = ec2.SecurityGroup(self, "ClusterSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
                                  description="scDINO cluster nodes: all traffic within the group (EFA)")
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "All traffic from cluster nodes (EFA)")
        group.add_egress_rule(group, ec2.Port.all_traffic(), "All traffic to cluster nodes (EFA)")
        return group

    def _fsx_security_group(self) -> ec2.SecurityGroup:
        """FSx for Lustre: LNET ports from cluster nodes and between the file servers themselves
        (the LustreFileSystem construct adds the file servers' own 988-1023 ingress rule)."""
        group = ec2.SecurityGroup(self, "FsxSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
                                  description="FSx for Lustre: Lustre ports from the cluster")
        for port in LUSTRE_PORTS:
            group.add_ingress_rule(self.cluster_security_group, port, "Lustre from cluster nodes")
            group.add_egress_rule(group, port, "Lustre between file servers")
            group.add_egress_rule(self.cluster_security_group, port, "Lustre replies to cluster nodes")
            self.cluster_security_group.add_egress_rule(group, port, "Lustre to the file system")
        return group

