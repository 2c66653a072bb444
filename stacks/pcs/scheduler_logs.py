"""The PCS controller's own logs (slurmctld, and slurmdbd and slurmrestd where the release has them) delivered
to a CloudWatch Logs group of the cluster stack, with its retention and the stack's logs key.

PCS vends them as the log type PCS_SCHEDULER_LOGS of the cluster (AWS PCS User Guide, "Scheduler logs in AWS
PCS"): a delivery source names the cluster, a delivery destination the log group, a delivery joins the two.
Each cluster writes the streams AWSLogs/PCS/<cluster id>/<daemon>_<Slurm release>.log, so one log group keeps
the logs of every cluster a deploy replaced. Whoever deploys needs pcs:AllowVendedLogDeliveryForResource
(the CDK bootstrap's execution role has it).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.shared.common import retention

LOG_TYPE = "PCS_SCHEDULER_LOGS"
STREAM_PREFIX = "AWSLogs/PCS/"
"""Streams are AWSLogs/PCS/<cluster id>/<daemon>_<Slurm release>.log, e.g. .../slurmctld_25.11.log."""


def log_group_name(cluster_name: str) -> str:
    """The log group: under /aws/vendedlogs/, where AWS puts the logs its services deliver, one per deployment."""
    return f"/aws/vendedlogs/pcs/{cluster_name}/scheduler"


class SchedulerLogs(Construct):
    """The log group, the permission for CloudWatch Logs' delivery service to write into it, and the delivery
    from the cluster.

    The source is named after the PCS cluster (`source_name`), the destination after the deployment: when a
    deploy replaces the cluster (another size), the source and the delivery are replaced with it, under new
    names, while the destination and the log group stay."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_arn: str, source_name: str,
                 cluster_name: str, log_retention_days: int, logs_key: kms.IKey) -> None:
        super().__init__(scope, construct_id)
        self.group_name = log_group_name(cluster_name)
        self.log_group = logs.LogGroup(self, "Group", log_group_name=self.group_name,
                                       retention=retention(log_retention_days), encryption_key=logs_key,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        policy = self._delivery_policy()
        destination = logs.CfnDeliveryDestination(
            self, "Destination", name=f"{cluster_name}-scheduler-logs", delivery_destination_type="CWL",
            destination_resource_arn=self.log_group.log_group_arn)
        destination.node.add_dependency(policy)
        self.source = logs.CfnDeliverySource(self, "Source", name=f"{source_name}-scheduler-logs",
                                             resource_arn=cluster_arn, log_type=LOG_TYPE)
        self.delivery = logs.CfnDelivery(self, "Delivery", delivery_source_name=self.source.ref,
                                         delivery_destination_arn=destination.attr_arn)

    def _delivery_policy(self) -> logs.ResourcePolicy:
        """What CloudWatch Logs would otherwise add to the group by itself when the delivery is created ("Logs sent
        to CloudWatch Logs", vended logs V2): its delivery service may create streams and put events in this
        group only, on behalf of this account's deliveries. Here the stack owns it and deletes it with itself."""
        stack = cdk.Stack.of(self)
        streams = stack.format_arn(service="logs", resource="log-group",
                                   resource_name=f"{self.group_name}:log-stream:*",
                                   arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
        policy = logs.ResourcePolicy(self, "DeliveryPolicy")
        policy.document.add_statements(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("delivery.logs.amazonaws.com")],
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[streams],
            conditions={"StringEquals": {"aws:SourceAccount": stack.account},
                        "ArnLike": {"aws:SourceArn": stack.format_arn(service="logs", resource="*")}}))
        return policy
