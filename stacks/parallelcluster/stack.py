"""Cluster: the deploy bucket the nodes install from and ParallelCluster's CloudFormation custom resource."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.parallelcluster.config import ClusterRefs, build_cluster_config
from stacks.shared.common import logs_key
from stacks.shared.egress import NatEgress
from stacks.shared.monitoring import Monitoring
from stacks.shared.nag import acknowledge
from stacks.shared.network_stack import NetworkOutputs
from stacks.shared.node_bundle import NodeBundle
from stacks.shared.presets import node_shape
from stacks.shared.rest_api import HeadNodeRestToken, head_node_pointer
from stacks.shared.settings import PCLUSTER_VERSION, Settings
from stacks.shared.storage_stack import StorageOutputs

PROVIDER_TEMPLATE_URL = ("https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
                         "/parallelcluster/${Version}/templates/custom_resource/cluster.yaml")
AGENT_NAMESPACE = "CWAgent"
"""Where ParallelCluster's own agent configuration puts its metrics (it names no namespace: the agent's default);
its dashboard and head-node alarms read the head node's memory and disk there."""
AGENT_WRITES = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:PutRetentionPolicy"]
TRACE_WRITES = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]


class ClusterStack(cdk.Stack):
    """The ParallelCluster cluster; deleting this stack deletes the cluster (not the data)."""

    def __init__(self, scope: Construct, construct_id: str, *, env: cdk.Environment, description: str,
                 settings: Settings, network: NetworkOutputs, storage: StorageOutputs) -> None:
        super().__init__(scope, construct_id, env=env, description=description)
        egress = NatEgress(self, "Egress", public_subnet_id=network.public_subnet.subnet_id,
                           private_route_table_id=network.private_subnet.route_table.route_table_id)
        key = logs_key(self, "LogsKey", description="scDINO: the cluster stack's CloudWatch log groups")
        self.monitoring = Monitoring(self, "Monitoring", cluster_name=settings.cluster_name,
                                     log_retention_days=settings.cluster.log_retention_days,
                                     alarm_email=settings.cluster.alarm_email, logs_key=key)
        self.rest = HeadNodeRestToken(self, "RestApi")
        node_bundle = NodeBundle(self, "NodeBundle", log_retention_days=settings.cluster.log_retention_days,
                                 logs_key=key, access_logs_bucket_name=storage.access_logs_bucket.bucket_name,
                                 monitoring=self.monitoring.names.pointer(),
                                 cluster=node_shape(settings.cluster.presets),
                                 rest=head_node_pointer(settings, self.rest.secret.secret_arn))
        refs = ClusterRefs(
            subnet_id=network.private_subnet.subnet_id,
            security_group_id=network.cluster_security_group.security_group_id,
            file_system_id=storage.file_system.file_system_id,
            data_policy_arn=storage.data_policy.managed_policy_arn, deploy_bucket=node_bundle.bucket.bucket_name,
            bundle_id=node_bundle.bundle_id,
            deploy_read_policy_arn=node_bundle.read_policy.managed_policy_arn, partition=self.partition,
            custom_ami=self._ami(settings),
            agent_limits_policy_arn=self._agent_limits(settings.cluster_name).managed_policy_arn,
            rest_token_policy_arn=self.rest.write_policy.managed_policy_arn)
        self.provider = cdk.CfnStack(
            self, "PclusterProvider",
            template_url=cdk.Fn.sub(PROVIDER_TEMPLATE_URL, {"Version": PCLUSTER_VERSION}))
        self.cluster = cdk.CustomResource(
            self, "Cluster",
            resource_type="Custom::PclusterCluster",
            service_token=self.provider.get_att("Outputs.ServiceToken").to_string(),
            properties={
                "ClusterName": settings.cluster_name,
                "ClusterConfiguration": build_cluster_config(settings, refs),
                "DeletionPolicy": "Delete",
            })
        # Nodes download packages while bootstrapping: the route must exist first (and go last).
        self.cluster.node.add_dependency(egress)
        # The script and the pointer the configuration names must be in place before any node boots.
        self.cluster.node.add_dependency(node_bundle.bootstrap)
        self.rest.allow_port_forward(self.cluster.get_att_string("headNode.instanceId"))
        self._outputs(settings)

    def _agent_limits(self, cluster_name: str) -> iam.ManagedPolicy:
        """What the AWS managed CloudWatchAgentServerPolicy lets a node do, cut down to this cluster's own.

        ParallelCluster attaches that policy to every node role while its CloudWatch logs are on
        (aws-parallelcluster 3.16, templates/cdk_builder_utils.py, _add_node_role), and its provider attaches
        no policy of ours but those under policy/parallelcluster*: so the managed one stays, and these explicit
        denials, which win over any allow, leave it metrics in the GPU namespace and ParallelCluster's, lines
        into this cluster's log groups only (ParallelCluster's /aws/parallelcluster/<cluster>-<timestamp> and
        the monitoring group), and no traces. Everything else it allows is read-only (describe calls, the
        agent's own AmazonCloudWatch-* parameters). PCS nodes get the same allowances granted directly
        (stacks/pcs/nodes.py)."""
        names = self.monitoring.names
        own_groups = [self.monitoring.log_group.log_group_arn,
                      f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:/aws/parallelcluster/"
                      f"{cluster_name}-*"]
        policy = iam.ManagedPolicy(self, "AgentLimitsPolicy", path="/parallelcluster/", statements=[
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=["cloudwatch:PutMetricData"], resources=["*"],
                                conditions={"StringNotEquals": {"cloudwatch:namespace": [names.gpu_namespace,
                                                                                        AGENT_NAMESPACE]}}),
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=AGENT_WRITES, not_resources=own_groups),
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=TRACE_WRITES, resources=["*"]),
        ])
        acknowledge(policy, "IAM5[Resource::*]", "Denials only: every metric namespace but this cluster's two, "
                    "and every trace; they narrow what the AWS managed CloudWatch agent policy allows.")
        return policy

    def _ami(self, settings: Settings) -> str:
        """The AMI the nodes boot: empty means ParallelCluster's official one for `image.os`."""
        if settings.node_ami == "ssm":
            return ssm.StringParameter.value_for_string_parameter(self, settings.ami_parameter)
        return settings.node_ami

    def _outputs(self, settings: Settings) -> None:
        head_node_id = self.cluster.get_att_string("headNode.instanceId")
        cdk.CfnOutput(self, "ClusterName", value=settings.cluster_name)
        cdk.CfnOutput(self, "HeadNodeInstanceId", value=head_node_id)
        cdk.CfnOutput(self, "ConnectCommand", description="Open a shell on the head node (SSM Session Manager)",
                      value=cdk.Fn.join("", ["aws ssm start-session --region ", self.region,
                                             " --target ", head_node_id]))
        cdk.CfnOutput(self, "ValidationMessages", value=self.cluster.get_att_string("validationMessages"))
        cdk.CfnOutput(self, "DashboardName", description="GPUs and training (CloudWatch dashboard)",
                      value=self.monitoring.dashboard.dashboard_name)
        cdk.CfnOutput(self, "AlarmTopicArn", description="Alarms go to this SNS topic",
                      value=self.monitoring.topic.topic_arn)
        cdk.CfnOutput(self, "RestTokenSecretArn", value=self.rest.secret.secret_arn,
                      description="The Slurm REST API token the head node renews (python -m training remote)")
        cdk.CfnOutput(self, "RestClientPolicyArn", value=self.rest.client_policy.managed_policy_arn,
                      description="Attach to the role you use from the laptop: python -m training remote")
