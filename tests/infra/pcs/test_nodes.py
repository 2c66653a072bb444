"""What a PCS node is launched with (stacks/pcs/nodes.py), each construct alone in a bare stack: the node role and
instance profile, and the launch template. The whole app's PCS stack is tested in test_pcs_stack.py."""

from __future__ import annotations

import email
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Match, Template

from stacks.pcs.config import COMPUTE_NODE, LOGIN_NODE, MIME_BOUNDARY, NodeGroupSpec, mime_user_data, node_script
from stacks.pcs.nodes import PCS_ROLE_PATH, ROOT_DEVICES, NodeLaunchTemplate, PcsNodeProfile
from stacks.pcs.stack import read_node_script
from stacks.shared.constants import NODE_GROUP_TAG
from stacks.shared.monitoring import Monitoring

DATA_PREFIX = "data"
SUBNET = "subnet-0123456789abcdef0"
GROUPS = ["sg-0123456789abcdef0", "sg-0fedcba9876543210"]
GROUP_TAG = "probe/gpu-probe"


# --- the node role and instance profile -------------------------------------------------------------

def _profile_stack(*, gpu: bool) -> Template:
    """A PcsNodeProfile with what it needs: the cluster's ARN (a parameter), the policies the PCS stack attaches
    (a stand-in of the storage stack's data policy, read under data/ as StorageStack._data_policy is: the real
    one needs the bucket and FSx, and test_node_roles.py checks it over the whole app) and, on GPU nodes, the
    cluster's Monitoring construct."""
    stack = cdk.Stack(cdk.App(), "Probe")
    cluster_arn = cdk.CfnParameter(stack, "ClusterArn").value_as_string
    bucket_arn = cdk.CfnParameter(stack, "DataBucketArn").value_as_string
    data_policy = iam.ManagedPolicy(stack, "DataPolicy", statements=[
        iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket_arn],
                            conditions={"StringLike": {"s3:prefix": [f"{DATA_PREFIX}/*", DATA_PREFIX]}}),
        iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{DATA_PREFIX}/*"])])
    monitoring = (Monitoring(stack, "Monitoring", cluster_name="probe", log_retention_days=7, alarm_email="",
                             logs_key=kms.Key(stack, "LogsKey"), parallelcluster_dashboard=False) if gpu else None)
    PcsNodeProfile(stack, "Nodes", cluster_arn=cluster_arn, policies=[data_policy], monitoring=monitoring)
    return Template.from_stack(stack)


def _role_statements(template: Template) -> list[dict[str, Any]]:
    """Every statement the node role holds: its inline policies' and its managed policies' defined in the stack."""
    (role_id,) = template.find_resources("AWS::IAM::Role", {"Properties": {"Path": PCS_ROLE_PATH}})
    role = template.to_json()["Resources"][role_id]["Properties"]
    inline = template.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": role_id}]}})
    attached = {ref["Ref"] for ref in role["ManagedPolicyArns"] if "Ref" in ref}
    managed = {key: value for key, value in template.find_resources("AWS::IAM::ManagedPolicy").items()
               if key in attached}
    return [statement for policy in [*inline.values(), *managed.values()]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]]


def _actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else action


def test_the_role_and_profile_sit_under_the_path_pcs_passes_and_only_ec2_assumes_the_role():
    template = _profile_stack(gpu=False)
    template.resource_count_is("AWS::IAM::Role", 1)
    template.resource_count_is("AWS::IAM::InstanceProfile", 1)
    # PCS passes only roles under /aws-pcs/ (or named AWSPCS*); CloudFormation names it, so it is unique.
    template.has_resource_properties("AWS::IAM::Role", {
        "Path": PCS_ROLE_PATH, "RoleName": Match.absent(),
        "AssumeRolePolicyDocument": {"Statement": [
            {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}}]}})
    (role_id,) = template.find_resources("AWS::IAM::Role")
    template.has_resource_properties("AWS::IAM::InstanceProfile",
                                     {"Path": PCS_ROLE_PATH, "Roles": [{"Ref": role_id}]})


def test_a_node_registers_with_its_own_cluster_only():
    template = _profile_stack(gpu=True)
    statements = _role_statements(template)
    pcs = [statement for statement in statements if any(a.startswith("pcs:") for a in _actions(statement))]
    # AWS's AWSPCSComputeNodePolicy allows registering with any cluster of the account; this role, with one.
    assert pcs == [{"Action": "pcs:RegisterComputeNodeGroupInstance", "Effect": "Allow",
                    "Resource": {"Ref": "ClusterArn"}}]
    assert not [statement for statement in statements if any("*" in a for a in _actions(statement))]


def test_the_role_holds_the_policies_it_is_given_and_session_manager_and_no_aws_pcs_policy():
    template = _profile_stack(gpu=False)
    (data_policy,) = template.find_resources("AWS::IAM::ManagedPolicy")
    ssm = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/AmazonSSMManagedInstanceCore"]]}
    template.has_resource_properties("AWS::IAM::Role", {"ManagedPolicyArns": [{"Ref": data_policy}, ssm]})


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "login"])
def test_the_role_reads_the_data_prefix_and_nothing_else_of_s3(gpu):
    """What a node may do in S3 is what the policies it is given allow: the profile adds no S3 action, so a
    node role reads data/ and writes nothing (the data bucket's policy also refuses node roles any write)."""
    template = _profile_stack(gpu=gpu)
    s3 = [statement for statement in _role_statements(template)
          if any(action.startswith("s3:") for action in _actions(statement))]
    assert sorted(action for statement in s3 for action in _actions(statement)) == ["s3:GetObject", "s3:ListBucket"]
    (read,) = [statement for statement in s3 if statement["Action"] == "s3:GetObject"]
    assert read["Resource"] == {"Fn::Join": ["", [{"Ref": "DataBucketArn"}, f"/{DATA_PREFIX}/*"]]}
    (listing,) = [statement for statement in s3 if statement["Action"] == "s3:ListBucket"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{DATA_PREFIX}/*", DATA_PREFIX]}}


def test_gpu_nodes_put_metrics_into_the_cluster_s_namespace_and_lines_into_its_log_group_only():
    template = _profile_stack(gpu=True)
    template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        {"Action": "cloudwatch:PutMetricData", "Effect": "Allow", "Resource": "*",
         "Condition": {"StringEquals": {"cloudwatch:namespace": "probe/GPU"}}}])}})
    (log_group,) = template.find_resources("AWS::Logs::LogGroup")
    writes = [statement for statement in _role_statements(template)
              if any(action.startswith("logs:") for action in _actions(statement))]
    assert writes == [{"Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                       "Effect": "Allow", "Resource": {"Fn::GetAtt": [log_group, "Arn"]}}]


def test_login_nodes_put_no_metrics_and_no_log_lines():
    template = _profile_stack(gpu=False)
    assert not [statement for statement in _role_statements(template)
                if any(action.split(":")[0] in ("cloudwatch", "logs") for action in _actions(statement))]


# --- the launch template ----------------------------------------------------------------------------

def _spec(**choices: Any) -> NodeGroupSpec:
    """One GPU node group, On-Demand, no EFA, no placement group, unless `choices` says otherwise."""
    return NodeGroupSpec(**{"key": "gpu-probe", "name": "gpu-probe", "instance_type": "p4d.24xlarge", "min_count": 0,
                            "max_count": 2, "purchase_option": "ONDEMAND", "queue": "gpu-probe",
                            "node_type": COMPUTE_NODE, "gpu": True, **choices})


def _launch_template(spec: NodeGroupSpec, *, user_data: str = "#!/bin/bash\n", root_device: str = "/dev/xvda",
                     root_gib: int = 200) -> Template:
    stack = cdk.Stack(cdk.App(), "Probe")
    NodeLaunchTemplate(stack, "Launch", spec=spec, subnet_id=SUBNET, security_group_ids=GROUPS, user_data=user_data,
                       root_device=root_device, root_gib=root_gib, group_tag=GROUP_TAG)
    template = Template.from_stack(stack)
    template.resource_count_is("AWS::EC2::LaunchTemplate", 1)
    return template


def _data(template: Template) -> dict[str, Any]:
    (launch,) = template.find_resources("AWS::EC2::LaunchTemplate").values()
    return launch["Properties"]["LaunchTemplateData"]


def test_instances_answer_metadata_requests_with_a_session_token_only():
    """IMDSv2: a process that can make the node send a plain GET cannot read the role's credentials."""
    _launch_template(_spec()).has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required"}}})


@pytest.mark.parametrize("os", sorted(ROOT_DEVICES))
def test_the_root_volume_is_the_ami_s_root_device_encrypted_gp3_of_the_asked_size(os):
    template = _launch_template(_spec(), root_device=ROOT_DEVICES[os], root_gib=321)
    assert _data(template)["BlockDeviceMappings"] == [{"DeviceName": ROOT_DEVICES[os], "Ebs": {
        "VolumeSize": 321, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}]


@pytest.mark.parametrize("node_type", [COMPUTE_NODE, LOGIN_NODE])
def test_user_data_is_the_mime_node_script_that_fetches_and_runs_the_node_bootstrap(node_type):
    values = {"SCDINO_FSX_DNS": "fs-probe.fsx.us-east-1.amazonaws.com", "SCDINO_FSX_MOUNT_NAME": "probe",
              "SCDINO_REGION": "us-east-1", "SCDINO_BOOTSTRAP_URI": "s3://probe-bucket/bootstrap/on-node-configured.sh",
              "SCDINO_POINTER_URI": "s3://probe-bucket/bootstrap/current.json", "SCDINO_NODE_TYPE": node_type}
    user_data = mime_user_data(node_script(read_node_script(), values))
    template = _launch_template(_spec(node_type=node_type), user_data=user_data)
    # EC2 takes a launch template's user data base64-encoded: the construct encodes it, unchanged.
    encoded = _data(template)["UserData"]
    assert encoded == {"Fn::Base64": user_data}
    message = email.message_from_string(encoded["Fn::Base64"])
    assert message.get_content_type() == "multipart/mixed" and message.get_boundary() == MIME_BOUNDARY
    (part,) = message.get_payload()
    assert part.get_content_type() == "text/x-shellscript"
    script = part.get_payload()
    shebang, *body = read_node_script().splitlines()
    exports = [f"export {name}='{value}'" for name, value in values.items()]
    assert script.splitlines() == [shebang, *exports, *body]
    # pcs-node.sh copies the bootstrap from the deploy bucket and runs it with the bundle's pointer.
    assert '"${SCDINO_BOOTSTRAP_URI}" "${BOOTSTRAP_COPY}"' in script
    assert 'bash "${BOOTSTRAP_COPY}" "${SCDINO_POINTER_URI}"' in script


def test_instances_and_their_volumes_carry_the_node_group_tag():
    """The tag by which the connect command, the REST client's port forwards and the cost report find a group."""
    tags = [{"Key": NODE_GROUP_TAG, "Value": GROUP_TAG}, {"Key": "Name", "Value": GROUP_TAG}]
    assert _data(_launch_template(_spec()))["TagSpecifications"] == [
        {"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}]


def test_a_group_without_efa_is_in_the_security_groups_with_no_interface_and_no_placement_group():
    template = _launch_template(_spec())
    template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "SecurityGroupIds": GROUPS, "NetworkInterfaces": Match.absent(), "Placement": Match.absent(),
        "InstanceMarketOptions": Match.absent(), "CapacityReservationSpecification": Match.absent(),
        "InstanceType": Match.absent()}})


def test_an_efa_group_has_one_efa_interface_per_network_card_in_its_own_cluster_placement_group():
    template = _launch_template(_spec(efa_interfaces=4, placement_group=True))
    template.resource_count_is("AWS::EC2::PlacementGroup", 1)
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    (placement,) = template.find_resources("AWS::EC2::PlacementGroup")
    data = _data(template)
    assert data["Placement"] == {"GroupName": {"Ref": placement}}
    # With interfaces, the groups go on each interface: EC2 refuses both at once.
    assert "SecurityGroupIds" not in data
    assert data["NetworkInterfaces"] == [
        {"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card, "InterfaceType": "efa",
         "SubnetId": SUBNET, "Groups": GROUPS, "DeleteOnTermination": True} for card in range(4)]


def test_a_capacity_block_group_names_its_market_reservation_and_instance_type_and_no_placement_group():
    """PCS's guide for a Capacity Block: the market type capacity-block, the block's reservation, and its instance
    type in the launch template; the block decides placement."""
    spec = _spec(purchase_option="CAPACITY_BLOCK", capacity_reservation_id="cr-0123456789abcdef0", efa_interfaces=4)
    template = _launch_template(spec)
    template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "InstanceMarketOptions": {"MarketType": "capacity-block"}, "InstanceType": "p4d.24xlarge",
        "CapacityReservationSpecification": {
            "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}},
        "Placement": Match.absent()}})
