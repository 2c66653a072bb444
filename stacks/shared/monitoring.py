"""Watching a run: the GPUs and the training on one dashboard, and alarms to an SNS topic.

The GPU compute nodes (bootstrap/on-node-configured.sh) append bootstrap/cloudwatch-agent.json to
the CloudWatch agent ParallelCluster runs: the agent's NVIDIA GPU metrics in `<cluster>/GPU` (per
instance and, with no dimension, for the whole cluster), and two files into this construct's log
group: the kernel's NVIDIA Xid lines (a metric filter counts them) and rank 0's embedded-metric-format
lines (training/metrics.py), which CloudWatch Logs turns into metrics in `<cluster>/Training` (per
run and for the whole cluster). ParallelCluster's own dashboard (`<cluster>-<region>`) stays; this
one links to it.

Alarms (each to the topic; an e-mail subscription when `cluster.alarm_email` is set):
- GPUs under 30 % utilisation for 15 minutes while pretraining reports steps;
- GPU nodes up with every GPU idle for 30 minutes: billed nodes that run nothing (static nodes, or a
  job stuck before its first step);
- an NVIDIA Xid error in a node's kernel log.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.shared.common import retention

GPU_MEASUREMENTS = ("utilization_gpu", "memory_used", "power_draw", "temperature_gpu")
"""The agent's nvidia_gpu measurements the dashboard and alarms read (metric `nvidia_smi_<name>`)."""
TRAINING_METRICS = ("images_per_s", "loss", "data_wait_s", "step_time_s", "teacher_entropy")
"""The EMF fields of training/metrics.py the dashboard draws."""
PERIOD = cdk.Duration.minutes(5)
UNDERUSED_PERCENT = 30
UNDERUSED_MINUTES = 15
IDLE_MINUTES = 30
XID_PATTERN = "NVRM: Xid"


@dataclass(frozen=True)
class MonitoringNames:
    """What the nodes need to know (the bootstrap pointer carries them)."""

    gpu_namespace: str
    training_namespace: str
    log_group: str

    def pointer(self) -> dict[str, str]:
        return {"gpu_namespace": self.gpu_namespace, "training_namespace": self.training_namespace,
                "log_group": self.log_group}


def gpu_metric(namespace: str, name: str, statistic: str) -> cw.Metric:
    """One of the agent's GPU metrics for the whole cluster (the aggregation with no dimension)."""
    return cw.Metric(namespace=namespace, metric_name=f"nvidia_smi_{name}", statistic=statistic, period=PERIOD)


def per_dimension(namespace: str, dimension: str, metric_name: str, statistic: str, label: str) -> cw.MathExpression:
    """Every series of one metric by `dimension` (per instance, per run), found by a search."""
    return cw.MathExpression(
        expression=f"SEARCH('{{\"{namespace}\",{dimension}}} MetricName=\"{metric_name}\"', '{statistic}', 300)",
        label=label, period=PERIOD)


