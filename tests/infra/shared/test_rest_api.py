"""The Slurm REST API each back end's cluster stack turns on for `python -m training remote`
(stacks/shared/rest_api.py): PCS's managed one and the read grant of its JWT key, ParallelCluster's token
secret with the head node's write policy and the laptop's read policy, and the pointer's settings the head
node's bootstrap reads. ParallelCluster's own rendering of the head node's role is in
test_pcluster_template.py (test_only_the_head_node_may_write_the_rest_api_token)."""

from __future__ import annotations

import json

import pytest

from stacks.shared.rest_api import REST_PORT, TOKEN_LIFESPAN_SECONDS, TOKEN_RENEW_MINUTES
from tests.support.cdk_synth import cluster_config, node_pointer, one, resources, synthesize

pytestmark = pytest.mark.slow


def _policy_named(template: dict, prefix: str) -> dict:
    (policy,) = [value for key, value in resources(template, "AWS::IAM::ManagedPolicy").items() if key.startswith(prefix)]
    return policy["Properties"]


def _ref(value) -> str:
    return json.dumps(value, sort_keys=True)


def test_pcs_turns_on_its_managed_rest_api_and_grants_reading_this_cluster_s_key_only(pcs_synth):
    cluster_template = pcs_synth.json["cluster"]
    (cluster_id, cluster) = next(iter(resources(cluster_template, "AWS::PCS::Cluster").items()))
    assert cluster["Properties"]["Scheduler"]["Version"] >= "25.05"
    assert cluster["Properties"]["SlurmConfiguration"]["SlurmRest"] == {"Mode": "STANDARD"}
    statements = _policy_named(cluster_template, "RestClient")["PolicyDocument"]["Statement"]
    by_action = {json.dumps(statement["Action"]): statement for statement in statements}
    key = by_action['"secretsmanager:GetSecretValue"']
    assert key["Resource"]["Fn::Join"][1][-1].endswith(":secret:pcs!*")
    assert _ref(key["Condition"]["StringEquals"]["secretsmanager:ResourceTag/aws:pcs:cluster-id"]) == \
        _ref({"Fn::GetAtt": [cluster_id, "Id"]}), "the key of this cluster, by the tag PCS puts on its secrets"
    assert _ref(by_action['"pcs:GetCluster"']["Resource"]) == _ref({"Fn::GetAtt": [cluster_id, "Arn"]})
    sessions = [statement for statement in statements if statement["Action"] == "ssm:StartSession"]
    assert any("AWS-StartPortForwardingSessionToRemoteHost" in _ref(statement["Resource"]) for statement in sessions)
    login = [statement for statement in sessions if "Condition" in statement]
    assert login and list(login[0]["Condition"]["StringEquals"].values()) == ["scdino-hpc/login"]
    assert "RestClientPolicyArn" in cluster_template["Outputs"]


def test_a_pcs_slurm_release_before_25_05_has_no_rest_api(tmp_path):
    older = synthesize(tmp_path, {"backend": "pcs", "image.pcs_slurm_version": "24.11"})
    cluster_template = older.json["cluster"]
    assert "SlurmRest" not in one(cluster_template, "AWS::PCS::Cluster")["Properties"]["SlurmConfiguration"]
    assert "RestClientPolicyArn" not in cluster_template["Outputs"]
    assert not [key for key in resources(cluster_template, "AWS::IAM::ManagedPolicy") if key.startswith("RestClient")]


def test_parallelcluster_s_head_node_writes_the_token_and_the_laptop_reads_it(synth):
    cluster_template = synth.json["cluster"]
    (secret_id,) = resources(cluster_template, "AWS::SecretsManager::Secret")
    write = _policy_named(cluster_template, "RestApiWritePolicy")
    assert write["Path"] == "/parallelcluster/", "so that ParallelCluster's provider may attach it to the head node"
    assert write["PolicyDocument"]["Statement"] == [{"Action": "secretsmanager:PutSecretValue", "Effect": "Allow",
                                                     "Resource": {"Ref": secret_id}}]
    client = _policy_named(cluster_template, "RestApiClientPolicy")["PolicyDocument"]["Statement"]
    assert {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": {"Ref": secret_id}} in client
    assert any("AWS-StartPortForwardingSession" in _ref(statement["Resource"]) for statement in client)

    config = cluster_config(synth)
    head = [entry["Policy"] for entry in config["HeadNode"]["Iam"]["AdditionalIamPolicies"]]
    others = [entry["Policy"] for queue in config["Scheduling"]["SlurmQueues"]
              for entry in queue["Iam"]["AdditionalIamPolicies"]]
    write_ref = [ref for ref in head if "RestApiWritePolicy" in _ref(ref)]
    assert len(write_ref) == 1 and write_ref[0] not in others

    rest = node_pointer(synth)["rest"]
    assert rest["token_secret"] == "<deploy>", "the secret's ARN, which the deploy puts in place of CDK's marker"
    (bootstrap,) = [value["Properties"] for value in resources(cluster_template, "Custom::CDKBucketDeployment").values()
                    if value["Properties"]["DestinationBucketKeyPrefix"] == "bootstrap/"]
    assert _ref({"Ref": secret_id}) in _ref(bootstrap.get("SourceMarkers"))
    assert (rest["user"], rest["port"], rest["renew_minutes"], rest["lifespan_seconds"]) == \
        ("ec2-user", REST_PORT, TOKEN_RENEW_MINUTES, TOKEN_LIFESPAN_SECONDS)
    assert {"RestTokenSecretArn", "RestClientPolicyArn"} <= set(cluster_template["Outputs"])
