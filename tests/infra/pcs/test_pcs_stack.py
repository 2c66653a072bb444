"""backend=pcs: the PCS cluster stack, synthesised once with every preset (conftest's pcs_synth).

The same network, storage and image stacks; instead of ParallelCluster's custom resource, a PCS
cluster (Slurm 25.11, accounting on), one node group and queue per preset named like the
ParallelCluster partitions (so slurm/ runs unchanged), a login node group, launch templates whose
MIME user data runs bootstrap/pcs-node.sh, and instance profiles as PCS requires them."""

from __future__ import annotations

import email
import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from stacks.parallelcluster.config import ClusterRefs, build_cluster_config
from stacks.pcs.config import MIME_BOUNDARY, NodeGroupSpec, pcs_node_groups
from stacks.pcs.nodes import NODE_GROUP_TAG, NodeLaunchTemplate
from stacks.pcs.stack import NODE_SCRIPT
from stacks.shared.presets import PRESETS, SLURM_DEFAULTS
from stacks.shared.settings import SettingsError, build_settings
from tests.support.cdk_synth import exported, node_pointer, one, resources, synthesize

pytestmark = pytest.mark.slow

REFS = ClusterRefs(subnet_id="subnet-0123456789abcdef0", security_group_id="sg-0123456789abcdef0",
                   file_system_id="fs-0123456789abcdef0", data_policy_arn="arn:aws:iam::aws:policy/Placeholder",
                   deploy_bucket="deploy-bucket", bundle_id="abc123")


def _cluster(pcs_synth) -> dict:
    return pcs_synth.json["cluster"]


def _groups(pcs_synth) -> dict[str, dict]:
    return {group["Properties"]["Name"]: group["Properties"]
            for group in resources(_cluster(pcs_synth), "AWS::PCS::ComputeNodeGroup").values()}


def _queues(pcs_synth) -> dict[str, dict]:
    return {queue["Properties"]["Name"]: queue["Properties"]
            for queue in resources(_cluster(pcs_synth), "AWS::PCS::Queue").values()}


def _group_ids(pcs_synth) -> dict[str, str]:
    return {group["Properties"]["Name"]: logical_id
            for logical_id, group in resources(_cluster(pcs_synth), "AWS::PCS::ComputeNodeGroup").items()}


def _launch_data(pcs_synth, group: dict) -> dict:
    template = group["CustomLaunchTemplate"]
    logical_id = template["TemplateId"]["Ref"]
    assert template["Version"] == {"Fn::GetAtt": [logical_id, "LatestVersionNumber"]}
    return _cluster(pcs_synth)["Resources"][logical_id]["Properties"]["LaunchTemplateData"]


def _text(value, tokens: list) -> str:
    """A Fn::Join of strings and tokens as text, each token replaced by <n> (its index in `tokens`)."""
    if isinstance(value, str):
        return value
    (parts,) = [value["Fn::Join"][1]]
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        else:
            tokens.append(part)
            out.append(f"<{len(tokens) - 1}>")
    return "".join(out)


def _user_data(pcs_synth, group: dict) -> tuple[str, list]:
    tokens: list = []
    return _text(_launch_data(pcs_synth, group)["UserData"]["Fn::Base64"], tokens), tokens


# --- the cluster ------------------------------------------------------------------------------------

