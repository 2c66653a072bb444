"""checkov on every template a deploy creates: the synthesised templates of both back ends (and the
throw-away variant), and ParallelCluster's own cluster stack and its nested stacks as its code renders them
for our configurations (tests/support/pcluster_render.py). On ours: no failed check, and every skipped check
is one the templates explain in place, on CDK's own custom-resource handlers or on the access-log bucket that
cannot log into itself. On ParallelCluster's, which we do not write: every finding is one of
PCLUSTER_FINDINGS, each with the reason it stands and no setting of ours could change it. checkov lives in its
own virtualenv (.venv-checkov, requirements-checkov.txt): it pins a boto3 that cannot share a resolver with
requirements.txt's.

Besides checkov, what it asked for is asserted directly: every log group is encrypted with a customer key
that lets CloudWatch Logs use it and has a retention, every Lambda function logs to a group of its own stack
(none is left to create /aws/lambda/<name> with no retention), and every bucket but the access-log bucket is
versioned and logged there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stacks.shared.common import CLOUDWATCH_LOGS_KEY_ACTIONS
from tests.infra.parallelcluster.test_pcluster_template import (  # noqa: F401 (the session's renders, shared)
    LABELS,
    SETTINGS,
    rendered,
)
from tests.support.cdk_synth import REPO_ROOT, Synth, resources
from tests.support.pcluster_stack import Rendered

pytestmark = pytest.mark.slow

CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"
ACCESS_LOGS_BUCKET = "AccessLogsBucket83982689"
VARIANTS = ("synth", "pcs_synth", "demo_synth")
SECURITY_GROUPS = {"AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"}
PCLUSTER_FINDINGS = {
    "CKV_AWS_115": ({"AWS::Lambda::Function"},
                    "ParallelCluster's clean-up handlers (CleanupResources, CleanupRoute53), invoked only by "
                    "CloudFormation when the cluster stack is deleted: reserved concurrency would take capacity from "
                    "the account's pool for functions idle the rest of the cluster's life."),
    "CKV_AWS_116": ({"AWS::Lambda::Function"},
                    "ParallelCluster's clean-up handlers are custom resources: CloudFormation invokes them "
                    "asynchronously and waits for their answer at a presigned URL (AWS Lambda Developer Guide, "
                    "'Using Lambda with CloudFormation'); one that never answers fails the stack operation at the "
                    "custom resource's timeout, in the stack's events. A dead-letter queue would keep only the "
                    "request of an operation that has failed by then."),
    "CKV_AWS_117": ({"AWS::Lambda::Function"},
                    "ParallelCluster's clean-up handlers call only AWS APIs (EC2, Route 53, S3); in the VPC "
                    "(DeploymentSettings/LambdaFunctionsVpcConfig) they would reach them only through the NAT "
                    "gateway, which the cluster stack deletes in the same operation, or interface endpoints "
                    "billed every hour."),
    "CKV_AWS_119": ({"AWS::DynamoDB::Table"},
                    "ParallelCluster's state tables (the compute fleet's status, Slurm nodes to instances): DynamoDB "
                    "encrypts every table at rest with an AWS owned key, and ParallelCluster 3.16's configuration "
                    "offers no key for them."),
    "CKV_AWS_28": ({"AWS::DynamoDB::Table"},
                   "ParallelCluster's state tables describe the running cluster and are deleted with it; a "
                   "point-in-time copy would restore instance ids of nodes that no longer exist."),
    "CKV_AWS_158": ({"AWS::Logs::LogGroup"},
                    "ParallelCluster's log groups (the cluster's, its clean-up handlers'): its configuration takes "
                    "no key for them (Monitoring/Logs/CloudWatch: Enabled, RetentionInDays, DeletionPolicy); "
                    "CloudWatch Logs encrypts every log group at rest, and each has a retention (asserted here)."),
    "CKV_AWS_23": (SECURITY_GROUPS,
                   "ParallelCluster's own node security groups and rules (head node, compute, login, its load "
                   "balancer), generated without descriptions; each rule's purpose is in its logical id "
                   "(ComputeSecurityGroupHeadNodeIngress0, HeadNodeSecurityGroupLoginSlurmIngress0, ...)."),
    "CKV_AWS_91": ({"AWS::ElasticLoadBalancingV2::LoadBalancer"},
                   "the login nodes' internal Network Load Balancer listens on TCP only (asserted here): Elastic "
                   "Load Balancing writes access logs of a Network Load Balancer only for TLS listeners, so "
                   "logging would record nothing."),
}
"""checkov's findings on ParallelCluster's rendered templates -> (resource types, why each stands)."""


def _run_checkov(templates: list[Path]) -> dict:
    """checkov's JSON report on these templates; --skip-download: no call to Prisma Cloud."""
    assert CHECKOV.exists(), f"{CHECKOV} missing: run `make install`"
    command = [str(CHECKOV), "--framework", "cloudformation", "--output", "json", "--compact", "--skip-download",
               *[argument for template in templates for argument in ("--file", str(template))]]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert run.stdout.strip(), run.stderr[-3000:]
    (report,) = [json.loads(run.stdout)] if run.stdout.lstrip().startswith("{") else json.loads(run.stdout)
    return report


