"""The pinned CDK CLI synthesises offline from the repository, and a wrong setting stops it
with one line naming the setting (no Python or jsii stack trace)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """No AWS credentials or config reachable; the jsii Node banner silenced."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CDK_"))}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), CDK_DISABLE_VERSION_CHECK="1",
               JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20", JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1")
    return env


def _cdk(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI `npx cdk` runs: package.json's pinned aws-cdk@2 (called directly; npx adds only npm's start-up)."""
    cli = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    assert cli.exists(), "the pinned CDK CLI is missing: run `make install`"
    assert shutil.which("node"), "Node.js is not installed"
    return subprocess.run([str(cli), *args], cwd=REPO_ROOT, env=_offline_env(tmp_path),
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("backend, cluster_type", [("parallelcluster", "Custom::PclusterCluster"),
                                                   ("pcs", "AWS::PCS::Cluster")])
def test_cdk_synth_offline_with_the_pinned_cli(tmp_path, backend, cluster_type):
    """`npx cdk synth` and `npx cdk synth -c backend=pcs`: the same four stacks, cdk-nag passing (synth fails otherwise)."""
    context_before = (REPO_ROOT / "cdk.context.json").read_text()
    result = _cdk(tmp_path, "synth", "--quiet", "--output", str(tmp_path / "cdk.out"), "-c", f"backend={backend}")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "cdk.out" / "manifest.json").read_text())
    stacks = {name for name, artifact in manifest["artifacts"].items()
              if artifact["type"] == "aws:cloudformation:stack"}
    assert stacks == {"scdino-network", "scdino-storage", "scdino-image", "scdino-cluster"}
    cluster = json.loads((tmp_path / "cdk.out" / "scdino-cluster.template.json").read_text())
    assert cluster_type in {resource["Type"] for resource in cluster["Resources"].values()}
    assert (REPO_ROOT / "cdk.context.json").read_text() == context_before, "synth needed a context lookup"


@pytest.mark.parametrize("override, named", [
    ("cluster.presets=g4dn.12xlarge,x1.32xlarge", "setting cluster.presets: unknown preset 'x1.32xlarge'"),
    ("backend=pbs", "setting backend: must be one of ('parallelcluster', 'pcs') (e.g. -c backend=pcs), got 'pbs'"),
])
def test_wrong_setting_is_one_line_naming_it(tmp_path, override, named):
    result = _cdk(tmp_path, "synth", "--quiet", "--output", str(tmp_path / "cdk.out"), "-c", override)
    assert result.returncode != 0
    app_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(app_lines) == 1, result.stderr
    assert app_lines[0].startswith(f"error: {named}"), result.stderr
    for trace in ("Traceback", "jsii", "at Kernel", "RuntimeError"):
        assert trace not in result.stderr
