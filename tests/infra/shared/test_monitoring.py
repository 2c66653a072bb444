"""Monitoring of the cluster stack: the alarms' encrypted topic (and optional e-mail), the three
alarms and what they watch, the Xid metric filter, the dashboard's GPU and training widgets beside a
link to ParallelCluster's, the compute nodes' CloudWatch agent policy, and the names the nodes get."""

from __future__ import annotations

import json
import re

import pytest

from stacks.shared.monitoring import GPU_MEASUREMENTS, TRAINING_METRICS
from tests.support.cdk_synth import cluster_config, one, resources
from training.metrics import EMF_DIMENSIONS, EMF_FIELDS

pytestmark = pytest.mark.slow


def _by_id(template: dict, resource_type: str, fragment: str) -> dict:
    (found,) = [v for k, v in resources(template, resource_type).items() if fragment in k]
    return found


def test_the_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use(synth):
    template = synth.json["cluster"]
    topic = one(template, "AWS::SNS::Topic")["Properties"]
    key_id = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = template["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    (grant,) = [s for s in key["KeyPolicy"]["Statement"] if s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}]
    assert set(grant["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    (policy,) = resources(template, "AWS::SNS::TopicPolicy").values()
    (deny,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_an_email_subscription_only_when_the_settings_name_one(synth, demo_synth):
    assert resources(synth.json["cluster"], "AWS::SNS::Subscription") == {}
    (subscription,) = resources(demo_synth.json["cluster"], "AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == "ops@example.org"


def _metrics(alarm: dict) -> dict[str, dict]:
    return {m["Id"]: m for m in alarm["Properties"]["Metrics"]}


def test_gpus_under_30_percent_for_15_minutes_of_pretraining(synth):
    alarm = _by_id(synth.json["cluster"], "AWS::CloudWatch::Alarm", "GpusUnderused")["Properties"]
    metrics = _metrics({"Properties": alarm})
    (expression,) = [m for m in metrics.values() if "Expression" in m]
    assert expression["Expression"] == "IF(FILL(training, 0) > 0 AND gpu < 30, 1, 0)"
    gpu, training = metrics["gpu"]["MetricStat"], metrics["training"]["MetricStat"]
    assert (gpu["Metric"], gpu["Stat"]) == (
        {"MetricName": "nvidia_smi_utilization_gpu", "Namespace": "scdino-hpc/GPU"}, "Average")
    assert training["Metric"] == {"MetricName": "step_time_s", "Namespace": "scdino-hpc/Training"}
    assert gpu["Period"] * alarm["EvaluationPeriods"] == 15 * 60 == gpu["Period"] * alarm["DatapointsToAlarm"]
    assert alarm["Threshold"] == 1 and alarm["TreatMissingData"] == "notBreaching"


def test_gpu_nodes_idle_for_30_minutes(synth):
    alarm = _by_id(synth.json["cluster"], "AWS::CloudWatch::Alarm", "NodesIdle")["Properties"]
    metrics = _metrics({"Properties": alarm})
    assert metrics["gpus"]["MetricStat"]["Stat"] == "SampleCount"
    assert metrics["busiest"]["MetricStat"]["Stat"] == "Maximum"
    assert metrics["gpus"]["MetricStat"]["Period"] * alarm["EvaluationPeriods"] == 30 * 60


def test_every_alarm_goes_to_the_topic_and_xid_errors_are_counted(synth):
    template = synth.json["cluster"]
    topic_id = next(iter(resources(template, "AWS::SNS::Topic")))
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert len(alarms) == 3
    assert all(a["Properties"]["AlarmActions"] == [{"Ref": topic_id}] for a in alarms.values())
    xid_filter = one(template, "AWS::Logs::MetricFilter")["Properties"]
    assert xid_filter["FilterPattern"] == '"NVRM: Xid"'
    (transform,) = xid_filter["MetricTransformations"]
    xid_alarm = _by_id(template, "AWS::CloudWatch::Alarm", "XidError")["Properties"]
    assert (xid_alarm["MetricName"], xid_alarm["Namespace"]) == (transform["MetricName"], transform["MetricNamespace"])


def test_the_dashboard_shows_gpus_and_training_beside_parallelclusters(synth):
    dashboard = one(synth.json["cluster"], "AWS::CloudWatch::Dashboard")["Properties"]
    assert dashboard["DashboardName"] == "scdino-hpc-gpus-and-training"
    body = "".join(part if isinstance(part, str) else "" for part in dashboard["DashboardBody"]["Fn::Join"][1])
    widgets = json.loads(body.replace('"region":"",', '"region":"us-east-1",'))["widgets"]
    text = json.dumps(widgets)
    assert "#dashboards:name=scdino-hpc-us-east-1" in text  # ParallelCluster's own dashboard
    for name in GPU_MEASUREMENTS:
        assert f"nvidia_smi_{name}" in text
    for name in TRAINING_METRICS:
        assert f'MetricName=\\"{name}\\"' in text and name in EMF_FIELDS
    assert ["Run"] in EMF_DIMENSIONS and '\\"scdino-hpc/Training\\",Run}' in text
    assert any(w["type"] == "alarm" and len(w["properties"]["alarms"]) == 3 for w in widgets)


def test_compute_nodes_may_run_the_cloudwatch_agent_and_the_head_node_is_unchanged(synth):
    config = cluster_config(synth)
    agent = {"Policy": "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"}
    for queue in config["Scheduling"]["SlurmQueues"]:
        assert agent in queue["Iam"]["AdditionalIamPolicies"]
    assert agent not in config["HeadNode"]["Iam"]["AdditionalIamPolicies"]


def test_the_pointer_names_the_namespaces_and_the_log_group(synth):
    template = synth.json["cluster"]
    deployment = _by_id(template, "Custom::CDKBucketDeployment", "Bootstrap")["Properties"]
    log_group_id = next(k for k in resources(template, "AWS::Logs::LogGroup") if k.startswith("Monitoring"))
    markers = deployment["SourceMarkers"][1]
    (marker,) = [k for k, v in markers.items() if {"Ref": log_group_id} in v["Fn::Join"][1]]
    (pointer,) = [path.read_text() for key in deployment["SourceObjectKeys"]
                  for path in [synth.outdir / f"asset.{key.removesuffix('.zip')}" / "current.json"] if path.is_file()]
    monitoring = json.loads(re.sub(r'"?<<marker:0xbaba:\d+>>"?', '"x"', pointer))["monitoring"]
    assert monitoring["gpu_namespace"] == "scdino-hpc/GPU" and monitoring["training_namespace"] == "scdino-hpc/Training"
    assert marker in pointer and pointer.index(marker) > pointer.index('"log_group"')
