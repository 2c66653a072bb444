"""Cluster on AWS PCS (backend=pcs): the managed Slurm controller and its logs, one node group and queue per
preset, the login node group, and the same deploy bucket, node bootstrap and monitoring as the ParallelCluster
cluster stack.

What a deploy does to a running cluster: a newer Slurm release (image.pcs_slurm_version) and the idle times
are updates in place; another size replaces the cluster, under a name that carries the size, and with it
its node groups and queues and the delivery of its logs (docs/deploy.md, "Slurm version and size of a PCS
cluster"; tests/infra/pcs/test_pcs_updates.py)."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_pcs as pcs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.pcs.config import (
    LOGIN_GROUP,
    NodeGroupSpec,
    group_id,
    mime_user_data,
    node_group_tag,
    node_script,
    pcs_node_groups,
)
from stacks.pcs.nodes import ROOT_DEVICES, NodeLaunchTemplate, PcsNodeProfile
from stacks.pcs.scheduler_logs import SchedulerLogs
from stacks.shared.common import logs_key
from stacks.shared.constants import BOOTSTRAP_SCRIPT_KEY, BUNDLE_POINTER_KEY, NODE_GROUP_TAG
from stacks.shared.egress import NatEgress
from stacks.shared.monitoring import Monitoring
from stacks.shared.network_stack import NetworkOutputs
from stacks.shared.node_bundle import BOOTSTRAP_DIR, NodeBundle
from stacks.shared.presets import node_shape
from stacks.shared.rest_api import PcsRestClientPolicy, pcs_rest_api
from stacks.shared.settings import Settings
from stacks.shared.storage_stack import StorageOutputs

NODE_SCRIPT = BOOTSTRAP_DIR / "pcs-node.sh"
"""The node preparation the user data runs (it ends with the same bootstrap as ParallelCluster's nodes)."""


def read_node_script(path: Path = NODE_SCRIPT) -> str:
    return path.read_text(encoding="utf-8")


class PcsClusterStack(cdk.Stack):
    """The PCS cluster; deleting this stack deletes the cluster and its nodes (not the data)."""

    def __init__(self, scope: Construct, construct_id: str, *, env: cdk.Environment, description: str,
                 settings: Settings, network: NetworkOutputs, storage: StorageOutputs) -> None:
        super().__init__(scope, construct_id, env=env, description=description)
        self._settings = settings
        self._subnet_id = network.private_subnet.subnet_id
        egress = NatEgress(self, "Egress", public_subnet_id=network.public_subnet.subnet_id,
                           private_route_table_id=network.private_subnet.route_table.route_table_id)
        key = logs_key(self, "LogsKey", description="scDINO: the cluster stack's CloudWatch log groups")
        self.monitoring = Monitoring(self, "Monitoring", cluster_name=settings.cluster_name,
                                     log_retention_days=settings.cluster.log_retention_days,
                                     alarm_email=settings.cluster.alarm_email, logs_key=key,
                                     parallelcluster_dashboard=False)
        self.node_bundle = NodeBundle(self, "NodeBundle", log_retention_days=settings.cluster.log_retention_days,
                                      logs_key=key, access_logs_bucket_name=storage.access_logs_bucket.bucket_name,
                                      monitoring=self.monitoring.names.pointer(),
                                      cluster=node_shape(settings.cluster.presets))
        security_group_id = network.cluster_security_group.security_group_id
        node_groups = [security_group_id, self._node_egress(network.vpc).security_group_id]
        self.cluster = self._cluster(security_group_id)
        self.scheduler_logs = SchedulerLogs(
            self, "SchedulerLogs", cluster_arn=self.cluster.attr_arn, source_name=settings.pcs_cluster_name,
            cluster_name=settings.cluster_name, log_retention_days=settings.cluster.log_retention_days, logs_key=key)
        self.rest_client = (PcsRestClientPolicy(
            self, "RestClient", cluster_arn=self.cluster.attr_arn, cluster_id=self.cluster.attr_id,
            login_tag=node_group_tag(settings, LOGIN_GROUP)) if pcs_rest_api(settings) else None)
        policies = [storage.data_policy, self.node_bundle.read_policy]
        self.profiles = {
            "compute": PcsNodeProfile(self, "ComputeNodes", cluster_arn=self.cluster.attr_arn, policies=policies,
                                      monitoring=self.monitoring),
            "login": PcsNodeProfile(self, "LoginNodes", cluster_arn=self.cluster.attr_arn, policies=policies,
                                    monitoring=None)}
        ami = self._ami()
        self.groups: dict[str, pcs.CfnComputeNodeGroup] = {}
        self.queues: dict[str, pcs.CfnQueue] = {}
        for spec in pcs_node_groups(settings):
            group = self._node_group(spec, ami, node_groups, storage.file_system)
            # Nodes download packages and the bundle while booting: the route and the pointer come first. They
            # register with the cluster as they boot: their role's grant on it (a new cluster's, after a
            # replacement) comes first too.
            group.node.add_dependency(egress, self.node_bundle.bootstrap, self._profile(spec))
            self.groups[spec.name] = group
            if spec.queue:
                self.queues[spec.queue] = pcs.CfnQueue(
                    self, f"{group_id(spec)}Queue", cluster_id=self.cluster.attr_id, name=spec.queue,
                    compute_node_group_configurations=[pcs.CfnQueue.ComputeNodeGroupConfigurationProperty(
                        compute_node_group_id=group.attr_id)],
                    slurm_configuration=self._default_partition() if spec.default_queue else None)
        self._outputs()

    @staticmethod
    def _default_partition() -> pcs.CfnQueue.SlurmConfigurationProperty:
        """Default=YES (a queue-level setting PCS takes): `sbatch` without --partition lands here, in the first
        preset's queue, as on ParallelCluster, whose first queue is the default."""
        return pcs.CfnQueue.SlurmConfigurationProperty(slurm_custom_settings=[
            pcs.CfnQueue.SlurmCustomSettingProperty(parameter_name="Default", parameter_value="YES")])

    def _node_egress(self, vpc: ec2.IVpc) -> ec2.SecurityGroup:
        """What ParallelCluster's own node security group allows and the cluster group does not: the nodes'
        calls to AWS (PCS registration, S3, CloudWatch, SSM) and package mirrors, through the NAT gateway."""
        group = ec2.SecurityGroup(self, "NodeEgress", vpc=vpc, allow_all_outbound=False,
                                  description="scDINO PCS nodes: HTTPS and HTTP out (AWS APIs, package mirrors)")
        group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs and package mirrors (HTTPS)")
        group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(80), "Package mirrors that serve HTTP (apt)")
        return group

    def _cluster(self, security_group_id: str) -> pcs.CfnCluster:
        """The managed controller in the private subnet, in the cluster security group (all traffic within
        it: slurmctld, slurmd, the nodes, and slurmrestd's port 6820 for the login nodes' port forwards), with
        Slurm accounting on and, from Slurm 25.05, the Slurm REST API (stacks/shared/rest_api.py)."""
        settings = self._settings
        return pcs.CfnCluster(
            self, "Cluster", name=settings.pcs_cluster_name, size=settings.cluster.pcs_size,
            scheduler=pcs.CfnCluster.SchedulerProperty(type="SLURM", version=settings.image.pcs_slurm_version),
            networking=pcs.CfnCluster.NetworkingProperty(subnet_ids=[self._subnet_id],
                                                         security_group_ids=[security_group_id]),
            slurm_configuration=pcs.CfnCluster.SlurmConfigurationProperty(
                scale_down_idle_time_in_seconds=settings.cluster.scaledown_idle_minutes * 60,
                accounting=pcs.CfnCluster.AccountingProperty(mode="STANDARD"),
                slurm_rest=pcs.CfnCluster.SlurmRestProperty(mode="STANDARD") if pcs_rest_api(settings) else None))

    def _ami(self) -> str:
        """The pipeline's PCS image (from its SSM parameter), or the ami- id the settings name."""
        if self._settings.node_ami == "ssm":
            return ssm.StringParameter.value_for_string_parameter(self, self._settings.ami_parameter)
        return self._settings.node_ami

    def _user_data(self, spec: NodeGroupSpec, file_system: fsx.LustreFileSystem) -> str:
        bucket = self.node_bundle.bucket.bucket_name
        values = {"SCDINO_FSX_DNS": file_system.dns_name, "SCDINO_FSX_MOUNT_NAME": file_system.mount_name,
                  "SCDINO_REGION": self.region,
                  "SCDINO_BOOTSTRAP_URI": f"s3://{bucket}/{BOOTSTRAP_SCRIPT_KEY}",
                  "SCDINO_POINTER_URI": f"s3://{bucket}/{BUNDLE_POINTER_KEY}", "SCDINO_NODE_TYPE": spec.node_type}
        return mime_user_data(node_script(read_node_script(), values))

    def _node_group(self, spec: NodeGroupSpec, ami: str, security_group_ids: list[str],
                    file_system: fsx.LustreFileSystem) -> pcs.CfnComputeNodeGroup:
        settings = self._settings
        construct_id = group_id(spec)
        template = NodeLaunchTemplate(
            self, f"{construct_id}Launch", spec=spec, subnet_id=self._subnet_id, security_group_ids=security_group_ids,
            user_data=self._user_data(spec, file_system), root_device=ROOT_DEVICES[settings.image.os],
            root_gib=settings.cluster.root_volume_gib, group_tag=node_group_tag(settings, spec.key)).template
        return pcs.CfnComputeNodeGroup(
            self, f"{construct_id}Group", cluster_id=self.cluster.attr_id, name=spec.name,
            iam_instance_profile_arn=self._profile(spec).profile.instance_profile_arn,
            instance_configs=[pcs.CfnComputeNodeGroup.InstanceConfigProperty(instance_type=spec.instance_type)],
            scaling_configuration=pcs.CfnComputeNodeGroup.ScalingConfigurationProperty(
                min_instance_count=spec.min_count, max_instance_count=spec.max_count),
            subnet_ids=[self._subnet_id], ami_id=ami, purchase_option=spec.purchase_option,
            spot_options=(pcs.CfnComputeNodeGroup.SpotOptionsProperty(allocation_strategy="price-capacity-optimized")
                          if spec.purchase_option == "SPOT" else None),
            custom_launch_template=pcs.CfnComputeNodeGroup.CustomLaunchTemplateProperty(
                template_id=template.ref, version=template.attr_latest_version_number),
            slurm_configuration=(pcs.CfnComputeNodeGroup.SlurmConfigurationProperty(
                scale_down_idle_time_in_seconds=spec.scaledown_idle_seconds) if spec.scaledown_idle_seconds else None))

    def _profile(self, spec: NodeGroupSpec) -> PcsNodeProfile:
        return self.profiles["compute" if spec.node_type == "ComputeFleet" else "login"]

    def _outputs(self) -> None:
        settings = self._settings
        login_tag = node_group_tag(settings, LOGIN_GROUP)
        find_login = ("$(aws ec2 describe-instances --region " + self.region
                      + f" --filters Name=tag:{NODE_GROUP_TAG},Values={login_tag} Name=instance-state-name,Values=running"
                      " --query 'Reservations[0].Instances[0].InstanceId' --output text)")
        cdk.CfnOutput(self, "ClusterName", value=settings.pcs_cluster_name)
        cdk.CfnOutput(self, "ClusterId", value=self.cluster.attr_id)
        cdk.CfnOutput(self, "SchedulerLogGroup", description="slurmctld's log (streams AWSLogs/PCS/<ClusterId>/...)",
                      value=self.scheduler_logs.log_group.log_group_name)
        cdk.CfnOutput(self, "ConnectCommand", description="Open a shell on the login node (SSM Session Manager)",
                      value=f"aws ssm start-session --region {self.region} --target {find_login}")
        cdk.CfnOutput(self, "DashboardName", description="GPUs and training (CloudWatch dashboard)",
                      value=self.monitoring.dashboard.dashboard_name)
        cdk.CfnOutput(self, "AlarmTopicArn", description="Alarms go to this SNS topic",
                      value=self.monitoring.topic.topic_arn)
        if self.rest_client is not None:
            cdk.CfnOutput(self, "RestClientPolicyArn", value=self.rest_client.policy.managed_policy_arn,
                          description="Attach to the role you use from the laptop: python -m training remote")
