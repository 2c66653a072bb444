"""Infra fixtures: the CDK app is synthesised once per session and shared by every test."""

from __future__ import annotations

import pytest

from stacks.shared.presets import PRESETS
from tests.support.cdk_synth import Synth, synthesize


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Synth:
    """The default deployment (cdk.json's settings)."""
    return synthesize(tmp_path_factory.mktemp("cdk-out"))


@pytest.fixture(scope="session")
def demo_synth(tmp_path_factory) -> Synth:
    """A throw-away variant in another region and prefix: deletable storage, the pipeline-built AMI,
    every preset, a login node, alarms mailed."""
    return synthesize(tmp_path_factory.mktemp("cdk-out-demo"), {
        "region": "eu-west-1", "network.availability_zone": "eu-west-1b",
        "prefix": "scdino-demo", "storage.retain": "false", "cluster.custom_ami": "ssm",
        "cluster.presets": "g4dn.12xlarge,p4d.24xlarge,p5.48xlarge", "cluster.min_nodes": "1",
        "cluster.login_nodes": "1", "cluster.alarm_email": "ops@example.org"})


@pytest.fixture(scope="session")
def pcs_synth(tmp_path_factory) -> Synth:
    """backend=pcs with every preset and the Spot CPU queue: one synthesis shared by every PCS test."""
    return synthesize(tmp_path_factory.mktemp("cdk-out-pcs"), {
        "backend": "pcs", "cluster.presets": ",".join(PRESETS), "cluster.cpu_spot_instance_type": "c6i.8xlarge"})
