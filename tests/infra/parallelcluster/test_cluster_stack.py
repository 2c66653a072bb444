"""Cluster stack: the pinned ParallelCluster provider and the cluster custom resource it serves."""

from __future__ import annotations

import pytest

from stacks.shared.presets import PRESETS
from tests.support.cdk_synth import cluster_config, exported, node_pointer, one, resources

pytestmark = pytest.mark.slow


def test_provider_is_the_pinned_parallelcluster_custom_resource_template(synth):
    provider = one(synth.json["cluster"], "AWS::CloudFormation::Stack")["Properties"]
    url, variables = provider["TemplateURL"]["Fn::Sub"]
    assert url.endswith("/parallelcluster/${Version}/templates/custom_resource/cluster.yaml")
    assert variables == {"Version": "3.16.1"}


def test_cluster_resource_properties(synth):
    cluster = one(synth.json["cluster"], "Custom::PclusterCluster")["Properties"]
    assert cluster["ServiceToken"] == {"Fn::GetAtt": ["PclusterProvider", "Outputs.ServiceToken"]}
    assert cluster["ClusterName"] == "scdino-hpc"
    assert cluster["DeletionPolicy"] == "Delete"
    assert set(cluster) == {"ServiceToken", "ClusterName", "ClusterConfiguration", "DeletionPolicy"}


def _imported(synth, value) -> tuple[str, str]:
    """(stack, logical id) of the resource a cross-stack reference names (Ref or GetAtt of an export)."""
    stack, output = exported(synth, value)
    return stack, output["Ref"] if "Ref" in output else output["Fn::GetAtt"][0]


def _logical_id(stack, construct) -> tuple[str, str]:
    """(stack, logical id) of a construct of the app, from the stack object (not from the cluster config)."""
    return stack.stack_name.rsplit("-", 1)[1], stack.get_logical_id(construct.node.default_child)


def test_configuration_references_other_stacks(synth):
    config = cluster_config(synth)
    network, storage = synth.stacks.network, synth.stacks.storage
    head = config["HeadNode"]
    assert "Fn::ImportValue" in head["Networking"]["SubnetId"]
    fsx = config["SharedStorage"][0]
    assert fsx["MountDir"] == "/fsx" and "DataFileSystem" in str(fsx["FsxLustreSettings"]["FileSystemId"])
    assert "ClusterDataAccessPolicy" in str(head["Iam"]["AdditionalIamPolicies"][0]["Policy"])
    # Each reference names the right resource: the private subnet, the cluster's (not FSx's) group.
    private_subnet = _logical_id(network, network.private_subnet)
    cluster_group = _logical_id(network, network.cluster_security_group)
    queue = config["Scheduling"]["SlurmQueues"][0]
    assert _imported(synth, head["Networking"]["SubnetId"]) == private_subnet
    assert [_imported(synth, subnet) for subnet in queue["Networking"]["SubnetIds"]] == [private_subnet]
    for networking in (head["Networking"], queue["Networking"]):
        assert [_imported(synth, group) for group in networking["AdditionalSecurityGroups"]] == [cluster_group]
    assert _imported(synth, fsx["FsxLustreSettings"]["FileSystemId"]) == _logical_id(storage, storage.file_system)
    assert _imported(synth, head["Iam"]["AdditionalIamPolicies"][0]["Policy"]) == _logical_id(
        storage, storage.data_policy)


def test_default_queue_has_efa_placement_group_and_scratch(synth):
    (queue,) = cluster_config(synth)["Scheduling"]["SlurmQueues"]
    assert queue["Name"] == "gpu-g4dn12xl"
    (resource,) = queue["ComputeResources"]
    assert resource["InstanceType"] == "g4dn.12xlarge" and resource["Efa"] == {"Enabled": True}
    assert (resource["MinCount"], resource["MaxCount"]) == (0, 2)
    assert queue["Networking"]["PlacementGroup"] == {"Enabled": True}
    assert queue["ComputeSettings"]["LocalStorage"]["EphemeralVolume"] == {"MountDir": "/scratch"}


def test_official_ami_by_default_and_pipeline_ami_when_asked(synth, demo_synth):
    """The pipeline's AMI goes to the queues (updatable), never to the cluster-wide Image (not)."""
    config = cluster_config(synth)
    assert config["Image"] == {"Os": "alinux2023"}
    assert not [queue for queue in config["Scheduling"]["SlurmQueues"] if "Image" in queue]
    parameters = demo_synth.json["cluster"]["Parameters"]
    (name,) = [key for key, value in parameters.items() if value.get("Default") == "/scdino-demo/ami/gpu"]
    demo = cluster_config(demo_synth)
    assert set(demo["Image"]) == {"Os"} and len(demo["Scheduling"]["SlurmQueues"]) == 3
    for queue in demo["Scheduling"]["SlurmQueues"]:
        assert queue["Image"] == {"CustomAmi": {"Ref": name}}
    assert parameters[name]["Type"] == "AWS::SSM::Parameter::Value<String>"
    assert parameters[name]["Default"] == one(demo_synth.json["image"], "AWS::SSM::Parameter")["Properties"]["Name"]