def _checkov(result: Synth) -> dict:
    templates = sorted(result.outdir.glob("*.template.json"))
    assert len(templates) == 4
    return _run_checkov(templates)


@pytest.fixture(scope="module", params=VARIANTS)
def checkov_report(request) -> tuple[Synth, dict]:
    result = request.getfixturevalue(request.param)
    return result, _checkov(result)


def test_checkov_finds_nothing_unexplained(checkov_report):
    _, report = checkov_report
    summary = report["summary"]
    assert summary["parsing_errors"] == 0 and summary["resource_count"] > 70
    failed = [(check["check_id"], check["resource"]) for check in report["results"]["failed_checks"]]
    assert failed == [] and summary["failed"] == 0
    assert summary["passed"] > 150


def test_only_cdk_handlers_and_the_access_log_bucket_skip_checks_each_with_its_reason(checkov_report):
    _, report = checkov_report
    skipped = report["results"].get("skipped_checks", [])
    assert skipped, "the CDK handlers' skips are expected"
    for check in skipped:
        reason = check["check_result"]["suppress_comment"]
        assert len(reason) > 40 and "No comment" not in reason, check["check_id"]
        kind, logical_id = check["resource"].split(".", 1)
        if kind == "AWS::Lambda::Function":
            # CDK names its providers' handlers Custom<provider>...: none of ours is.
            assert logical_id.startswith("Custom") and reason.startswith("CDK's"), check["resource"]
            assert check["check_id"] in {"CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117", "CKV_AWS_173"}
        elif kind == "AWS::SecretsManager::Secret":
            # The Slurm REST API's token, renewed by the head node (stacks/shared/rest_api.py): AWS's managed key.
            assert (logical_id.startswith("RestApiToken"), check["check_id"]) == (True, "CKV_AWS_149")
        else:
            assert (check["resource"], check["check_id"]) == (f"AWS::S3::Bucket.{ACCESS_LOGS_BUCKET}", "CKV_AWS_18")


