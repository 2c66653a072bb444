"""checkov on the synthesised templates of both back ends (and the throw-away variant): no failed check,
and every skipped check is one the templates explain in place, on CDK's own custom-resource handlers or
on the access-log bucket that cannot log into itself. checkov lives in its own virtualenv (.venv-checkov,
requirements-checkov.txt): it pins a boto3 that cannot share a resolver with requirements.txt's.

Besides checkov, what it asked for is asserted directly: every log group is encrypted with a customer key
that lets CloudWatch Logs use it, and every bucket but the access-log bucket is versioned and logged there."""

from __future__ import annotations

import json
import subprocess

import pytest

from infra.synth_helpers import REPO_ROOT, Synth, resources
from stacks.shared.common import CLOUDWATCH_LOGS_KEY_ACTIONS

pytestmark = pytest.mark.slow

CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"
ACCESS_LOGS_BUCKET = "AccessLogsBucket83982689"
VARIANTS = ("synth", "pcs_synth", "demo_synth")


def _checkov(result: Synth) -> dict:
    """checkov's JSON report on the variant's templates; --skip-download: no call to Prisma Cloud."""
    assert CHECKOV.exists(), f"{CHECKOV} missing: run `make install`"
    templates = sorted(result.outdir.glob("*.template.json"))
    assert len(templates) == 4
    command = [str(CHECKOV), "--framework", "cloudformation", "--output", "json", "--compact", "--skip-download",
               *[argument for template in templates for argument in ("--file", str(template))]]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert run.stdout.strip(), run.stderr[-3000:]
    (report,) = [json.loads(run.stdout)] if run.stdout.lstrip().startswith("{") else json.loads(run.stdout)
    return report


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