def _s3_uri(value) -> tuple[str, str]:
    """(bucket logical id, key) of an s3:// URI built as Fn::Join."""
    scheme, bucket, key = value["Fn::Join"][1]
    assert scheme == "s3://"
    return bucket["Ref"], key


def test_node_actions_name_only_fixed_keys_of_the_deploy_bucket(synth):
    config = cluster_config(synth)
    head_actions = config["HeadNode"]["CustomActions"]
    assert set(head_actions) == {"OnNodeConfigured", "OnNodeUpdated"}
    action = head_actions["OnNodeConfigured"]
    bucket, script_key = _s3_uri(action["Script"])
    pointer, install_dir = action["Args"]
    assert bucket.startswith("NodeBundleBucket") and script_key == "/bootstrap/on-node-configured.sh"
    assert _s3_uri(pointer) == (bucket, "/bootstrap/current.json") and install_dir == "/apps/scdino"
    updated = head_actions["OnNodeUpdated"]
    assert updated["Script"] == action["Script"] and updated["Args"][:2] == action["Args"]
    assert config["Scheduling"]["SlurmQueues"][0]["CustomActions"] == {"OnNodeConfigured": action}


def _deployments(synth) -> dict[str, dict]:
    return {props["DestinationBucketKeyPrefix"]: props for props in (
        resource["Properties"] for resource in resources(synth.json["cluster"], "Custom::CDKBucketDeployment").values())}


def test_deploy_writes_the_script_and_a_pointer_to_the_bundle_it_copies(synth):
    deployments = _deployments(synth)
    assert set(deployments) == {"bootstrap/", "bundles/"}
    bundles, bootstrap = deployments["bundles/"], deployments["bootstrap/"]
    # Bundles stay zipped and are never pruned (a node may still read the previous pointer).
    assert (bundles["Extract"], bundles["Prune"]) == (False, False)
    (marker,) = [m for m in bootstrap["SourceMarkers"] if m]
    uri = next(iter(marker.values()))["Fn::Join"][1]
    assert uri[1]["Ref"].startswith("NodeBundleBucket")
    assert uri[3] == {"Fn::Select": [0, {"Fn::GetAtt": [_deployment_id(synth, "bundles/"), "SourceObjectKeys"]}]}
    bundle_id = cluster_config(synth)["HeadNode"]["CustomActions"]["OnNodeUpdated"]["Args"][2]
    assert bundles["SourceObjectKeys"] == [f"{bundle_id}.zip"]
    assert _deployment_id(synth, "bootstrap/") in one(synth.json["cluster"], "Custom::PclusterCluster")["DependsOn"]


