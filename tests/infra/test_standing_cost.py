"""The standing cost's counts (training/planning/standing.py) against what the synthesised stacks hold:
the KMS keys per stack and which ones `cdk destroy --all` keeps, the NAT gateway and its address, the
dashboards and the alarms' metrics, the file system's size and tier, the head node's volumes and PCS's
login nodes, for the default deployment, backend=pcs and the throw-away variant (storage.retain=false)."""

from __future__ import annotations

import pytest

from stacks.shared.presets import PRESETS
from stacks.shared.settings import build_settings
from tests.support.cdk_synth import cdk_json_context, cluster_config, one, resources
from training.planning.inputs import PlanSettings
from training.planning.standing import ALARM_METRICS, DASHBOARDS, HOURS_PER_MONTH, KMS_KEYS, SECRETS, standing_items

pytestmark = pytest.mark.slow


def _retained(template: dict, resource_type: str) -> list[str]:
    return sorted(key for key, value in resources(template, resource_type).items()
                  if value.get("DeletionPolicy") == "Retain")


def test_each_stack_holds_the_keys_counted_and_only_the_storage_stack_retains(synth, pcs_synth, demo_synth):
    for synthesised in (synth, pcs_synth, demo_synth):
        assert {stack: len(resources(template, "AWS::KMS::Key")) for stack, template in synthesised.json.items()} \
            == KMS_KEYS
    # retain (cdk.json's default): the storage stack keeps its key, buckets and file system, and its
    # termination protection stops `destroy --all` before the network stack (and its flow-log key)
    assert synth.stacks.storage.termination_protection
    assert {stack: _retained(template, "AWS::KMS::Key") for stack, template in synth.json.items()
            if _retained(template, "AWS::KMS::Key")} == {"storage": ["StorageKeyB6649B55"]}
    assert _retained(synth.json["storage"], "AWS::FSx::FileSystem") == ["DataFileSystemD6B5DF42"]
    assert not demo_synth.stacks.storage.termination_protection
    for kind in ("AWS::KMS::Key", "AWS::FSx::FileSystem", "AWS::S3::Bucket"):
        assert _retained(demo_synth.json["storage"], kind) == []


def test_one_nat_gateway_and_its_address_live_in_the_cluster_stack(synth, pcs_synth):
    for synthesised in (synth, pcs_synth):
        where = {stack: (len(resources(template, "AWS::EC2::NatGateway")), len(resources(template, "AWS::EC2::EIP")))
                 for stack, template in synthesised.json.items()}
        assert where == {"network": (0, 0), "storage": (0, 0), "image": (0, 0), "cluster": (1, 1)}


def test_the_dashboards_and_the_alarms_metrics_counted(synth, pcs_synth):
    for synthesised, backend in ((synth, "parallelcluster"), (pcs_synth, "pcs")):
        ours = len(resources(synthesised.json["cluster"], "AWS::CloudWatch::Dashboard"))
        parallelcluster_s = (backend == "parallelcluster"
                             and cluster_config(synthesised)["Monitoring"]["Dashboards"]["CloudWatch"]["Enabled"])
        assert ours + int(parallelcluster_s) == DASHBOARDS[backend]
        alarms = resources(synthesised.json["cluster"], "AWS::CloudWatch::Alarm").values()
        metrics = sum(len([m for m in alarm["Properties"].get("Metrics", []) if "MetricStat" in m])
                      or int("MetricName" in alarm["Properties"]) for alarm in alarms)
        assert metrics == ALARM_METRICS


def test_the_secrets_counted_are_the_cluster_stack_s(synth, pcs_synth):
    for synthesised, backend in ((synth, "parallelcluster"), (pcs_synth, "pcs")):
        held = {stack: len(resources(template, "AWS::SecretsManager::Secret"))
                for stack, template in synthesised.json.items()}
        assert held == {"network": 0, "storage": 0, "image": 0, "cluster": SECRETS[backend]}
        plan = PlanSettings.of(build_settings(cdk_json_context()["scdino"], {"backend": backend}))
        items = {item.resource: item for item in standing_items(plan)}
        priced = [item for name, item in items.items() if name.startswith("Secrets Manager")]
        assert sum(item.quantity for item in priced) == SECRETS[backend]
        assert all(item.usd_per_month == round(0.40 * item.quantity, 4) and not item.kept for item in priced)


def test_the_file_system_and_head_node_volumes_priced_are_the_ones_deployed(synth):
    plan = PlanSettings.of(build_settings(cdk_json_context()["scdino"]))
    items = {item.resource: item for item in standing_items(plan)}
    lustre = one(synth.json["storage"], "AWS::FSx::FileSystem")["Properties"]
    (fsx,) = [item for name, item in items.items() if name.startswith("FSx for Lustre")]
    assert fsx.quantity == lustre["StorageCapacity"]
    assert f"at {lustre['LustreConfiguration']['PerUnitStorageThroughput']} MB/s/TiB" in fsx.resource
    config = cluster_config(synth)
    (apps,) = [s["EbsSettings"]["Size"] for s in config["SharedStorage"] if s["StorageType"] == "Ebs"]
    root = config["HeadNode"]["LocalStorage"]["RootVolume"]["Size"]
    volumes = [item.quantity for name, item in items.items() if "volume" in name]
    assert sorted(volumes) == sorted([root, apps])
    assert any(config["HeadNode"]["InstanceType"] in name for name in items)


def test_the_pcs_login_nodes_priced_are_the_login_group_deployed(pcs_synth):
    """backend=pcs bills its login nodes all the time: their count, type and root volumes as the login node
    group and its launch template deploy them (tests/infra/pcs/test_pcs_updates.py checks another count and type)."""
    cluster = pcs_synth.json["cluster"]
    (login,) = [value["Properties"] for value in resources(cluster, "AWS::PCS::ComputeNodeGroup").values()
                if value["Properties"]["Name"].startswith("login")]
    data = cluster["Resources"][login["CustomLaunchTemplate"]["TemplateId"]["Ref"]]["Properties"]["LaunchTemplateData"]
    count = login["ScalingConfiguration"]["MinInstanceCount"]
    assert count == login["ScalingConfiguration"]["MaxInstanceCount"] >= 1  # static: billed while deployed
    plan = PlanSettings.of(build_settings(cdk_json_context()["scdino"], {
        "backend": "pcs", "cluster.presets": ",".join(PRESETS), "cluster.cpu_spot_instance_type": "c6i.8xlarge"}))
    items = {item.resource: item for item in standing_items(plan)}
    nodes = items[f"login nodes ({count} x {login['InstanceConfigs'][0]['InstanceType']})"]
    volumes = items[f"login nodes' root volumes ({count} x {data['BlockDeviceMappings'][0]['Ebs']['VolumeSize']} GiB gp3)"]
    assert (nodes.quantity, volumes.quantity) == (count * HOURS_PER_MONTH,
                                                  count * data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"])
