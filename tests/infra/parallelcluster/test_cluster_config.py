"""The cluster configuration of every preset and OS, validated by ParallelCluster 3.16's own schema
(in its own virtualenv, as a subprocess) and by the checks that schema does not make."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest

from stacks.parallelcluster.config import ClusterRefs, build_cluster_config
from stacks.shared.presets import DEFAULT_PRESET, PRESETS, SLURM_DEFAULTS
from stacks.shared.settings import SUPPORTED_OSES, build_settings
from tests.support.cdk_synth import cluster_config, run_pcluster

pytestmark = pytest.mark.slow

# From the EC2 user guide's list of EFA-capable instance types (independent of stacks/shared/presets.py).
EFA_CAPABLE = {"g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g4dn.metal", "g5.8xlarge", "g5.12xlarge",
               "g5.16xlarge", "g5.24xlarge", "g5.48xlarge", "g6e.8xlarge", "g6e.12xlarge", "g6e.16xlarge",
               "g6e.24xlarge", "g6e.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
               "p5en.48xlarge"}
# (GPUs, vCPUs) from the AWS Batch user guide's GPU table and the SageMaker HyperPod CLI's instance table.
GPUS = {"g4dn.12xlarge": (4, 48), "g5.12xlarge": (4, 48), "g6e.12xlarge": (4, 48), "p4d.24xlarge": (8, 96),
        "p5.48xlarge": (8, 192), "p5en.48xlarge": (8, 192)}
REFS = ClusterRefs(
    subnet_id="subnet-0123456789abcdef0", security_group_id="sg-0123456789abcdef0",
    file_system_id="fs-0123456789abcdef0",
    data_policy_arn="arn:aws:iam::111122223333:policy/parallelcluster/scdino-data",
    deploy_bucket="scdino-cluster-nodebundlebucket-0123456789ab", bundle_id="0a1b2c3d")
CUSTOM_AMI = "ami-0123456789abcdef0"


def _configs() -> dict[str, dict]:
    configs = {name: build_cluster_config(build_settings({"cluster.presets": name}), REFS) for name in PRESETS}
    for os_name in SUPPORTED_OSES:
        configs[f"all-presets-custom-ami-{os_name}"] = build_cluster_config(
            build_settings({"cluster.presets": ",".join(PRESETS), "cluster.min_nodes": 1, "image.os": os_name}),
            dataclasses.replace(REFS, custom_ami=CUSTOM_AMI))
    broken = copy.deepcopy(configs[DEFAULT_PRESET])
    broken["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["MaxCout"] = 2
    configs["broken"] = broken
    return configs


# What a CloudFormation reference in the synthesised template stands for, by the key holding it.
_PLACEHOLDERS = {
    "SubnetId": REFS.subnet_id, "SubnetIds": REFS.subnet_id, "AdditionalSecurityGroups": REFS.security_group_id,
    "FileSystemId": REFS.file_system_id, "Policy": REFS.data_policy_arn, "BucketName": REFS.deploy_bucket,
    "Script": "s3://bucket/bootstrap/on-node-configured.sh", "Args": "s3://bucket/bootstrap/current.json",
    "CustomAmi": CUSTOM_AMI,
}


def resolve_references(value, key: str = ""):
    """Replace Ref/Fn:: objects of a synthesised template by placeholder ids, as CloudFormation would."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)).startswith(("Ref", "Fn::")):
            assert key in _PLACEHOLDERS, f"unexpected reference under {key!r}: {value}"
            return _PLACEHOLDERS[key]
        return {k: resolve_references(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_references(item, key) for item in value]
    return value


@pytest.fixture(scope="module")
def configs(synth, demo_synth) -> dict[str, dict]:
    built = _configs()
    built["synthesized"] = resolve_references(cluster_config(synth))
    built["synthesized-demo"] = resolve_references(cluster_config(demo_synth))
    return built


@pytest.fixture(scope="module")
def schema_errors(configs) -> dict[str, list[str]]:
    return run_pcluster({"schema": configs})["schema"]


@pytest.mark.parametrize("label", [*PRESETS, *(f"all-presets-custom-ami-{os_name}" for os_name in SUPPORTED_OSES),
                                   "synthesized", "synthesized-demo"])
def test_parallelcluster_schema_accepts_the_config(schema_errors, label):
    assert schema_errors[label] == []


def test_the_schema_check_really_rejects_a_bad_config(schema_errors):
    (error,) = schema_errors["broken"]
    assert "MaxCout" in error and "Unknown field" in error


def _queues(configs):
    return [queue for config in configs.values() for queue in config["Scheduling"]["SlurmQueues"]]


def test_queue_and_resource_names_follow_parallelcluster_rules(configs):
    for queue in _queues(configs):
        for name in [queue["Name"], *(r["Name"] for r in queue["ComputeResources"])]:
            assert re.fullmatch(r"[a-z][a-z0-9-]*", name) and len(name) <= 25 and name != "default", name


def test_queue_names_are_unique_in_a_cluster(configs):
    for label, queues in (("all-presets-custom-ami-alinux2023", len(PRESETS)), ("synthesized-demo", 3)):
        names = [q["Name"] for q in configs[label]["Scheduling"]["SlurmQueues"]]
        assert len(names) == len(set(names)) == queues


def test_min_count_at_most_max_count(configs):
    for queue in _queues(configs):
        for resource in queue["ComputeResources"]:
            assert 0 <= resource["MinCount"] <= resource["MaxCount"]


def test_efa_and_placement_groups_only_on_efa_capable_types(configs):
    for queue in _queues(configs):
        (resource,) = queue["ComputeResources"]
        efa = resource.get("Efa", {}).get("Enabled", False)
        assert efa == (resource["InstanceType"] in EFA_CAPABLE)
        assert queue["Networking"].get("PlacementGroup", {}).get("Enabled", False) == efa


def test_presets_gpu_counts_match_the_instance_types():
    assert set(GPUS) == set(PRESETS)
    for name, (gpus, vcpus) in GPUS.items():
        assert (PRESETS[name].gpus_per_node, PRESETS[name].vcpus) == (gpus, vcpus)
    assert SLURM_DEFAULTS["SCDINO_GPUS_PER_NODE"] == str(GPUS[DEFAULT_PRESET][0])
    assert SLURM_DEFAULTS["SCDINO_CPUS_PER_GPU"] == str(GPUS[DEFAULT_PRESET][1] // GPUS[DEFAULT_PRESET][0])


def test_head_node_is_reached_through_ssm_not_ssh(configs):
    for config in configs.values():
        head = config["HeadNode"]
        assert "KeyName" not in head.get("Ssh", {})
        assert head["Ssh"]["AllowedIps"] == "10.0.0.0/16"
        assert head["Imds"] == {"Secured": True}
    assert configs[DEFAULT_PRESET]["Imds"] == {"ImdsSupport": "v2.0"}
    other_vpc = build_cluster_config(build_settings({"network.vpc_cidr": "10.1.0.0/16"}), REFS)
    assert other_vpc["HeadNode"]["Ssh"]["AllowedIps"] == "10.1.0.0/16"


def test_shared_storage_fsx_by_id_and_apps_volume(configs):
    fsx, apps = configs[DEFAULT_PRESET]["SharedStorage"]
    assert fsx == {"Name": "fsx", "StorageType": "FsxLustre", "MountDir": "/fsx",
                   "FsxLustreSettings": {"FileSystemId": REFS.file_system_id}}
    assert apps["MountDir"] == "/apps" and apps["EbsSettings"]["Encrypted"] is True


def test_every_volume_is_encrypted(configs):
    for config in configs.values():
        volumes = [config["HeadNode"]["LocalStorage"]["RootVolume"]] + [
            q["ComputeSettings"]["LocalStorage"]["RootVolume"] for q in config["Scheduling"]["SlurmQueues"]]
        assert all(volume["Encrypted"] for volume in volumes)


def test_monitoring_logs_and_dashboard_enabled(configs):
    monitoring = configs[DEFAULT_PRESET]["Monitoring"]
    assert monitoring["Logs"]["CloudWatch"]["Enabled"] and monitoring["Dashboards"]["CloudWatch"]["Enabled"]


def test_builder_is_pure_and_deterministic():
    import stacks.parallelcluster.config as module

    settings = build_settings()
    assert build_cluster_config(settings, REFS) == build_cluster_config(settings, REFS)
    imported = {getattr(value, "__module__", None) or getattr(value, "__name__", "") for value in vars(module).values()}
    assert not any(name and name.startswith(("aws_cdk", "constructs")) for name in imported)
