"""Security rule packs over what we synthesise, and their acknowledgments beside the resources.

- cdk-nag's AwsSolutions checks run at every synth as a validation plugin: an unacknowledged finding
  fails it (`acknowledge`).
- checkov runs on the synthesised templates in the test suite (tests/infra/test_checkov.py): a check
  that cannot apply is skipped in the resource's own `Metadata` with its reason (`skip_checkov`).

CDK's own custom-resource handlers get both treatments here (`skip_checkov_on_cdk_handler`), and a log
group of their stack with a retention (`log_cdk_handler`), so that nothing of theirs outlives a destroy.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from stacks.shared.common import retention

CDK_HANDLER_CHECKS = {
    "CKV_AWS_115": "invoked only by CloudFormation during this stack's deployments; reserved concurrency would "
                   "take capacity from the account's pool for a function idle between deploys.",
    "CKV_AWS_116": "invoked by CloudFormation, asynchronously, with a presigned URL to answer (AWS Lambda Developer "
                   "Guide, 'Using Lambda with CloudFormation'); CloudFormation waits for that answer, not for the "
                   "invocation: the handler answers FAILED on its own errors, and an invocation that never answers "
                   "fails the stack operation at the custom resource's ServiceTimeout (3,600 s by default), in the "
                   "stack's events, and rolls it back. A dead-letter queue would keep only the request of an "
                   "operation that has failed by then, which no replay can complete.",
    "CKV_AWS_117": "calls only AWS APIs over their regional endpoints and needs nothing inside the VPC; in it, "
                   "it would need a NAT gateway or interface endpoints just to reach those APIs.",
}
"""checkov's Lambda hygiene checks that do not apply to a CloudFormation custom-resource handler CDK
generates (one per stack, code and settings chosen by the pinned aws-cdk-lib), with why."""


def enable_checks(app: cdk.App) -> None:
    """Run the AwsSolutions rule pack as a validation plugin: any unacknowledged finding fails synth."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one exact finding (e.g. `IAM5[Resource::*]`) on `scope` and its children."""
    cdk.Validations.of(scope).acknowledge(
        cdk.Acknowledgment(id=f"AwsSolutions::AwsSolutions-{finding}", reason=reason))


def skip_checkov(resource: cdk.CfnResource, checks: dict[str, str]) -> None:
    """Skip checkov checks (id -> reason) on one resource, in its template `Metadata` where checkov reads them."""
    current = resource.get_metadata("checkov") or {}
    skips = {item["id"]: item["comment"] for item in current.get("skip", [])}
    skips.update(checks)
    resource.add_metadata("checkov", {"skip": [{"id": check, "comment": reason}
                                               for check, reason in sorted(skips.items())]})


def skip_checkov_on_cdk_handler(stack: cdk.Stack, provider_id: str, what: str,
                                extra: dict[str, str] | None = None) -> None:
    """checkov's Lambda hygiene checks skipped on the handler CDK generates for `provider_id` (a child of
    `stack` such as `Custom::VpcRestrictDefaultSGCustomResourceProvider`); `what` names it in each reason."""
    checks = {check: f"{what}: {reason}" for check, reason in CDK_HANDLER_CHECKS.items()}
    skip_checkov(_cdk_handler(stack, provider_id), {**checks, **(extra or {})})


def log_cdk_handler(stack: cdk.Stack, provider_id: str, *, retention_days: int, key: kms.IKey) -> logs.LogGroup:
    """Give the handler CDK generates for `provider_id` a log group of `stack`, kept `retention_days`, encrypted
    with `key` (one CloudWatch Logs may use) and deleted with the stack.

    Without it Lambda creates /aws/lambda/<handler> at the first invocation, with no retention, and a destroy
    leaves it behind. The group the function's LoggingConfig names is created before the function (the Ref is
    a dependency), so the handler never creates one itself; CDK's role for it (AWSLambdaBasicExecutionRole)
    already writes to any group."""
    group = logs.LogGroup(stack, f"{provider_id.removeprefix('Custom::').removesuffix('CustomResourceProvider')}Logs",
                          retention=retention(retention_days), encryption_key=key,
                          removal_policy=cdk.RemovalPolicy.DESTROY)
    _cdk_handler(stack, provider_id).add_property_override("LoggingConfig", {"LogGroup": group.log_group_name})
    return group


def _cdk_handler(stack: cdk.Stack, provider_id: str) -> cdk.CfnResource:
    """The Lambda function of CDK's provider `provider_id`, a child of `stack`."""
    (provider,) = [child for child in stack.node.children if child.node.id.startswith(provider_id)]
    (handler,) = [node for node in provider.node.find_all()
                  if isinstance(node, cdk.CfnResource) and node.cfn_resource_type == "AWS::Lambda::Function"]
    return handler
