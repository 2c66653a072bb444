"""Security rule packs over what we synthesise, and their acknowledgments beside the resources.

- cdk-nag's AwsSolutions checks run at every synth as a validation plugin: an unacknowledged finding
  fails it (`acknowledge`).
- checkov runs on the synthesised templates in the test suite (tests/infra/test_checkov.py): a check
  that cannot apply is skipped in the resource's own `Metadata` with its reason (`skip_checkov`).
"""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

CDK_HANDLER_CHECKS = {
    "CKV_AWS_115": "invoked only by CloudFormation during this stack's deployments; reserved concurrency would "
                   "take capacity from the account's pool for a function idle between deploys.",
    "CKV_AWS_116": "invoked synchronously by CloudFormation as a custom resource: a failure is reported to the "
                   "stack's events and rolls the deployment back; there is no asynchronous event to dead-letter.",
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
    (provider,) = [child for child in stack.node.children if child.node.id.startswith(provider_id)]
    (handler,) = [node for node in provider.node.find_all()
                  if isinstance(node, cdk.CfnResource) and node.cfn_resource_type == "AWS::Lambda::Function"]
    checks = {check: f"{what}: {reason}" for check, reason in CDK_HANDLER_CHECKS.items()}
    skip_checkov(handler, {**checks, **(extra or {})})