class Monitoring(Construct):
    """The log group the nodes write to, the alarms' topic and key, the alarms and the dashboard."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str, log_retention_days: int,
                 alarm_email: str, logs_key: kms.IKey, parallelcluster_dashboard: bool = True) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Logs", retention=retention(log_retention_days), encryption_key=logs_key,
                                       removal_policy=cdk.RemovalPolicy.DESTROY)
        self.names = MonitoringNames(f"{cluster_name}/GPU", f"{cluster_name}/Training", self.log_group.log_group_name)
        self.topic = self._topic(alarm_email)
        logs.MetricFilter(self, "XidErrors", log_group=self.log_group,
                          filter_pattern=logs.FilterPattern.literal(f'"{XID_PATTERN}"'),
                          metric_namespace=self.names.gpu_namespace, metric_name="XidErrors", metric_value="1")
        self.alarms = [self._underused_alarm(), self._idle_alarm(), self._xid_alarm()]
        for alarm in self.alarms:
            alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.dashboard = self._dashboard(cluster_name, parallelcluster_dashboard)

    def _topic(self, alarm_email: str) -> sns.Topic:
        """An encrypted topic CloudWatch may publish to: its key lets the CloudWatch service use it."""
        key = kms.Key(self, "AlarmKey", enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY,
                      description="Encrypts the cluster's alarm topic")
        key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"]))
        topic = sns.Topic(self, "Alarms", master_key=key, enforce_ssl=True, display_name="scDINO cluster alarms")
        if alarm_email:
            topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        return topic

    def _underused_alarm(self) -> cw.Alarm:
        training = cw.Metric(namespace=self.names.training_namespace, metric_name="step_time_s",
                             statistic="SampleCount", period=PERIOD)
        expression = cw.MathExpression(
            expression=f"IF(FILL(training, 0) > 0 AND gpu < {UNDERUSED_PERCENT}, 1, 0)",
            using_metrics={"training": training, "gpu": gpu_metric(self.names.gpu_namespace, "utilization_gpu",
                                                                    "Average")},
            label="pretraining with GPUs under 30 %", period=PERIOD)
        return self._alarm("GpusUnderused", expression, UNDERUSED_MINUTES,
                           f"Pretraining runs but its GPUs average under {UNDERUSED_PERCENT} % utilisation for "
                           f"{UNDERUSED_MINUTES} minutes: look at the run's data wait (loader, file system) on the "
                           "dashboard.")

    def _idle_alarm(self) -> cw.Alarm:
        expression = cw.MathExpression(
            expression="IF(FILL(gpus, 0) > 0 AND FILL(busiest, 0) < 1, 1, 0)",
            using_metrics={"gpus": gpu_metric(self.names.gpu_namespace, "utilization_gpu", "SampleCount"),
                           "busiest": gpu_metric(self.names.gpu_namespace, "utilization_gpu", "Maximum")},
            label="GPU nodes up, every GPU idle", period=PERIOD)
        return self._alarm("NodesIdle", expression, IDLE_MINUTES,
                           f"GPU nodes are up and billed, but no GPU did any work for {IDLE_MINUTES} minutes: "
                           "check `squeue` and `sinfo`; static nodes (cluster.min_nodes) stay up without jobs.")

    def _alarm(self, construct_id: str, expression: cw.MathExpression, minutes: int, description: str) -> cw.Alarm:
        """An alarm that fires when `expression` (1 or 0 per PERIOD) is 1 for `minutes` on end."""
        periods = minutes // int(PERIOD.to_minutes())
        return cw.Alarm(self, construct_id, metric=expression, threshold=1, evaluation_periods=periods,
                        datapoints_to_alarm=periods, treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                        alarm_description=description)

    def _xid_alarm(self) -> cw.Alarm:
        xid = cw.Metric(namespace=self.names.gpu_namespace, metric_name="XidErrors", statistic="Sum", period=PERIOD)
        return cw.Alarm(self, "XidError", metric=xid, threshold=1, evaluation_periods=1,
                        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                        alarm_description="An NVIDIA Xid error in a GPU node's kernel log: the line is in the "
                                          "cluster's monitoring log group (stream <instance>/xid-*).")

    def _dashboard(self, cluster_name: str, parallelcluster_dashboard: bool) -> cw.Dashboard:
        gpu, train = self.names.gpu_namespace, self.names.training_namespace
        region = cdk.Stack.of(self).region
        parallelcluster = f"{cluster_name}-{region}"
        # ParallelCluster keeps a dashboard of its own; PCS shows its cluster in the PCS console.
        elsewhere = (f" ParallelCluster's own dashboard: [{parallelcluster}](#dashboards:name={parallelcluster})."
                     if parallelcluster_dashboard else " The cluster itself: the AWS PCS console.")
        intro = cw.TextWidget(width=24, height=2, markdown=(
            f"## GPUs and training of `{cluster_name}`\nGPU metrics from the CloudWatch agent (`{gpu}`), training "
            f"metrics from rank 0 (`{train}`).{elsewhere}"))
        gpu_graphs = [
            cw.GraphWidget(title=title, width=8, left=[per_dimension(gpu, "InstanceId", f"nvidia_smi_{name}", stat,
                                                                      "${PROP('Dim.InstanceId')}")])
            for title, name, stat in (("GPU utilisation, %", "utilization_gpu", "Average"),
                                      ("GPU memory used, MiB", "memory_used", "Maximum"),
                                      ("GPU power, W", "power_draw", "Maximum"),
                                      ("GPU temperature, C", "temperature_gpu", "Maximum"))]
        xid = cw.GraphWidget(title="NVIDIA Xid errors", width=8, left=[cw.Metric(
            namespace=gpu, metric_name="XidErrors", statistic="Sum", period=PERIOD)])
        training = [
            cw.GraphWidget(title=title, width=8, left=[per_dimension(train, "Run", name, "Average",
                                                                      "${PROP('Dim.Run')}")])
            for title, name in (("Images per second", "images_per_s"), ("Loss", "loss"),
                                ("Data wait per step, s", "data_wait_s"), ("Step time, s", "step_time_s"),
                                ("Teacher entropy", "teacher_entropy"))]
        alarms = cw.AlarmStatusWidget(title="Alarms", width=8, alarms=self.alarms)
        return cw.Dashboard(self, "Dashboard", dashboard_name=f"{cluster_name}-gpus-and-training",
                            widgets=[[intro], [*gpu_graphs[:3]], [gpu_graphs[3], xid, alarms], training[:3],
                                     training[3:]])