def test_cluster_runs_slurm_25_11_with_accounting_in_the_private_subnet_and_cluster_group(pcs_synth):
    cluster = one(_cluster(pcs_synth), "AWS::PCS::Cluster")["Properties"]
    assert cluster["Name"] == "scdino-hpc" and cluster["Size"] == "SMALL"
    assert cluster["Scheduler"] == {"Type": "SLURM", "Version": "25.11"}
    assert cluster["SlurmConfiguration"] == {"Accounting": {"Mode": "STANDARD"}, "ScaleDownIdleTimeInSeconds": 600,
                                             "SlurmRest": {"Mode": "STANDARD"}}  # the laptop's (test_rest_api.py)
    network = pcs_synth.stacks.network
    (subnet,) = cluster["Networking"]["SubnetIds"]
    (group,) = cluster["Networking"]["SecurityGroupIds"]
    assert exported(pcs_synth, subnet)[1] == {"Ref": network.get_logical_id(network.private_subnet.node.default_child)}
    assert exported(pcs_synth, group)[1]["Fn::GetAtt"][0] == network.get_logical_id(
        network.cluster_security_group.node.default_child)
    assert not resources(_cluster(pcs_synth), "Custom::PclusterCluster")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_is_a_node_group_and_queue_named_like_its_parallelcluster_partition(pcs_synth, name):
    preset = PRESETS[name]
    pcluster = build_cluster_config(build_settings({"cluster.presets": ",".join(PRESETS)}), REFS)
    partitions = [queue["Name"] for queue in pcluster["Scheduling"]["SlurmQueues"]]
    assert preset.queue_name in partitions
    group = _groups(pcs_synth)[preset.queue_name]
    assert group["InstanceConfigs"] == [{"InstanceType": name}]
    assert group["ScalingConfiguration"] == {"MinInstanceCount": 0, "MaxInstanceCount": 2}
    assert group["PurchaseOption"] == "ONDEMAND" and "SpotOptions" not in group
    assert group["SlurmConfiguration"] == {"ScaleDownIdleTimeInSeconds": 600}  # the cluster's, stated per group
    assert group["IamInstanceProfileArn"]["Fn::GetAtt"][0].startswith("ComputeNodesProfile")
    queue = _queues(pcs_synth)[preset.queue_name]
    assert queue["ComputeNodeGroupConfigurations"] == [
        {"ComputeNodeGroupId": {"Fn::GetAtt": [_group_ids(pcs_synth)[preset.queue_name], "Id"]}}]
    assert queue["ClusterId"] == group["ClusterId"] == {"Fn::GetAtt": ["Cluster", "Id"]}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_gets_an_efa_interface_per_network_card_and_a_placement_group(pcs_synth, name):
    preset = PRESETS[name]
    data = _launch_data(pcs_synth, _groups(pcs_synth)[preset.queue_name])
    interfaces = data["NetworkInterfaces"]
    assert len(interfaces) == preset.network_cards >= 1
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (card, 0 if card == 0 else 1, "efa") for card in range(preset.network_cards)]
    assert "SecurityGroupIds" not in data and len({json.dumps(i["Groups"]) for i in interfaces}) == 1
    placement = data["Placement"]["GroupName"]["Ref"]
    assert _cluster(pcs_synth)["Resources"][placement]["Properties"]["Strategy"] == "cluster"
    assert data["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpTokens": "required"}
    (root,) = data["BlockDeviceMappings"]
    assert root == {"DeviceName": "/dev/xvda", "Ebs": {"DeleteOnTermination": True, "Encrypted": True,
                                                       "VolumeSize": 200, "VolumeType": "gp3"}}


def test_the_slurm_scripts_default_partition_is_a_queue_and_every_group_boots_the_pcs_image(pcs_synth):
    assert SLURM_DEFAULTS["SCDINO_PARTITION"] in _queues(pcs_synth)
    parameters = _cluster(pcs_synth)["Parameters"]
    (name,) = [key for key, value in parameters.items() if value.get("Default") == "/scdino/ami/gpu-pcs"]
    assert parameters[name]["Type"] == "AWS::SSM::Parameter::Value<String>"
    assert {json.dumps(group["AmiId"]) for group in _groups(pcs_synth).values()} == {json.dumps({"Ref": name})}
    pcs_synth.templates["image"].has_resource_properties("AWS::SSM::Parameter", {"Name": "/scdino/ami/gpu-pcs"})


