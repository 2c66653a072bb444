"""cdk-nag's AwsSolutions checks run at every synth: an unacknowledged finding fails it."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from stacks.shared.nag import acknowledge, enable_checks

pytestmark = pytest.mark.slow


def _app_with_plain_bucket(tmp_path, *, acknowledged: bool) -> cdk.App:
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "NagProbe")
    bucket = s3.Bucket(stack, "Plain", enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL)
    if acknowledged:
        acknowledge(bucket, "S1", "probe bucket of a test")
    enable_checks(app)
    return app


def test_unacknowledged_finding_fails_synth(tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)ValidationFailed.*AwsSolutions-S1"):
        _app_with_plain_bucket(tmp_path / "a", acknowledged=False).synth()


def test_exact_acknowledgment_lets_synth_pass(tmp_path):
    _app_with_plain_bucket(tmp_path / "b", acknowledged=True).synth()


def test_real_app_has_zero_unacknowledged_findings_and_every_acknowledgment_has_a_reason(synth, demo_synth,
                                                                                      pcs_synth):
    for result in (synth, demo_synth, pcs_synth):
        report = json.loads((result.outdir / "validation-report.json").read_text())
        plugins = {plugin["pluginName"]: plugin for plugin in report["pluginReports"]}
        # CDK's own "CloudFormation Validate" plugin runs beside cdk-nag; both must pass.
        assert {name: (p["conclusion"], p["violations"]) for name, p in plugins.items()} == {
            "AwsSolutions": ("success", []), "CloudFormation Validate": ("success", [])}
        for suppressed in plugins["AwsSolutions"]["suppressedViolations"]:
            assert len(suppressed.get("reason", "")) > 30, suppressed["ruleName"]