@pytest.mark.parametrize("fixture", ["synth", "demo_synth"])
def test_the_pointer_tells_the_nodes_each_gpu_queue_in_order_the_default_first(request, fixture):
    """What the nodes render for slurm/env.sh is the configuration's own GPU queues, in its order: the first is
    ParallelCluster's default partition (its rule), where `sbatch` without --partition goes."""
    synth = request.getfixturevalue(fixture)
    queues = [queue for queue in cluster_config(synth)["Scheduling"]["SlurmQueues"] if queue["Name"].startswith("gpu-")]
    expected = []
    for queue in queues:
        (resource,) = queue["ComputeResources"]
        preset = PRESETS[resource["InstanceType"]]
        expected.append({"instance_type": preset.instance_type, "queue": queue["Name"],
                         "gpus_per_node": preset.gpus_per_node, "cpus_per_gpu": preset.vcpus // preset.gpus_per_node})
    pointer = node_pointer(synth)
    assert pointer["cluster"] == {"presets": expected} and len(expected) == (3 if fixture == "demo_synth" else 1)
    # "rest": the head node's Slurm REST API (tests/infra/shared/test_rest_api.py)
    assert pointer["bundle"] == "<deploy>" and set(pointer) == {"bundle", "id", "monitoring", "cluster", "rest"}


def _deployment_id(synth, prefix: str) -> str:
    (logical_id,) = [key for key, value in resources(synth.json["cluster"], "Custom::CDKBucketDeployment").items()
                     if value["Properties"]["DestinationBucketKeyPrefix"] == prefix]
    return logical_id


def test_nodes_read_only_the_deploy_bucket(synth):
    (access,) = cluster_config(synth)["HeadNode"]["Iam"]["S3Access"]
    assert access["EnableWriteAccess"] is False and access["BucketName"]["Ref"].startswith("NodeBundleBucket")


def test_outputs_give_name_head_node_and_connect_command(synth):
    outputs = synth.json["cluster"]["Outputs"]
    assert outputs["ClusterName"]["Value"] == "scdino-hpc"
    assert outputs["HeadNodeInstanceId"]["Value"] == {"Fn::GetAtt": ["Cluster", "headNode.instanceId"]}
    parts = outputs["ConnectCommand"]["Value"]["Fn::Join"][1]
    assert parts[0] == "aws ssm start-session --region us-east-1 --target " and parts[-1] == {
        "Fn::GetAtt": ["Cluster", "headNode.instanceId"]}


def test_every_preset_becomes_a_queue_in_the_demo(demo_synth):
    queues = cluster_config(demo_synth)["Scheduling"]["SlurmQueues"]
    assert [q["Name"] for q in queues] == ["gpu-g4dn12xl", "gpu-p4d24xl", "gpu-p548xl"]
    assert {q["ComputeResources"][0]["MinCount"] for q in queues} == {1}
    assert not resources(demo_synth.json["cluster"], "AWS::EC2::Instance")


def test_cluster_stack_owns_the_nat_route_and_waits_for_it(synth):
    template = synth.json["cluster"]
    network = synth.stacks.network
    gateway = one(template, "AWS::EC2::NatGateway")["Properties"]
    assert "VpcPublicSubnet" in str(gateway["SubnetId"])
    assert _imported(synth, gateway["SubnetId"]) == _logical_id(network, network.public_subnet)
    (route_id,) = resources(template, "AWS::EC2::Route")
    route = template["Resources"][route_id]["Properties"]
    assert route["DestinationCidrBlock"] == "0.0.0.0/0" and "VpcPrivateSubnet" in str(route["RouteTableId"])
    private_route_table = network.private_subnet.node.find_child("RouteTable")
    assert _imported(synth, route["RouteTableId"]) == ("network", network.get_logical_id(private_route_table))
    assert route_id in one(template, "Custom::PclusterCluster")["DependsOn"]


def test_bundle_asset_holds_the_code_and_nothing_else(synth):
    staged = [path for path in synth.outdir.glob("asset.*") if (path / "training").is_dir()]
    assert len(staged) == 1
    top_level = {path.name for path in staged[0].iterdir()}
    assert {"training", "slurm", "requirements.txt", "requirements-dali.txt", "pyproject.toml"} <= top_level
    assert top_level <= {"training", "slurm", "configs", "examples", "requirements.txt", "requirements-dali.txt",
                         "pyproject.toml"}
    assert not list(staged[0].rglob("__pycache__"))


def test_login_nodes_read_the_deploy_bucket_through_its_read_policy(demo_synth):
    """Login pools take no S3Access, so the managed read policy is what lets them fetch the bootstrap files."""
    config = cluster_config(demo_synth)
    bucket = config["HeadNode"]["Iam"]["S3Access"][0]["BucketName"]["Ref"]
    (pool,) = config["LoginNodes"]["Pools"]
    assert "S3Access" not in pool["Iam"]
    # The compute nodes' policies but the CloudWatch agent's (stacks/shared/monitoring.py), plus one: the
    # deploy bucket's read policy.
    compute = [entry for entry in config["Scheduling"]["SlurmQueues"][0]["Iam"]["AdditionalIamPolicies"]
               if not str(entry["Policy"]).endswith(":iam::aws:policy/CloudWatchAgentServerPolicy")]
    (reference,) = [entry["Policy"] for entry in pool["Iam"]["AdditionalIamPolicies"] if entry not in compute]
    assert [entry for entry in pool["Iam"]["AdditionalIamPolicies"] if entry in compute] == compute
    policy = demo_synth.json["cluster"]["Resources"][reference["Ref"]]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert [(s["Effect"], s["Action"], s["Resource"]) for s in statements] == [
        ("Allow", "s3:GetObject", {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/*"]]}),
        ("Allow", "s3:ListBucket", {"Fn::GetAtt": [bucket, "Arn"]})]


def test_the_deploy_handler_logs_to_a_group_that_goes_with_the_stack(synth):
    """No CDK-named /aws/lambda/<handler> group (retained, and racing the handler on a first deploy,
    aws/aws-cdk#34612): the handler's LoggingConfig names a CloudFormation-named group that is
    created before it (a Ref is a dependency) and deleted with the stack."""
    template = synth.json["cluster"]
    groups = resources(template, "AWS::Logs::LogGroup")
    assert all("LogGroupName" not in group["Properties"] for group in groups.values())
    (handler,) = [fn for name, fn in resources(template, "AWS::Lambda::Function").items()
                  if name.startswith("CustomCDKBucketDeployment")]
    target = handler["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    assert groups[target]["DeletionPolicy"] == groups[target]["UpdateReplacePolicy"] == "Delete"
    assert groups[target]["Properties"]["RetentionInDays"] == 30
    deployments = resources(template, "Custom::CDKBucketDeployment")
    assert len(deployments) == 2  # both copies run through that one handler