def test_the_first_preset_s_queue_is_the_default_partition_as_the_pointer_tells_the_nodes(pcs_synth):
    """`sbatch` without --partition lands in the first preset's queue, as on ParallelCluster: PCS takes the
    queue-level Default=YES; the pointer lists every GPU queue with its shape, that one first."""
    shape = node_pointer(pcs_synth)["cluster"]["presets"]
    assert [entry["instance_type"] for entry in shape] == list(PRESETS)  # conftest's order: every preset
    default = {"SlurmCustomSettings": [{"ParameterName": "Default", "ParameterValue": "YES"}]}
    queues = _queues(pcs_synth)
    assert [name for name, queue in queues.items() if queue.get("SlurmConfiguration") == default] == [shape[0]["queue"]]
    assert all("SlurmConfiguration" not in queue for name, queue in queues.items() if name != shape[0]["queue"])
    assert {entry["queue"] for entry in shape} == set(queues) - {"cpu-spot"}
    for entry in shape:
        group = _groups(pcs_synth)[entry["queue"]]
        assert group["InstanceConfigs"] == [{"InstanceType": entry["instance_type"]}]
        assert (entry["gpus_per_node"], entry["cpus_per_gpu"]) == (PRESETS[entry["instance_type"]].gpus_per_node,
                                                                   PRESETS[entry["instance_type"]].cpus_per_gpu)


def test_the_login_group_is_one_static_on_demand_node_without_a_queue(pcs_synth):
    login = _groups(pcs_synth)["login"]
    assert login["ScalingConfiguration"] == {"MinInstanceCount": 1, "MaxInstanceCount": 1}
    assert login["InstanceConfigs"] == [{"InstanceType": "c6i.xlarge"}] and login["PurchaseOption"] == "ONDEMAND"
    assert login["IamInstanceProfileArn"]["Fn::GetAtt"][0].startswith("LoginNodesProfile")
    assert "login" not in _queues(pcs_synth)
    assert "NetworkInterfaces" not in _launch_data(pcs_synth, login)
    assert "SlurmConfiguration" not in login  # static: nothing to scale down
    cpu = _groups(pcs_synth)["cpu-spot-c6i8xl"]  # named after its type, which cannot change in place
    assert cpu["PurchaseOption"] == "SPOT" and cpu["SpotOptions"] == {"AllocationStrategy": "price-capacity-optimized"}
    assert cpu["ScalingConfiguration"] == {"MinInstanceCount": 0, "MaxInstanceCount": 4} and "cpu-spot" in _queues(pcs_synth)
    assert cpu["SlurmConfiguration"] == {"ScaleDownIdleTimeInSeconds": 600}


def test_the_connect_command_finds_the_instance_the_login_template_tags(pcs_synth):
    data = _launch_data(pcs_synth, _groups(pcs_synth)["login"])
    tags = {tag["Key"]: tag["Value"] for spec in data["TagSpecifications"] for tag in spec["Tags"]}
    command = _text(_cluster(pcs_synth)["Outputs"]["ConnectCommand"]["Value"], [])
    assert f"Name=tag:{NODE_GROUP_TAG},Values={tags[NODE_GROUP_TAG]}" in command
    assert command.startswith("aws ssm start-session") and tags[NODE_GROUP_TAG] == "scdino-hpc/login"


# --- the user data ------------------------------------------------------------------------------------

@pytest.mark.parametrize("group, node_type", [("gpu-g4dn12xl", "ComputeFleet"), ("gpu-p5en48xl", "ComputeFleet"),
                                               ("cpu-spot-c6i8xl", "ComputeFleet"), ("login", "LoginNode")])
