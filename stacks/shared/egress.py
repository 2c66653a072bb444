"""Internet egress for the private subnet, owned by the cluster stack.

The NAT gateway is the one network part that costs money by the hour. Keeping it with the
cluster means `cdk destroy` of the cluster stops that bill, while the VPC (which must outlive the
cluster as long as the retained FSx file system has interfaces in it) costs nothing on its own.
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from constructs import Construct


class NatEgress(Construct):
    """NAT gateway in the public subnet and the private route table's default route through it."""

    def __init__(self, scope: Construct, construct_id: str, *, public_subnet_id: str,
                 private_route_table_id: str) -> None:
        super().__init__(scope, construct_id)
        address = ec2.CfnEIP(self, "Address", domain="vpc")
        gateway = ec2.CfnNatGateway(self, "Gateway", subnet_id=public_subnet_id,
                                    allocation_id=address.attr_allocation_id)
        self.route = ec2.CfnRoute(self, "DefaultRoute", route_table_id=private_route_table_id,
                                  destination_cidr_block="0.0.0.0/0", nat_gateway_id=gateway.attr_nat_gateway_id)
