"""Linters over what we ship: cfn-lint on every synthesised template, Packer on ami/,
shellcheck on every shell script in the repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
AMI_DIR = REPO_ROOT / "ami"
SHELL_DIRS = ("ami", "bootstrap", "scripts", "slurm", ".ci")
# Packer >= 1.7 needs `packer { required_plugins }`; older Packer rejects the block, so the
# template is validated on its own, with the variables the image pipeline passes.
PACKER_VARS = ["-var", "region=us-east-1", "-var", "subnet_id=subnet-0123456789abcdef0",
               "-var", "ssh_source_cidr=192.0.2.10/32", "-var", "build_tag=scdino"]


def _run(command: list[str], cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=180, check=False)


def _require(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} is not installed: run `make install` (scripts/install-system-deps.sh)"
    return path


# W3005: redundant DependsOn that CDK itself generates on its provider roles.
# W3010: the availability zone is hard-coded on purpose: it is the `network.availability_zone`
# setting (EFA and cluster placement groups need every node in one chosen zone).
CFN_LINT_IGNORED = ["--ignore-checks", "W3005", "W3010"]


def _cfn_lint(*templates: Path) -> subprocess.CompletedProcess:
    return _run([str(Path(sys.executable).parent / "cfn-lint"), *CFN_LINT_IGNORED, "--", *map(str, templates)])


def test_cfn_lint_clean_on_every_template(synth, demo_synth, pcs_synth):
    templates = [path for result in (synth, demo_synth, pcs_synth) for path in sorted(result.outdir.glob("*.template.json"))]
    assert len(templates) == 12
    result = _cfn_lint(*templates)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cfn_lint_checks_the_pcs_resources_against_its_bundled_schemas(pcs_synth, tmp_path):
    """The PCS template is really read against AWS::PCS::* schemas: three planted mistakes, three errors."""
    template = json.loads((pcs_synth.outdir / "scdino-cluster.template.json").read_text())
    kinds = {value["Type"]: key for key, value in template["Resources"].items()}
    template["Resources"][kinds["AWS::PCS::Cluster"]]["Properties"]["Size"] = "HUGE"
    template["Resources"][kinds["AWS::PCS::ComputeNodeGroup"]]["Properties"]["PurchaseOption"] = "RESERVED"
    queue = template["Resources"][kinds["AWS::PCS::Queue"]]["Properties"]
    queue["ComputeNodeGroupConfiguration"] = queue.pop("ComputeNodeGroupConfigurations")
    broken = tmp_path / "broken-pcs.template.json"
    broken.write_text(json.dumps(template))
    result = _cfn_lint(broken)
    assert result.returncode != 0
    assert "'HUGE' is not one of ['SMALL', 'MEDIUM', 'LARGE']" in result.stdout
    assert "'RESERVED' is not one of" in result.stdout and "ComputeNodeGroupConfiguration" in result.stdout


def test_packer_template_validates():
    result = _run([_require("packer"), "validate", *PACKER_VARS, "gpu-image.pkr.hcl"], cwd=AMI_DIR)
    assert result.returncode == 0, result.stdout + result.stderr


def test_packer_catches_a_wrong_template(tmp_path):
    broken = tmp_path / "broken.pkr.hcl"
    broken.write_text((AMI_DIR / "gpu-image.pkr.hcl").read_text().replace("instance_type ", "instance_typ ", 1))
    result = _run([_require("packer"), "validate", *PACKER_VARS, str(broken)], cwd=AMI_DIR)
    assert result.returncode != 0


def test_packer_files_are_formatted():
    result = _run([_require("packer"), "fmt", "-check", "-diff", "."], cwd=AMI_DIR)
    assert result.returncode == 0, result.stdout + result.stderr


def test_packer_scripts_exist_and_are_executable():
    template = (AMI_DIR / "gpu-image.pkr.hcl").read_text()
    scripts = set(re.findall(r'"\$\{path\.root\}/(scripts/[^"]+)"', template))
    assert len(scripts) >= 7
    for script in scripts:
        path = AMI_DIR / script
        assert path.is_file() and path.stat().st_mode & 0o111, script
    assert scripts == {f"scripts/{path.name}" for path in (AMI_DIR / "scripts").glob("*.sh")}


def shell_scripts() -> list[Path]:
    """*.sh and *.slurm files, plus extension-less executables with a shell shebang (e.g. .ci/run)."""
    found = []
    for folder in SHELL_DIRS:
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if not path.is_file():
                continue
            if path.suffix in (".sh", ".slurm"):
                found.append(path)
            elif not path.suffix and path.read_bytes()[:40].startswith((b"#!/usr/bin/env bash", b"#!/bin/bash")):
                found.append(path)
    return found


def test_shellcheck_clean_on_every_shell_script():
    scripts = shell_scripts()
    assert any(p.name == "on-node-configured.sh" for p in scripts)
    result = _run([_require("shellcheck"), "--shell=bash", "--external-sources", *map(str, scripts)])
    assert result.returncode == 0, result.stdout[-4000:]


@pytest.mark.parametrize("script", ["bootstrap/on-node-configured.sh", "bootstrap/pcs-node.sh"])
def test_shipped_scripts_are_executable(script):
    assert (REPO_ROOT / script).stat().st_mode & 0o111
