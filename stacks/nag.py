"""cdk-nag wiring: AwsSolutions checks at every synth, exact acknowledgments beside resources."""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def enable_checks(app: cdk.App) -> None:
    """Run the AwsSolutions rule pack as a validation plugin: any unacknowledged finding fails synth."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one exact finding (e.g. `IAM5[Resource::*]`) on `scope` and its children."""
    cdk.Validations.of(scope).acknowledge(
        cdk.Acknowledgment(id=f"AwsSolutions::AwsSolutions-{finding}", reason=reason))
