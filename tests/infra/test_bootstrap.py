"""The OnNodeConfigured script, run for real against a local fake of `aws s3 cp` and a tiny bundle:
it installs once, is a no-op the second time, and fails loudly on bad input."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bootstrap" / "on-node-configured.sh"
FAKE_AWS = """#!/usr/bin/env bash
# Fake `aws s3 cp [--only-show-errors] s3://bucket/key dest`: serves keys from $FAKE_S3_DIR.
set -euo pipefail
[[ "$1 $2" == "s3 cp" ]] || { echo "fake aws: unsupported $*" >&2; exit 2; }
shift 2
[[ "$1" == --only-show-errors ]] && shift
cp "${FAKE_S3_DIR}/${1#s3://*/}" "$2"
"""


@pytest.fixture
def node(tmp_path: Path) -> dict:
    """A fake S3 bucket holding a minimal bundle, a fake `aws` on PATH, and an install dir."""
    assert shutil.which("python3.11") and shutil.which("flock"), "python3.11 and flock are needed"
    bin_dir, s3_dir = tmp_path / "bin", tmp_path / "s3"
    bin_dir.mkdir()
    s3_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(stat.S_IRWXU)
    with zipfile.ZipFile(s3_dir / "abc123.zip", "w") as bundle:
        bundle.writestr("requirements.txt", "")
        bundle.writestr("pyproject.toml", '[build-system]\nrequires = ["setuptools>=61"]\n'
                        'build-backend = "setuptools.build_meta"\n[project]\nname = "bundle"\nversion = "0"\n'
                        '[tool.setuptools.packages.find]\ninclude = ["training*"]\n')
        bundle.writestr("training/__init__.py", "")
        bundle.writestr("slurm/env.sh", "")
    with zipfile.ZipFile(s3_dir / "empty.zip", "w") as bundle:
        bundle.writestr("README", "no requirements here")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_S3_DIR": str(s3_dir),
           "SCDINO_BOOTSTRAP_LOG": str(tmp_path / "bootstrap.log"),
           # Offline: pip uses what the venv already has (no upgrade, no build isolation downloads).
           "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}
    return {"env": env, "apps": tmp_path / "apps", "log": tmp_path / "bootstrap.log"}


def _run(node: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=node["env"], capture_output=True, text=True,
                          timeout=300, check=False)


def test_installs_once_then_reuses(node):
    install_dir = node["apps"] / "scdino"
    first = _run(node, "s3://bucket/abc123.zip", str(install_dir))
    assert first.returncode == 0, first.stdout[-3000:]
    assert install_dir.is_symlink() and install_dir.resolve() == node["apps"] / "scdino-abc123"
    assert (install_dir / ".ready").read_text().strip() == "s3://bucket/abc123.zip"
    check = subprocess.run([str(install_dir / ".venv" / "bin" / "python"), "-c", "import training"],
                           cwd="/", capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    second = _run(node, "s3://bucket/abc123.zip", str(install_dir))
    assert second.returncode == 0 and "already installed" in second.stdout
    assert "already installed" in node["log"].read_text()


@pytest.mark.parametrize("args, message", [
    ((), "usage:"),
    (("https://example.com/bundle.zip",), "bundle must be an s3://...zip URI"),
    (("s3://bucket/empty.zip",), "bundle has no requirements.txt"),
])
def test_fails_loudly_without_leaving_a_ready_install(node, args, message):
    install_dir = node["apps"] / "scdino"
    result = _run(node, *args, str(install_dir)) if args else _run(node)
    assert result.returncode != 0
    assert "ERROR" in result.stdout and message in result.stdout
    assert message in node["log"].read_text()
    assert not install_dir.exists()