def test_every_log_group_is_encrypted_with_a_key_cloudwatch_logs_may_use(checkov_report):
    result, _ = checkov_report
    for stack, template in result.json.items():
        for logical_id, group in resources(template, "AWS::Logs::LogGroup").items():
            (key_id, _arn) = group["Properties"]["KmsKeyId"]["Fn::GetAtt"]
            statements = template["Resources"][key_id]["Properties"]["KeyPolicy"]["Statement"]
            (logs,) = [s for s in statements if "logs." in json.dumps(s.get("Principal", {}))]
            assert logs["Principal"] == {"Service": f"logs.{result.stacks.network.region}.amazonaws.com"}
            assert sorted(logs["Action"]) == sorted(CLOUDWATCH_LOGS_KEY_ACTIONS)
            condition = json.dumps(logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"])
            assert ":log-group:*" in condition and "AWS::AccountId" in condition, (stack, logical_id)
            assert template["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True


def test_buckets_are_versioned_and_access_logged_into_the_storage_stack_s_log_bucket(checkov_report):
    result, _ = checkov_report
    storage = result.json["storage"]
    for stack, template in result.json.items():
        for logical_id, bucket in resources(template, "AWS::S3::Bucket").items():
            props = bucket["Properties"]
            assert props["VersioningConfiguration"] == {"Status": "Enabled"}, (stack, logical_id)
            assert any("NoncurrentVersionExpiration" in rule for rule in props["LifecycleConfiguration"]["Rules"])
            if logical_id == ACCESS_LOGS_BUCKET:
                continue
            target = props["LoggingConfiguration"]["DestinationBucketName"]
            if stack != "storage":
                assert "Fn::ImportValue" in target, (stack, logical_id)
                target = [output["Value"] for output in storage["Outputs"].values()
                          if output.get("Export", {}).get("Name") == target["Fn::ImportValue"]][0]
            assert target == {"Ref": ACCESS_LOGS_BUCKET}, (stack, logical_id)
    # S3's log delivery may write each bucket's logs under its own prefix only.
    (policy,) = [policy for policy in resources(storage, "AWS::S3::BucketPolicy").values()
                 if policy["Properties"]["Bucket"] == {"Ref": ACCESS_LOGS_BUCKET}]
    delivery = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                if s.get("Principal") == {"Service": "logging.s3.amazonaws.com"}]
    prefixes = sorted(json.dumps(s["Resource"]).split('"/')[-1].split('"')[0] for s in delivery)
    assert prefixes == ["data-bucket/*", "deploy-bucket/*"]
    assert all(s["Action"] == "s3:PutObject" and "aws:SourceAccount" in s["Condition"]["StringEquals"]
               for s in delivery)


def test_every_log_group_has_a_retention_and_every_function_logs_to_one_of_its_stack(checkov_report):
    """What a destroy leaves: a function without a LoggingConfig gets /aws/lambda/<name> from Lambda at its
    first invocation, never expiring and outside any stack; so each one (CDK's handlers included) names a
    group of its own template, which the template gives a retention."""
    result, _ = checkov_report
    for stack, template in result.json.items():
        groups = resources(template, "AWS::Logs::LogGroup")
        for logical_id, group in groups.items():
            assert group["Properties"]["RetentionInDays"] > 0, (stack, logical_id)
        for logical_id, function in resources(template, "AWS::Lambda::Function").items():
            target = function["Properties"].get("LoggingConfig", {}).get("LogGroup", {})
            assert target.get("Ref") in groups, f"{stack}: {logical_id} logs to no group of its stack"


@pytest.fixture(scope="module")
def pcluster_report(rendered) -> tuple[dict[str, Rendered], dict]:  # noqa: F811 (the imported fixture)
    templates = [path for label in LABELS for path in rendered[label].template_files()]
    assert len(templates) >= 2 * len(LABELS)  # the cluster stack and its nested stacks, per render
    return rendered, _run_checkov(templates)


def test_checkov_on_parallelclusters_rendered_stacks_finds_only_what_pcluster_findings_explain(pcluster_report):
    _, report = pcluster_report
    summary = report["summary"]
    assert summary["parsing_errors"] == 0 and summary["resource_count"] > 300 and summary["passed"] > 1000
    unexplained, seen = [], set()
    for check in report["results"]["failed_checks"]:
        kind = check["resource"].split(".", 1)[0]
        types, _reason = PCLUSTER_FINDINGS.get(check["check_id"], (set(), ""))
        if kind in types:
            seen.add(check["check_id"])
        else:
            unexplained.append(f"{check['check_id']} {check['resource']} ({check['file_path']}): {check['check_name']}")
    assert not unexplained, "\n".join(unexplained)
    assert seen == set(PCLUSTER_FINDINGS), f"reasons for findings checkov no longer reports: {set(PCLUSTER_FINDINGS) - seen}"
    assert all(len(reason) > 80 for _types, reason in PCLUSTER_FINDINGS.values())


def test_what_the_reasons_for_parallelclusters_findings_rest_on(pcluster_report):
    """The facts PCLUSTER_FINDINGS cite that the renders hold: the login load balancer's listeners are TCP
    (no TLS, so no access log), and every log group ParallelCluster creates has a retention."""
    rendered_, _ = pcluster_report
    listeners = groups = 0
    for label in LABELS:
        for template in (rendered_[label].template, *rendered_[label].nested):
            for listener in resources(template, "AWS::ElasticLoadBalancingV2::Listener").values():
                assert listener["Properties"]["Protocol"] == "TCP", label
                listeners += 1
            for logical_id, group in resources(template, "AWS::Logs::LogGroup").items():
                assert group["Properties"]["RetentionInDays"] == SETTINGS[label].cluster.log_retention_days, (
                    label, logical_id)
                groups += 1
    assert listeners and groups >= 3 * len(LABELS)