def test_user_data_is_one_mime_shell_part_running_the_node_script(pcs_synth, group, node_type):
    text, _ = _user_data(pcs_synth, _groups(pcs_synth)[group])
    assert len(text.encode()) < 16 * 1024, "EC2 takes at most 16 KB of user data"
    # PCS's rules: a blank line before each boundary and after each part's headers.
    assert f"\n\n--{MIME_BOUNDARY}\n" in text and text.endswith(f"\n\n--{MIME_BOUNDARY}--\n")
    message = email.message_from_string(text)
    assert message.get_content_type() == "multipart/mixed" and message.get_boundary() == MIME_BOUNDARY
    (part,) = message.get_payload()
    assert part.get_content_type() == "text/x-shellscript"
    script = part.get_payload()
    shebang, *lines = NODE_SCRIPT.read_text().splitlines()
    assert script.startswith(shebang + "\n") and script.rstrip("\n").endswith("\n".join(lines))
    exports = dict(line.removeprefix("export ").split("=", 1) for line in script.splitlines()
                   if line.startswith("export SCDINO_"))
    assert exports["SCDINO_NODE_TYPE"] == f"'{node_type}'" and exports["SCDINO_REGION"] == "'us-east-1'"


def test_user_data_names_this_deployment_s_file_system_and_deploy_bucket(pcs_synth):
    text, tokens = _user_data(pcs_synth, _groups(pcs_synth)["gpu-g4dn12xl"])
    exports = {line.split("=", 1)[0].removeprefix("export "): line.split("=", 1)[1].strip("'")
               for line in text.splitlines() if line.startswith("export SCDINO_")}
    storage = pcs_synth.stacks.storage
    file_system = storage.get_logical_id(storage.file_system.node.default_child)

    def token(value: str) -> dict:
        return tokens[int(value.split("<", 1)[1].split(">", 1)[0])]

    assert exported(pcs_synth, token(exports["SCDINO_FSX_DNS"]))[1] == {"Ref": file_system}
    assert exports["SCDINO_FSX_DNS"].endswith(".fsx.us-east-1.<%d>" % (tokens.index({"Ref": "AWS::URLSuffix"})))
    assert exported(pcs_synth, token(exports["SCDINO_FSX_MOUNT_NAME"]))[1] == {
        "Fn::GetAtt": [file_system, "LustreMountName"]}
    bucket = token(exports["SCDINO_BOOTSTRAP_URI"])
    assert bucket == token(exports["SCDINO_POINTER_URI"]) and bucket["Ref"].startswith("NodeBundleBucket")
    assert exports["SCDINO_BOOTSTRAP_URI"].endswith("/bootstrap/on-node-configured.sh")
    assert exports["SCDINO_POINTER_URI"].endswith("/bootstrap/current.json")


# --- what the nodes may do --------------------------------------------------------------------------

def _role_statements(pcs_synth, prefix: str) -> list[dict]:
    cluster = _cluster(pcs_synth)
    (role,) = [key for key in resources(cluster, "AWS::IAM::Role") if key.startswith(prefix)]
    return [statement for policy in resources(cluster, "AWS::IAM::Policy").values()
            if {"Ref": role} in policy["Properties"]["Roles"]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]]


@pytest.mark.parametrize("kind", ["ComputeNodes", "LoginNodes"])
def test_node_roles_are_what_pcs_accepts_and_register_with_this_cluster_only(pcs_synth, kind):
    cluster = _cluster(pcs_synth)
    (role_id, role), = [(key, value) for key, value in resources(cluster, "AWS::IAM::Role").items()
                        if key.startswith(kind)]
    props = role["Properties"]
    assert props["Path"] == "/aws-pcs/" and "RoleName" not in props
    assert props["AssumeRolePolicyDocument"]["Statement"] == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}}]
    managed = json.dumps(props["ManagedPolicyArns"])
    assert "AmazonSSMManagedInstanceCore" in managed and "NodeBundleReadPolicy" in managed
    assert "ClusterDataAccessPolicy" in managed and "AWSPCSComputeNodePolicy" not in managed
    statements = _role_statements(pcs_synth, kind)
    register = [s for s in statements if s["Action"] == "pcs:RegisterComputeNodeGroupInstance"]
    assert register == [{"Action": "pcs:RegisterComputeNodeGroupInstance", "Effect": "Allow",
                         "Resource": {"Fn::GetAtt": ["Cluster", "Arn"]}}]
    assert not [s for s in statements if "*" in json.dumps(s["Action"])]
    (profile,) = [value["Properties"] for value in resources(cluster, "AWS::IAM::InstanceProfile").values()
                  if value["Properties"]["Roles"] == [{"Ref": role_id}]]
    assert profile["Path"] == "/aws-pcs/"


