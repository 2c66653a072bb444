"""Two deployments with different prefixes in one account share no physical name: every name this
app fixes (stacks, cluster, SSM parameter) carries the prefix, and the rest are left to CloudFormation."""

from __future__ import annotations

import pytest

from tests.support.cdk_synth import one

pytestmark = pytest.mark.slow

# Properties that fix a physical name, by resource type (everything else is named by CloudFormation).
NAME_PROPERTIES = {
    "AWS::SSM::Parameter": "Name", "AWS::IAM::ManagedPolicy": "ManagedPolicyName", "AWS::IAM::Role": "RoleName",
    "AWS::Logs::LogGroup": "LogGroupName", "AWS::S3::Bucket": "BucketName", "AWS::CodeBuild::Project": "Name",
    "AWS::KMS::Alias": "AliasName",
}


def physical_names(result) -> set[str]:
    names = {stack.stack_name for stack in vars(result.stacks).values()}
    names.add(one(result.json["cluster"], "Custom::PclusterCluster")["Properties"]["ClusterName"])
    for template in result.json.values():
        for resource in template["Resources"].values():
            name = resource.get("Properties", {}).get(NAME_PROPERTIES.get(resource["Type"], ""))
            if isinstance(name, str):  # a reference is a name CloudFormation made, unique per stack
                names.add(name)
    return names


def test_two_prefixes_share_no_physical_name(synth, demo_synth):
    default, demo = physical_names(synth), physical_names(demo_synth)
    assert {"/scdino/ami/gpu", "scdino-hpc"} <= default and {"/scdino-demo/ami/gpu", "scdino-demo-hpc"} <= demo
    assert default.isdisjoint(demo), default & demo


def test_the_node_data_policy_is_named_by_cloudformation_under_the_parallelcluster_path(synth):
    policy = one(synth.json["storage"], "AWS::IAM::ManagedPolicy")["Properties"]
    assert policy["Path"] == "/parallelcluster/" and "ManagedPolicyName" not in policy
