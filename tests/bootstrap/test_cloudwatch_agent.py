"""The CloudWatch agent template the GPU nodes append (bootstrap/cloudwatch-agent.json): the agent's
documented keys only (tests/support/cloudwatch_agent_keys.py), the GPU figures the dashboard and
alarms read, the Xid lines and the training's EMF file, and placeholders the bootstrap fills."""

from __future__ import annotations

import copy
import json
import re

import pytest

from stacks.shared.monitoring import GPU_MEASUREMENTS
from tests.support.cdk_synth import REPO_ROOT
from tests.support.cloudwatch_agent_keys import check_agent_config

TEMPLATE = REPO_ROOT / "bootstrap" / "cloudwatch-agent.json"
PLACEHOLDERS = {"@GPU_NAMESPACE@", "@LOG_GROUP@", "@EMF_LOG@"}


def _filled(text: str) -> dict:
    values = {"@GPU_NAMESPACE@": "scdino-hpc/GPU", "@LOG_GROUP@": "scdino-cluster-Logs", "@EMF_LOG@": "/var/log/x"}
    return json.loads(re.sub("|".join(values), lambda m: values[m.group(0)], text))


def test_the_template_uses_only_documented_keys_once_filled():
    check_agent_config(_filled(TEMPLATE.read_text()))


def test_the_template_has_exactly_the_placeholders_the_bootstrap_fills():
    assert set(re.findall(r"@[A-Z_]+@", TEMPLATE.read_text())) == PLACEHOLDERS
    script = (REPO_ROOT / "bootstrap" / "on-node-configured.sh").read_text()
    assert all(placeholder in script for placeholder in PLACEHOLDERS)


def test_it_collects_what_the_dashboard_and_alarms_read():
    config = _filled(TEMPLATE.read_text())
    gpu = config["metrics"]["metrics_collected"]["nvidia_gpu"]
    assert set(GPU_MEASUREMENTS) <= set(gpu["measurement"])
    assert [] in config["metrics"]["aggregation_dimensions"]  # the cluster-wide series the alarms use
    files = {item["file_path"]: item for item in config["logs"]["logs_collected"]["files"]["collect_list"]}
    assert files["/var/log/x"]["log_group_name"] == "scdino-cluster-Logs" and "filters" not in files["/var/log/x"]
    for path in ("/var/log/messages", "/var/log/kern.log"):
        (rule,) = files[path]["filters"]
        assert rule["type"] == "include" and re.search(rule["expression"], "NVRM: Xid (PCI:0000:10:1c): 79, GPU fell")


def _misspelt_measurement(config):
    config["metrics"]["metrics_collected"]["nvidia_gpu"]["measurement"].append("utilisation_gpu")


def _custom_dimension(config):
    config["metrics"]["append_dimensions"]["Cluster"] = "scdino-hpc"


def _unknown_collect_key(config):
    config["logs"]["logs_collected"]["files"]["collect_list"][0]["filter"] = []


@pytest.mark.parametrize("spoil", [_misspelt_measurement, _custom_dimension, _unknown_collect_key])
def test_the_key_check_rejects_what_the_agent_does_not_document(spoil):
    config = copy.deepcopy(_filled(TEMPLATE.read_text()))
    spoil(config)
    with pytest.raises(AssertionError):
        check_agent_config(config)
