"""What a node's role may do, on both back ends: S3 actions by prefix of the data and deploy buckets, the data
bucket's refusal of every node role, and the limits on the CloudWatch agent's managed policy.

A node's role is read from the synthesised templates: ParallelCluster's from the cluster configuration
(AdditionalIamPolicies, S3Access, as ParallelCluster's code turns them into a role: tests/infra/
parallelcluster/test_pcluster_template.py) and the managed policies they name; PCS's from the role resources themselves.
`allows` is a small reading of IAM's policy evaluation (an explicit Deny wins, then any Allow; actions and
ARNs matched as ArnLike matches them), because no IAM engine runs offline: moto's checks neither NotResource
nor condition keys. It reads conditions only where a test says so (ListBucket's prefix, the metric namespace).
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import pytest

from stacks.parallelcluster.stack import AGENT_NAMESPACE
from stacks.pcs.nodes import PCS_ROLE_PATH
from stacks.shared.storage_stack import NODE_DENIED_ACTIONS, NODE_ROLE_PATHS
from tests.infra.parallelcluster.test_pcluster_template import (  # noqa: F401 (the session's renders, shared)
    REFS,
    rendered,
)
from tests.support.cdk_synth import Synth, cluster_config, exported
from tests.support.pcluster_stack import joined, policies_of_role, queue_launch_templates, resources, role_of

pytestmark = pytest.mark.slow

ACCOUNT, REGION = "111122223333", "us-east-1"
DATA = "arn:aws:s3:::DataBucketE3889A50"
"""The data bucket as `resolve` names it (a bucket's name is its logical id here)."""
AWS_MANAGED = {"AmazonSSMManagedInstanceCore", "CloudWatchAgentServerPolicy"}
"""The AWS managed policies nodes get; their documents are AWS's, not in the templates, and grant no S3 action."""
BY_PREFIX = [
    ("s3:GetObject", f"{DATA}/data/screen/plate1/A01_s1.tif", True),
    ("s3:GetObject", f"{DATA}/data/work/alice/runs/demo/report.html", True),
    ("s3:GetObject", f"{DATA}/elsewhere/notes.txt", False),
    ("s3:PutObject", f"{DATA}/data/work/alice/runs/demo/bill.json", False),
    ("s3:PutObject", f"{DATA}/data/screen/plate1/A01_s1.tif", False),
    ("s3:AbortMultipartUpload", f"{DATA}/data/work/alice/big.npy", False),
    ("s3:DeleteObject", f"{DATA}/data/screen/plate1/A01_s1.tif", False),
    ("s3:DeleteObject", f"{DATA}/data/work/alice/runs/demo/report.html", False),
    ("s3:DeleteObjectVersion", f"{DATA}/data/screen/plate1/A01_s1.tif", False),
    ("s3:PutLifecycleConfiguration", DATA, False),
    ("s3:PutBucketVersioning", DATA, False),
    ("s3:ListBucket", DATA, True),
]
"""(action, ARN, allowed) for every node role: read the data prefix, write and delete nothing in the bucket."""


def resolve(value: Any, template: dict, synth: Synth) -> Any:
    """A template value with its intrinsics resolved: a bucket's ARN is arn:aws:s3:::<logical id>, a log group's
    name its logical id, a managed policy's ARN arn:aws:iam::<account>:policy/<logical id>."""
    if isinstance(value, list):
        return [resolve(item, template, synth) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1 or not next(iter(value)).startswith(("Fn::", "Ref")):
        return {key: resolve(item, template, synth) for key, item in value.items()}
    ((name, argument),) = value.items()
    if name == "Fn::Join":
        return argument[0].join(str(resolve(part, template, synth)) for part in argument[1])
    if name == "Fn::Sub":
        return argument.replace("${AWS::Partition}", "aws").replace("${AWS::AccountId}", ACCOUNT)
    if name == "Fn::ImportValue":
        stack, found = exported(synth, value)
        return resolve(found, synth.json[stack], synth)
    if name == "Ref":
        pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}
        if argument in pseudo:
            return pseudo[argument]
        kind = template["Resources"][argument]["Type"]
        return f"arn:aws:iam::{ACCOUNT}:policy/{argument}" if kind == "AWS::IAM::ManagedPolicy" else argument
    if name == "Fn::GetAtt":
        logical_id, _attribute = argument
        kind = template["Resources"][logical_id]["Type"]
        return {"AWS::S3::Bucket": f"arn:aws:s3:::{logical_id}",
                "AWS::Logs::LogGroup": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{logical_id}:*"}.get(
                    kind, f"arn:aws:{kind}:{logical_id}")
    raise AssertionError(f"no resolution for {value}")


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    """A resource of ParallelCluster's templates as text: a joined string, or the intrinsic itself."""
    return joined(value) if isinstance(value, str) or "Fn::Join" in value else json.dumps(value)


def _matches(patterns: list[str], value: str, *, case: bool = True) -> bool:
    match = fnmatch.fnmatchcase
    return any(match(value, p) if case else match(value.lower(), p.lower()) for p in patterns)


def allows(statements: list[dict], action: str, arn: str, context: dict[str, str] | None = None) -> bool:
    """IAM's verdict on one request by these statements (identity policies of one role): explicit Deny, else
    Allow, else implicit deny. Conditions: StringEquals/StringNotEquals/StringLike on `context`'s keys."""
    verdicts = set()
    for statement in statements:
        if not _matches(_listed(statement["Action"]), action, case=False):
            continue
        in_scope = (_matches(_listed(statement["Resource"]), arn) if "Resource" in statement
                    else not _matches(_listed(statement["NotResource"]), arn))
        if in_scope and _conditions_hold(statement.get("Condition", {}), context or {}):
            verdicts.add(statement["Effect"])
    return "Deny" not in verdicts and "Allow" in verdicts


def _conditions_hold(conditions: dict, context: dict[str, str]) -> bool:
    for operator, keys in conditions.items():
        for key, expected in keys.items():
            value, expected = context.get(key), _listed(expected)
            held = {"StringEquals": value in expected, "StringNotEquals": value not in expected,
                    "StringLike": value is not None and _matches(expected, value)}[operator]
            if not held:
                return False
    return True


def _managed(arn: Any, template: dict, synth: Synth) -> list[dict]:
    """The statements of a managed policy a role names: ours from the templates; AWS's none for S3 (AWS_MANAGED)."""
    if isinstance(arn, dict) and ("Ref" in arn or "Fn::ImportValue" in arn):
        stack, reference = exported(synth, arn) if "Fn::ImportValue" in arn else ("cluster", arn)
        policy = synth.json[stack]["Resources"][reference["Ref"]]
        assert policy["Type"] == "AWS::IAM::ManagedPolicy"
        return resolve(policy["Properties"]["PolicyDocument"]["Statement"], synth.json[stack], synth)
    name = resolve(arn, template, synth).rsplit("/", 1)[-1]
    assert name in AWS_MANAGED, f"a node role gets the AWS managed {name}: say what it grants in S3"
    return []


def _s3_access(entries: list[dict], template: dict, synth: Synth) -> list[dict]:
    """ParallelCluster's S3Access entries as the statements it writes (read: s3:Get*, s3:List*)."""
    statements = []
    for entry in entries:
        assert entry["EnableWriteAccess"] is False
        bucket = f"arn:aws:s3:::{resolve(entry['BucketName'], template, synth)}"
        statements.append({"Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": [bucket, f"{bucket}/*"]})
    return statements


def parallelcluster_roles(synth: Synth) -> dict[str, list[dict]]:
    """{node: the statements its role gets from us} for the head node, each queue and each login pool."""
    config, template = cluster_config(synth), synth.json["cluster"]
    nodes = {"HeadNode": config["HeadNode"]["Iam"],
             **{queue["Name"]: queue["Iam"] for queue in config["Scheduling"]["SlurmQueues"]},
             **{pool["Name"]: pool["Iam"] for pool in config.get("LoginNodes", {}).get("Pools", [])}}
    return {node: [*[s for entry in iam["AdditionalIamPolicies"] for s in _managed(entry["Policy"], template, synth)],
                   *_s3_access(iam.get("S3Access", []), template, synth)] for node, iam in nodes.items()}


def pcs_roles(synth: Synth) -> dict[str, list[dict]]:
    """{role: its statements} for every role of the PCS cluster stack under /aws-pcs/ (the node roles)."""
    template = synth.json["cluster"]
    found = {}
    for logical_id, role in resources(template, "AWS::IAM::Role").items():
        if role["Properties"].get("Path") != PCS_ROLE_PATH:
            continue
        inline = [statement for policy in resources(template, "AWS::IAM::Policy").values()
                  if {"Ref": logical_id} in policy["Properties"]["Roles"]
                  for statement in resolve(policy["Properties"]["PolicyDocument"]["Statement"], template, synth)]
        managed = [s for arn in role["Properties"]["ManagedPolicyArns"] for s in _managed(arn, template, synth)]
        found[logical_id] = inline + managed
    assert len(found) == 2, sorted(found)
    return found


@pytest.fixture(scope="module")
def node_roles(synth, demo_synth, pcs_synth) -> dict[str, list[dict]]:
    roles = {f"parallelcluster {node}": statements for node, statements in parallelcluster_roles(synth).items()}
    roles.update({f"demo {node}": statements for node, statements in parallelcluster_roles(demo_synth).items()})
    roles.update({f"pcs {role}": statements for role, statements in pcs_roles(pcs_synth).items()})
    assert "demo login" in roles and len(roles) >= 8
    return roles


def test_every_node_role_reads_the_data_prefix_and_writes_or_deletes_nothing_in_the_bucket(node_roles):
    for node, statements in node_roles.items():
        verdicts = [(action, arn.removeprefix(DATA), allows(statements, action, arn, {"s3:prefix": "data/screen/"}))
                    for action, arn, _expected in BY_PREFIX]
        assert verdicts == [(action, arn.removeprefix(DATA), expected) for action, arn, expected in BY_PREFIX], node


def test_listing_is_confined_to_the_data_prefix(node_roles):
    for node, statements in node_roles.items():
        assert allows(statements, "s3:ListBucket", DATA, {"s3:prefix": "data/work/alice/"}), node
        assert not allows(statements, "s3:ListBucket", DATA, {"s3:prefix": "elsewhere/"}), node
        assert not allows(statements, "s3:ListBucket", DATA, {}), node  # the whole bucket


def test_nodes_read_the_deploy_bucket_and_change_nothing_in_it(node_roles, synth):
    (bucket,) = [key for key in resources(synth.json["cluster"], "AWS::S3::Bucket") if key.startswith("NodeBundle")]
    deploy = f"arn:aws:s3:::{bucket}"
    for node, statements in node_roles.items():
        assert allows(statements, "s3:GetObject", f"{deploy}/bootstrap/current.json"), node
        assert not any(allows(statements, action, f"{deploy}/bootstrap/current.json")
                       for action in ("s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion")), node


def _data_bucket_denial(synth: Synth) -> dict:
    storage = synth.json["storage"]
    (policy,) = [p for p in resources(storage, "AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == {"Ref": DATA.rsplit(":", 1)[-1]}]
    (denial,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                 if s["Effect"] == "Deny" and "aws:PrincipalArn" in json.dumps(s.get("Condition", {}))]
    return resolve(denial, storage, synth)


def test_the_data_bucket_refuses_every_node_role_a_write_or_a_deletion(synth, pcs_synth, rendered):  # noqa: F811
    """A backstop to the roles' own policies: whatever a node role is given later, the bucket refuses it."""
    denial = _data_bucket_denial(synth)
    assert denial["Principal"] == {"AWS": "*"} and sorted(denial["Action"]) == sorted(NODE_DENIED_ACTIONS)
    assert denial["Resource"] == [DATA, f"{DATA}/*"]
    patterns = denial["Condition"]["ArnLike"]["aws:PrincipalArn"]
    # The role ARNs the deploy creates: PCS's from the template, ParallelCluster's from its own rendering
    # (/parallelcluster/<cluster>/). FSx's service-linked role, which exports /fsx into the bucket, is not one.
    arns = [f"arn:aws:iam::{ACCOUNT}:role{role['Properties']['Path']}{name}"
            for name, role in resources(pcs_synth.json["cluster"], "AWS::IAM::Role").items()
            if role["Properties"].get("Path") == PCS_ROLE_PATH]
    render = rendered["every-preset-alinux2023"]
    templates = [render.template, *render.nested]
    node_roles = {name: role["Properties"]["Path"] for template in templates
                  for name, role in resources(template, "AWS::IAM::Role").items()
                  if "ec2." in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])}
    arns += [f"arn:aws:iam::{ACCOUNT}:role{path}{name}" for name, path in node_roles.items()]
    assert len(arns) >= 2 + 8 and set(node_roles.values()) == {"/parallelcluster/scdino-hpc/"}
    assert all(_matches(patterns, arn) for arn in arns), (patterns, arns)
    fsx = (f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
           "AWSServiceRoleForFSxS3Access_fs-0123456789abcdef0")
    assert not _matches(patterns, fsx)
    assert list(NODE_ROLE_PATHS) == ["/parallelcluster/", PCS_ROLE_PATH]


def test_the_agents_managed_policy_is_cut_down_to_this_clusters_namespaces_and_log_groups(synth, rendered):  # noqa: F811
    """CloudWatchAgentServerPolicy allows PutMetricData, log writes and traces everywhere (its document is AWS's:
    modelled here by its writes on "*"); with our limits a ParallelCluster node keeps only this cluster's."""
    agent = [{"Effect": "Allow", "Resource": "*", "Action": ["cloudwatch:PutMetricData", "logs:CreateLogGroup",
                                                           "logs:CreateLogStream", "logs:PutLogEvents",
                                                           "logs:PutRetentionPolicy", "xray:PutTraceSegments"]}]
    (monitoring,) = [k for k in resources(synth.json["cluster"], "AWS::Logs::LogGroup") if k.startswith("Monitoring")]
    # ParallelCluster's own group, as its rendering names it (/aws/parallelcluster/<cluster>-<timestamp>).
    (theirs,) = [group["Properties"]["LogGroupName"] for group in
                 resources(rendered["default"].template, "AWS::Logs::LogGroup").values()
                 if isinstance(group["Properties"]["LogGroupName"], str)]
    for node, statements in parallelcluster_roles(synth).items():
        role = statements + agent

        def stream(group: str) -> str:
            return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:i-0abc/training-metrics"

        assert allows(role, "logs:PutLogEvents", stream(monitoring)), node
        assert allows(role, "logs:PutLogEvents", stream(theirs)), node
        assert allows(role, "logs:CreateLogStream", stream(theirs)), node
        assert not allows(role, "logs:PutLogEvents", stream("/aws/lambda/someone-elses-function")), node
        assert not allows(role, "logs:CreateLogGroup", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/new:*"), node
        for namespace, allowed in (("scdino-hpc/GPU", True), (AGENT_NAMESPACE, True), ("AWS/Billing", False),
                                   ("scdino-other/GPU", False)):
            assert allows(role, "cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": namespace}) == allowed
        assert not allows(role, "xray:PutTraceSegments", "*"), node


def test_parallelclusters_own_rendering_gives_every_node_role_the_limits_and_no_deletion_in_our_bucket(
        rendered):  # noqa: F811
    """ParallelCluster's own policies of a node role name its buckets (its artifacts, the deploy bucket), none
    with a wildcard that would reach the data bucket."""
    data_object = "arn:aws:s3:::scdino-storage-databucket-0123456789ab/data/screen/plate1/A01_s1.tif"
    for label in ("default", "every-preset-alinux2023"):
        render = rendered[label]
        head = role_of(render.template, render.template["Resources"]["HeadNodeLaunchTemplate"])
        roles = [(render.template, head)] + [(nested, role_of(nested, template))
                                             for template, nested in queue_launch_templates(render).values()]
        assert len(roles) >= 2
        for template, role in roles:
            attached = template["Resources"][role]["Properties"]["ManagedPolicyArns"]
            assert REFS.agent_limits_policy_arn in attached, (label, role)
            assert "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy" in attached
            inline = [{**statement, "Resource": [_text(item).replace("<Ref|AWS::Partition>", "aws")
                                                 for item in _listed(statement["Resource"])]}
                      for statement in policies_of_role(template, role)]
            assert inline and not any(allows(inline, action, data_object) for action in
                                      ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObject")), (label, role)