def test_only_gpu_nodes_put_metrics_and_only_into_the_cluster_s_namespace_and_log_group(pcs_synth):
    compute = _role_statements(pcs_synth, "ComputeNodes")
    (metrics,) = [s for s in compute if s["Action"] == "cloudwatch:PutMetricData"]
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": "scdino-hpc/GPU"}}
    (lines,) = [s for s in compute if "logs:PutLogEvents" in s["Action"]]
    assert lines["Resource"]["Fn::GetAtt"][0].startswith("MonitoringLogs")
    login = _role_statements(pcs_synth, "LoginNodes")
    assert not [s for s in login if "cloudwatch" in json.dumps(s) or "logs:" in json.dumps(s)]


def test_nodes_reach_out_on_https_and_http_only_and_take_nothing_in(pcs_synth):
    (group,) = resources(_cluster(pcs_synth), "AWS::EC2::SecurityGroup").values()
    egress = sorted((rule["IpProtocol"], rule["FromPort"], rule["ToPort"], rule["CidrIp"])
                    for rule in group["Properties"]["SecurityGroupEgress"])
    assert egress == [("tcp", 80, 80, "0.0.0.0/0"), ("tcp", 443, 443, "0.0.0.0/0")]
    assert "SecurityGroupIngress" not in group["Properties"]


def test_node_groups_wait_for_the_route_and_the_bootstrap_files(pcs_synth):
    cluster = _cluster(pcs_synth)
    (route,) = resources(cluster, "AWS::EC2::Route")
    bootstrap = [key for key, value in resources(cluster, "Custom::CDKBucketDeployment").items()
                 if key.startswith("NodeBundleBootstrap")]
    for name, logical_id in _group_ids(pcs_synth).items():
        depends = cluster["Resources"][logical_id].get("DependsOn", [])
        assert route in depends and set(bootstrap) <= set(depends), name


def test_the_dashboard_does_not_point_at_a_parallelcluster_dashboard(pcs_synth):
    dashboard = one(_cluster(pcs_synth), "AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"]
    body = _text(dashboard, [])
    assert "AWS PCS console" in body and "ParallelCluster" not in body


# --- purchase options (pure, then one launch template each) ----------------------------------------

def _only_gpu_group(layer: dict) -> NodeGroupSpec:
    (gpu, *_) = pcs_node_groups(build_settings({"backend": "pcs", **layer}))
    return gpu


