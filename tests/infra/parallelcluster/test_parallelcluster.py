"""What ParallelCluster 3.16 itself enforces on a deploy and on every later update, checked with its
own code (update policies, validators, constants) in its virtualenv, and with the IAM rule of the
provider it deploys through."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import re
from pathlib import Path

import pytest

from stacks.parallelcluster.config import ClusterRefs, build_cluster_config
from stacks.shared.presets import PRESETS
from stacks.shared.settings import (
    CLUSTER_NAME_MAX_ACCOUNTING,
    REFUSED_OSES,
    SUPPORTED_OSES,
    SettingsError,
    build_settings,
)
from tests.support.cdk_synth import cluster_config, exported, run_pcluster

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKER_TEMPLATE = REPO_ROOT / "ami" / "gpu-image.pkr.hcl"
ACCOUNT = "111122223333"
# Sid IamPolicy of cloudformation/policies/parallelcluster-policies.yaml (aws/aws-parallelcluster), the
# nested stack of the 3.16 custom-resource provider: iam:AttachRolePolicy on node roles is allowed
# only when the policy ARN is ArnLike one of these.
ATTACHABLE_POLICY_PATTERNS = [
    f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster*",
    f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/*",
    *(f"arn:aws:iam::aws:policy/{name}" for name in (
        "CloudWatchAgentServerPolicy", "AmazonSSMManagedInstanceCore", "AWSBatchFullAccess",
        "AmazonS3ReadOnlyAccess", "service-role/AWSBatchServiceRole",
        "service-role/AmazonEC2ContainerServiceforEC2Role", "service-role/AmazonECSTaskExecutionRolePolicy",
        "service-role/AmazonEC2SpotFleetTaggingRole", "EC2InstanceProfileForImageBuilder",
        "service-role/AWSLambdaBasicExecutionRole")),
]
REFS = ClusterRefs(
    subnet_id="subnet-0123456789abcdef0", security_group_id="sg-0123456789abcdef0",
    file_system_id="fs-0123456789abcdef0", data_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/data",
    deploy_bucket="scdino-cluster-nodebundlebucket-0123456789ab", bundle_id="a" * 64,
    deploy_read_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/deploy-read",
    custom_ami="ami-0123456789abcdef0")


def attachable(arn: str) -> bool:
    """IAM ArnLike: `*` matches any run of characters (slashes included)."""
    return any(fnmatch.fnmatchcase(arn, pattern) for pattern in ATTACHABLE_POLICY_PATTERNS)


def _render(value, synth):
    """A policy reference of the synthesised templates as the ARN CloudFormation would give it."""
    if isinstance(value, str):
        return value
    if "Fn::ImportValue" in value:
        return _render(exported(synth, value)[1], synth)
    if "Ref" in value:
        ((stack, policy),) = [(name, template["Resources"][value["Ref"]]) for name, template in synth.json.items()
                              if value["Ref"] in template["Resources"] and value.get("Ref")]
        assert policy["Type"] == "AWS::IAM::ManagedPolicy"
        properties = policy["Properties"]
        # Without ManagedPolicyName, CloudFormation names it <stack>-<logical id>-<random suffix>.
        name = properties.get("ManagedPolicyName", f"{stack}-{value['Ref']}-1A2B3C4D5E6F")
        return f"arn:aws:iam::{ACCOUNT}:policy{properties.get('Path', '/')}{name}"
    raise AssertionError(f"cannot render policy reference {value}")


def node_iams(config: dict) -> list[dict]:
    return ([config["HeadNode"]["Iam"]] + [queue["Iam"] for queue in config["Scheduling"]["SlurmQueues"]]
            + [pool["Iam"] for pool in config.get("LoginNodes", {}).get("Pools", [])])


def node_policy_arns(synth) -> list[str]:
    return [_render(entry["Policy"], synth)
            for iam in node_iams(cluster_config(synth)) for entry in iam.get("AdditionalIamPolicies", [])]


def test_the_attach_rule_refuses_a_policy_outside_the_parallelcluster_path():
    assert not attachable(f"arn:aws:iam::{ACCOUNT}:policy/scdino-storage-ClusterDataAccessPolicy-1A2B3C")
    assert attachable(f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/scdino-storage-Data-1A2B3C")


@pytest.mark.parametrize("variant", ["synth", "demo_synth"])
def test_every_node_policy_is_attachable_by_the_provider(variant, request):
    arns = node_policy_arns(request.getfixturevalue(variant))
    assert arns
    for arn in arns:
        assert attachable(arn), f"ParallelCluster's provider may not attach {arn}"


@pytest.mark.parametrize("variant", ["synth", "demo_synth"])
def test_head_and_compute_nodes_get_session_manager(variant, request):
    iams = node_iams(cluster_config(request.getfixturevalue(variant)))
    assert len(iams) == (2 if variant == "synth" else 5)
    for iam in iams:
        assert {"Policy": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"} in iam["AdditionalIamPolicies"]


def test_cluster_logs_outlive_a_failed_create(synth):
    assert cluster_config(synth)["Monitoring"]["Logs"]["CloudWatch"]["DeletionPolicy"] == "Retain"


# --- updates: what `cdk deploy` sends to an existing cluster ---------------------------------------

def _rendering(refs: ClusterRefs = REFS, **settings) -> dict:
    return build_cluster_config(build_settings({"cluster.presets": ",".join(PRESETS), **settings}), refs)


PATCHES = {
    "code-change": (_rendering(), _rendering(dataclasses.replace(REFS, bundle_id="b" * 64))),
    "new-pipeline-ami": (_rendering(), _rendering(dataclasses.replace(REFS, custom_ami="ami-0fedcba9876543210"))),
    "first-pipeline-ami": (_rendering(dataclasses.replace(REFS, custom_ami="")), _rendering()),
    "node-counts": (_rendering(), _rendering(**{"cluster.min_nodes": 1, "cluster.max_nodes": 4})),
}
# Controls: changes ParallelCluster refuses on a running cluster, which the renderings above avoid.
CONTROLS = {
    "head-node-on-node-configured-args": lambda config: config["HeadNode"]["CustomActions"]["OnNodeConfigured"][
        "Args"].append("s3://bucket/other.zip"),
    "cluster-wide-custom-ami": lambda config: config["Image"].update(CustomAmi="ami-0fedcba9876543210"),
}


# Settings changes whose rating depends on the compute fleet: (label, settings, fleet running).
FLEET_PATCHES = {
    f"{label}-fleet-{'running' if running else 'stopped'}": (layer, running)
    for label, layer in (("os-change", {"image.os": "ubuntu2204"}), ("idle-time", {"cluster.scaledown_idle_minutes": 20}))
    for running in (True, False)}


@pytest.fixture(scope="module")
def patches() -> dict:
    request = dict(PATCHES)
    for label, change in CONTROLS.items():
        target = _rendering()
        change(target)
        request[label] = (_rendering(), target)
    for label, (layer, running) in FLEET_PATCHES.items():
        request[label] = (_rendering(), _rendering(**layer), running)
    return run_pcluster({"patches": request})["patches"]


@pytest.mark.parametrize("label", sorted(PATCHES))
def test_a_deploy_is_a_supported_update_of_a_running_cluster(patches, label):
    result = patches[label]
    assert result["changes"], f"{label}: the two renderings should differ"
    assert not [path for path, policy in result["changes"] if policy == "UNSUPPORTED"], result["changes"]
    assert result["allowed"], result["changes"]


def test_a_code_change_touches_only_the_head_node_update_action(patches):
    (change,) = patches["code-change"]["changes"]
    assert change[0] == "HeadNode.CustomActions.OnNodeUpdated.Args"


@pytest.mark.parametrize("label", sorted(CONTROLS))
def test_the_update_check_refuses_what_parallelcluster_refuses(patches, label):
    assert {policy for _, policy in patches[label]["changes"]} == {"UNSUPPORTED"}
    assert not patches[label]["allowed"]


@pytest.mark.parametrize("fleet", ["running", "stopped"])
def test_another_os_is_a_new_cluster_even_with_the_fleet_stopped(patches, fleet):
    """image.os (and with it the head node's Slurm build, the official AMI of that OS): ParallelCluster updates
    no cluster to another OS, so the custom resource's update fails and CloudFormation rolls back. docs/deploy.md
    ("Another OS or ParallelCluster release") gives the way: destroy the cluster stack, deploy it again."""
    result = patches[f"os-change-fleet-{fleet}"]
    assert ["Image.Os", "UNSUPPORTED"] in result["changes"], result["changes"]
    assert not result["allowed"]


def test_the_idle_time_deploys_once_the_compute_fleet_is_stopped(patches):
    """cluster.scaledown_idle_minutes is ScaledownIdletime, which ParallelCluster changes with the fleet stopped
    only (docs/deploy.md, "Queue changes", gives the commands)."""
    running, stopped = patches["idle-time-fleet-running"], patches["idle-time-fleet-stopped"]
    assert running["changes"] == stopped["changes"] == [["Scheduling.SlurmSettings.ScaledownIdletime",
                                                         "COMPUTE_FLEET_STOP"]]
    assert (running["allowed"], stopped["allowed"]) == (False, True)


def test_asset_hashes_reach_the_cluster_config_only_as_the_update_action_bundle_id(synth):
    config = cluster_config(synth)
    text = repr(config)
    hashes = set(re.findall(r"[0-9a-f]{64}", text))
    assert hashes == {config["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"][2]}


# --- the image: tags, OS, AMI -----------------------------------------------------------------------

def packer_ami_tags(variables: dict[str, str]) -> dict[str, str]:
    """The AMI tags as gpu-image.pkr.hcl writes them: `tags = merge(local.build_tags, {...})`."""
    text = PACKER_TEMPLATE.read_text()
    block = re.search(r"\n  tags = merge\(local\.build_tags, \{\n(.*?)\n  \}\)", text, re.S)
    assert block, "tags block not found in gpu-image.pkr.hcl"
    build_tags = re.search(r"build_tags = \{\n(.*?)\n  \}", text, re.S)
    tags = {}
    for line in (build_tags[1] + "\n" + block[1]).splitlines():
        key, value = (part.strip() for part in line.split("=", 1))
        value = value.strip('"') if value.startswith('"') else variables[value.removeprefix("var.")]
        tags[key.strip('"')] = value
    return tags


def _packer_default(name: str) -> str:
    (value,) = re.findall(rf'variable "{name}" {{.*?default\s+=\s+"([^"]*)"', PACKER_TEMPLATE.read_text(), re.S)
    return value


@pytest.fixture(scope="module")
def image_validation(pcluster_constants) -> dict:
    variables = {"pcluster_version": _packer_default("pcluster_version"), "build_tag": "scdino"}
    written = {os_name: packer_ami_tags({**variables, "os": os_name}) for os_name in SUPPORTED_OSES}
    without_status = {key: value for key, value in written["alinux2023"].items()
                      if key != "parallelcluster:build_status"}
    return run_pcluster({
        "ami_tags": {**written, "without-build-status": without_status},
        "os_ami": {**{f"{os_name}-official": [os_name, ""] for os_name in (*SUPPORTED_OSES, *REFUSED_OSES)}},
        "cluster_names": [build_settings({"prefix": "a" * 31, "cluster.name": "b" * 28}).cluster_name],
    })


@pytest.mark.parametrize("os_name", SUPPORTED_OSES)
def test_the_pipeline_ami_passes_custom_ami_tag_validation(image_validation, os_name):
    assert image_validation["ami_tags"][os_name] == []


def test_the_tag_validator_really_rejects_an_ami_without_build_status(image_validation):
    (failure,) = image_validation["ami_tags"]["without-build-status"]
    assert failure[0] == "ERROR"


def test_packer_base_version_is_the_cluster_version():
    from stacks.shared.settings import PCLUSTER_VERSION

    assert _packer_default("pcluster_version") == PCLUSTER_VERSION


def test_the_checking_code_is_the_deployed_version(pcluster_constants):
    """The version whose code validates the configuration is the one the provider template deploys."""
    from stacks.shared.settings import PCLUSTER_VERSION

    (pinned,) = re.findall(r"^aws-parallelcluster==(\S+)$", (REPO_ROOT / "requirements-pcluster.txt").read_text(),
                           flags=re.M)
    assert pinned == PCLUSTER_VERSION == pcluster_constants["installed_version"]


def test_every_allowed_os_has_an_official_ami_and_the_refused_ones_do_not(image_validation, pcluster_constants):
    for os_name in SUPPORTED_OSES:
        assert os_name in pcluster_constants["SUPPORTED_OSES"]
        assert image_validation["os_ami"][f"{os_name}-official"] == []
    assert [level for level, _ in image_validation["os_ami"]["rocky9-official"]] == ["ERROR"]
    assert "rocky9" in pcluster_constants["PRIVATE_OSES"]
    # The refused oses are ones ParallelCluster accepts (settings.REFUSED_OSES); ubuntu2404 even has an
    # official AMI: it is refused for this project's reason (no python3.11), not ParallelCluster's.
    assert set(REFUSED_OSES) <= set(pcluster_constants["SUPPORTED_OSES"])
    assert image_validation["os_ami"]["ubuntu2404-official"] == []


def test_the_longest_cluster_name_settings_allow_passes_parallelcluster(image_validation, pcluster_constants):
    (name,) = image_validation["cluster_names"]
    assert len(name) == pcluster_constants["PCLUSTER_NAME_MAX_LENGTH"]
    assert image_validation["cluster_names"][name] == []
    with pytest.raises(SettingsError, match="^setting cluster.name: the cluster name .* longer than 60"):
        build_settings({"prefix": "a" * 31, "cluster.name": "b" * 29})


# --- capacity and queue options (off by default) --------------------------------------------------

OPTIONS = {
    "on-demand-reservation": {"cluster.presets": "p5.48xlarge", "cluster.capacity_reservation_id": "cr-0123456789abcdef0"},
    "capacity-block": {"cluster.presets": "p5.48xlarge", "cluster.capacity_type": "CAPACITY_BLOCK",
                       "cluster.capacity_reservation_id": "cr-0123456789abcdef0", "cluster.min_nodes": 2},
    "gpu-health-checks": {"cluster.gpu_health_checks": "true"},
    "cpu-spot-queue": {"cluster.cpu_spot_instance_type": "c6i.8xlarge", "cluster.cpu_spot_max_nodes": 8},
    "login-nodes": {"cluster.login_nodes": 2},
    "spot-gpu": {"cluster.capacity_type": "SPOT"},
}


def _option_config(layer: dict) -> dict:
    return build_cluster_config(build_settings(layer), REFS)


@pytest.fixture(scope="module")
def option_checks() -> dict:
    configs = {label: _option_config(layer) for label, layer in OPTIONS.items()}
    unequal_block = _option_config(OPTIONS["capacity-block"])
    unequal_block["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["MinCount"] = 1
    return run_pcluster({"schema": configs, "queues": {**configs, "capacity-block-min-below-max": unequal_block}})


@pytest.mark.parametrize("label", sorted(OPTIONS))
def test_each_option_passes_parallelcluster_schema_and_queue_validators(option_checks, label):
    assert option_checks["schema"][label] == []
    assert not [message for level, message in option_checks["queues"][label] if level == "ERROR"]


def test_the_queue_validators_really_reject_a_capacity_block_below_its_size(option_checks):
    assert [level for level, _ in option_checks["queues"]["capacity-block-min-below-max"]] == ["ERROR"]


def test_a_reservation_targets_the_gpu_nodes_and_decides_their_placement():
    for label in ("on-demand-reservation", "capacity-block"):
        (queue,) = _option_config(OPTIONS[label])["Scheduling"]["SlurmQueues"]
        assert queue["ComputeResources"][0]["CapacityReservationTarget"] == {
            "CapacityReservationId": "cr-0123456789abcdef0"}
        assert queue["Networking"]["PlacementGroup"] == {"Enabled": False}
    (block,) = _option_config(OPTIONS["capacity-block"])["Scheduling"]["SlurmQueues"]
    assert block["CapacityType"] == "CAPACITY_BLOCK"


def test_a_capacity_block_queue_has_every_field_parallelcluster_asks_of_it():
    """ParallelCluster's "Launch instances with Capacity Blocks (CB)": the queue's CapacityType CAPACITY_BLOCK,
    the compute resource's CapacityReservationTarget with the block's id and the block's InstanceType, MinCount
    equal to MaxCount and above 0 (every node of a block is static)."""
    (queue,) = _option_config(OPTIONS["capacity-block"])["Scheduling"]["SlurmQueues"]
    (resource,) = queue["ComputeResources"]
    assert queue["CapacityType"] == "CAPACITY_BLOCK"
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert resource["InstanceType"] == "p5.48xlarge"
    assert resource["MinCount"] == resource["MaxCount"] == 2
    with pytest.raises(SettingsError, match="^setting cluster.max_nodes: must be >= 1"):
        build_settings({**OPTIONS["capacity-block"], "cluster.min_nodes": 0, "cluster.max_nodes": 0})


def test_options_are_off_by_default():
    config = _option_config({})
    (queue,) = config["Scheduling"]["SlurmQueues"]
    assert queue["CapacityType"] == "ONDEMAND" and "HealthChecks" not in queue
    assert "CapacityReservationTarget" not in queue["ComputeResources"][0]


def test_login_nodes_are_installed_like_every_node():
    config = _option_config(OPTIONS["login-nodes"])
    (pool,) = config["LoginNodes"]["Pools"]
    assert pool["Count"] == 2 and pool["CustomActions"] == config["Scheduling"]["SlurmQueues"][0]["CustomActions"]
    assert "LoginNodes" not in _option_config({})


def test_gpu_health_checks_and_the_spot_cpu_queue():
    (gpu,) = _option_config(OPTIONS["gpu-health-checks"])["Scheduling"]["SlurmQueues"]
    assert gpu["HealthChecks"] == {"Gpu": {"Enabled": True}}
    gpu, cpu = _option_config(OPTIONS["cpu-spot-queue"])["Scheduling"]["SlurmQueues"]
    assert (cpu["Name"], cpu["CapacityType"]) == ("cpu-spot", "SPOT") and "HealthChecks" not in cpu
    assert cpu["ComputeResources"][0]["InstanceType"] == "c6i.8xlarge" and cpu["ComputeResources"][0]["MaxCount"] == 8
    assert cpu["CustomActions"] == gpu["CustomActions"] and cpu["Iam"] == gpu["Iam"]


@pytest.mark.parametrize("layer, named", [
    ({"cluster.capacity_type": "RESERVED"}, "setting cluster.capacity_type: must be one of"),
    ({"cluster.capacity_type": "CAPACITY_BLOCK", "cluster.min_nodes": 2},
     "setting cluster.capacity_reservation_id: required when cluster.capacity_type is CAPACITY_BLOCK"),
    ({"cluster.capacity_type": "CAPACITY_BLOCK", "cluster.capacity_reservation_id": "cr-0123456789abcdef0"},
     "setting cluster.min_nodes: must equal cluster.max_nodes"),
    ({"cluster.capacity_reservation_id": "cr-0123456789abcdef0", "cluster.presets": "g4dn.12xlarge,p5.48xlarge"},
     "setting cluster.capacity_reservation_id: a reservation holds one instance type"),
    ({"cluster.cpu_spot_instance_type": "big"}, "setting cluster.cpu_spot_instance_type:"),
    ({"cluster.login_nodes": 11}, "setting cluster.login_nodes: must be 0..10"),
])
def test_capacity_settings_that_cannot_work_are_refused(layer, named):
    with pytest.raises(SettingsError) as error:
        build_settings(layer)
    assert str(error.value).startswith(named), str(error.value)


# --- Slurm accounting (off by default; the database is the user's) --------------------------------

SECRET_ARN = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:scdino-slurmdb-AbCdEf"
ACCOUNTING = {"cluster.slurm_accounting.uri": "slurmdb.example.internal:3306",
              "cluster.slurm_accounting.user_name": "slurm_admin",
              "cluster.slurm_accounting.password_secret_arn": SECRET_ARN}


@pytest.fixture(scope="module")
def accounting_checks() -> dict:
    config = _option_config(ACCOUNTING)
    named = _option_config({**ACCOUNTING, "cluster.slurm_accounting.database_name": "scdino_acct"})
    with_scheme = copy.deepcopy(config)
    with_scheme["Scheduling"]["SlurmSettings"]["Database"]["Uri"] = "mysql://slurmdb.example.internal:3306"
    longest = build_settings({**ACCOUNTING, "prefix": "a" * 20, "cluster.name": "b" * 19}).cluster_name
    return run_pcluster({
        "schema": {"accounting": config, "accounting-database-name": named},
        "accounting": {"accounting": [longest, config], "name-too-long": [longest + "c", config],
                       "uri-with-scheme": [longest, with_scheme]},
        "patches": {"turn-on-fleet-running": [_option_config({}), config],
                    "turn-on-fleet-stopped": [_option_config({}), config, False]},
    })


def test_accounting_renders_parallelclusters_database_settings():
    database = _option_config({**ACCOUNTING, "cluster.slurm_accounting.database_name": "scdino_acct"})[
        "Scheduling"]["SlurmSettings"]["Database"]
    assert database == {"Uri": "slurmdb.example.internal:3306", "UserName": "slurm_admin",
                        "PasswordSecretArn": SECRET_ARN, "DatabaseName": "scdino_acct"}
    assert "Database" not in _option_config({})["Scheduling"]["SlurmSettings"]


def test_accounting_passes_parallelclusters_schema_and_database_validators(accounting_checks, pcluster_constants):
    assert accounting_checks["schema"] == {"accounting": [], "accounting-database-name": []}
    assert accounting_checks["accounting"]["accounting"] == []
    assert [level for level, _ in accounting_checks["accounting"]["uri-with-scheme"]] == ["ERROR"]
    (failure,) = accounting_checks["accounting"]["name-too-long"]
    assert failure[0] == "ERROR" and "Slurm accounting" in failure[1]
    assert pcluster_constants["PCLUSTER_NAME_MAX_LENGTH_SLURM_ACCOUNTING"] == CLUSTER_NAME_MAX_ACCOUNTING
    with pytest.raises(SettingsError, match="^setting cluster.name: .* longer than 40 .* with Slurm accounting$"):
        build_settings({**ACCOUNTING, "prefix": "a" * 20, "cluster.name": "b" * 20})


def test_turning_accounting_on_needs_the_compute_fleet_stopped(accounting_checks):
    running, stopped = (accounting_checks["patches"][f"turn-on-fleet-{state}"] for state in ("running", "stopped"))
    assert running["changes"] == [["Scheduling.SlurmSettings.Database", "COMPUTE_FLEET_STOP"]]
    assert not running["allowed"] and stopped["allowed"]


def test_accounting_adds_no_policy_for_the_provider_to_attach():
    """ParallelCluster's head node role gets GetSecretValue on the secret from its own template, so
    the node Iam sections (and the attach rule above) stay as they are."""
    assert node_iams(_option_config(ACCOUNTING)) == node_iams(_option_config({}))
    (source,) = (REPO_ROOT / ".venv-pcluster").glob("lib/python3*/site-packages/pcluster/templates/cdk_builder_utils.py")
    grant = re.search(r'sid="AllowGettingSlurmDbSecretValue",\s*actions=\["secretsmanager:GetSecretValue"\],'
                      r'.*?resources=\[self\._config\.scheduling\.settings\.database\.password_secret_arn\]',
                      source.read_text(), re.S)
    assert grant, "ParallelCluster no longer grants the head node its Slurm database secret"


@pytest.mark.parametrize("layer, named", [
    ({"cluster.slurm_accounting.uri": "slurmdb.example.internal:3306"},
     "setting cluster.slurm_accounting.user_name: required when Slurm accounting is configured"),
    ({**ACCOUNTING, "cluster.slurm_accounting.uri": "mysql://slurmdb.example.internal:3306"},
     "setting cluster.slurm_accounting.uri: expected host:port"),
    ({**ACCOUNTING, "cluster.slurm_accounting.uri": "slurmdb.example.internal"},
     "setting cluster.slurm_accounting.uri: expected host:port"),
    ({**ACCOUNTING, "cluster.slurm_accounting.uri": "slurmdb.example.internal:70000"},
     "setting cluster.slurm_accounting.uri: expected host:port"),
    ({**ACCOUNTING, "cluster.slurm_accounting.password_secret_arn": "slurmdb-password"},
     "setting cluster.slurm_accounting.password_secret_arn: expected arn:<partition>:secretsmanager:"),
    ({**ACCOUNTING, "cluster.slurm_accounting.password_secret_arn": SECRET_ARN.replace("secretsmanager", "ssm")},
     "setting cluster.slurm_accounting.password_secret_arn: expected arn:<partition>:secretsmanager:"),
    ({**ACCOUNTING, "cluster.slurm_accounting.password_secret_arn": SECRET_ARN.replace("us-east-1", "eu-west-1")},
     "setting cluster.slurm_accounting.password_secret_arn: the secret is in eu-west-1, the cluster in us-east-1"),
    ({**ACCOUNTING, "cluster.slurm_accounting.database_name": "Slurm-DB"},
     "setting cluster.slurm_accounting.database_name: expected empty or 1..64"),
    ({"cluster.slurm_accounting.database_name": "slurm_acct"},
     "setting cluster.slurm_accounting.uri: required when Slurm accounting is configured"),
])
def test_accounting_settings_that_cannot_work_are_refused(layer, named):
    with pytest.raises(SettingsError) as error:
        build_settings(layer)
    assert str(error.value).startswith(named), str(error.value)
    assert "\n" not in str(error.value)