def _launch_template(spec: NodeGroupSpec) -> dict:
    stack = cdk.Stack(cdk.App(), "Probe")
    NodeLaunchTemplate(stack, "Launch", spec=spec, subnet_id="subnet-0123456789abcdef0",
                       security_group_ids=["sg-0123456789abcdef0"], user_data="#!/bin/bash\n", root_device="/dev/xvda",
                       root_gib=200, group_tag="scdino-hpc/probe")
    return one(Template.from_stack(stack).to_json(), "AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]


def test_spot_gpu_nodes_are_a_spot_group_with_their_placement_group():
    spec = _only_gpu_group({"cluster.capacity_type": "SPOT"})
    assert (spec.purchase_option, spec.placement_group, spec.capacity_reservation_id) == ("SPOT", True, "")
    data = _launch_template(spec)
    assert "Placement" in data and "InstanceMarketOptions" not in data


def test_idle_times_per_group_follow_the_settings_where_the_slurm_release_takes_them():
    layer = {"backend": "pcs", "cluster.presets": "g4dn.12xlarge,p5.48xlarge", "cluster.cpu_spot_instance_type": "c6i.8xlarge",
             "cluster.scaledown_idle_minutes": 20, "cluster.scaledown_idle_minutes_per_queue": "p5.48xlarge=4,cpu-spot=1"}
    idle = {spec.name: spec.scaledown_idle_seconds for spec in pcs_node_groups(build_settings(layer))}
    assert idle == {"gpu-g4dn12xl": 1200, "gpu-p548xl": 240, "cpu-spot-c6i8xl": 60, "login": 0}
    older = build_settings({**layer, "cluster.scaledown_idle_minutes_per_queue": "", "image.pcs_slurm_version": "25.05"})
    assert {spec.scaledown_idle_seconds for spec in pcs_node_groups(older)} == {0}  # only the cluster's applies


CAPACITY_BLOCK = {"cluster.presets": "p5.48xlarge", "cluster.capacity_type": "CAPACITY_BLOCK",
                  "cluster.capacity_reservation_id": "cr-0123456789abcdef0", "cluster.min_nodes": 2}


def test_a_capacity_block_node_group_has_every_field_pcs_asks_of_it(tmp_path):
    """PCS's "Configure an AWS PCS compute node group to use a Capacity Block": the launch template's
    InstanceMarketOptions MarketType capacity-block, a CapacityReservationSpecification with the block's id and
    an InstanceType equal to the block's; the node group's purchase option CAPACITY_BLOCK, at most the block's
    instances (min_nodes == max_nodes, the block's size). The block decides placement: no placement group."""
    result = synthesize(tmp_path, {"backend": "pcs", **CAPACITY_BLOCK})
    cluster = result.json["cluster"]
    (group,) = [g["Properties"] for g in resources(cluster, "AWS::PCS::ComputeNodeGroup").values()
                if g["Properties"]["Name"] == PRESETS["p5.48xlarge"].queue_name]
    assert group["PurchaseOption"] == "CAPACITY_BLOCK" and "SpotOptions" not in group
    assert group["InstanceConfigs"] == [{"InstanceType": "p5.48xlarge"}]
    assert group["ScalingConfiguration"] == {"MinInstanceCount": 2, "MaxInstanceCount": 2}
    data = cluster["Resources"][group["CustomLaunchTemplate"]["TemplateId"]["Ref"]]["Properties"]["LaunchTemplateData"]
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}
    assert data["InstanceType"] == "p5.48xlarge"
    assert "Placement" not in data and len(data["NetworkInterfaces"]) == 32
    # The login group is not in the block: an ordinary on-demand template, its type from the group alone.
    login = _launch_data(result, _groups(result)["login"])
    assert not {"InstanceType", "InstanceMarketOptions", "CapacityReservationSpecification"} & set(login)


@pytest.mark.parametrize("preset", ["g4dn.12xlarge", "g5.12xlarge", "g6e.12xlarge"])
def test_pcs_refuses_a_capacity_block_of_a_family_it_does_not_take(preset):
    with pytest.raises(SettingsError, match=r"^setting cluster.capacity_type: PCS takes Capacity Blocks of .* not \['"):
        build_settings({"backend": "pcs", **CAPACITY_BLOCK, "cluster.presets": preset})
    build_settings({**CAPACITY_BLOCK, "cluster.presets": preset})  # ParallelCluster leaves it to EC2


def test_an_on_demand_reservation_is_targeted_without_a_placement_group():
    spec = _only_gpu_group({"cluster.presets": "p4d.24xlarge", "cluster.capacity_reservation_id": "cr-0123456789abcdef0"})
    assert (spec.purchase_option, spec.placement_group) == ("ONDEMAND", False)
    data = _launch_template(spec)
    assert "CapacityReservationSpecification" in data and "InstanceMarketOptions" not in data
    assert "InstanceType" not in data  # an On-Demand reservation: the node group names the type
    assert "Placement" not in data and len(data["NetworkInterfaces"]) == 4
