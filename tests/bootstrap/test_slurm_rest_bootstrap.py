"""bootstrap/slurm-rest.sh install, the ParallelCluster head node's Slurm REST API, run for real in a folder
playing the head node: the JWT key, slurm.conf's block (once, and again after ParallelCluster rewrote the
file), the units, which systemd-analyze verifies, and the OpenAPI plugins asked from Debian's real slurmrestd.

What stands in for what: no systemd runs as PID 1 here, so systemctl records what it is asked; useradd
records too (the test must not add users to this machine). The token writer runs against the local
cluster's real scontrol and moto's Secrets Manager in tests/slurm/test_remote.py; on-node-configured.sh's
call of this script is in tests/bootstrap/test_bootstrap.py's head-node runs.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bootstrap" / "slurm-rest.sh"
RECORDER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "${FAKE_CALLS}"
"""
SECRET = "arn:aws:secretsmanager:us-west-2:111122223333:secret:scdino-cluster-RestApiToken-AbCdEf"
POINTER = {"bundle": "s3://bucket/bundles/x.zip", "id": "x",
           "rest": {"token_secret": SECRET, "user": "ec2-user", "port": 6820, "renew_minutes": 30,
                    "lifespan_seconds": 7200}}
CONF = "ClusterName=scdino-hpc\nSlurmctldHost=ip-10-0-0-10\nSlurmUser=root\nAuthType=auth/munge\n"


@pytest.fixture
def head(tmp_path: Path) -> dict:
    if not shutil.which("slurmrestd") or not shutil.which("systemd-analyze"):
        pytest.fail("needs Debian's slurmrestd and systemd-analyze: scripts/install-system-deps.sh", pytrace=False)
    bin_dir, slurm = tmp_path / "bin", tmp_path / "opt" / "slurm"
    for folder in (bin_dir, slurm / "sbin", slurm / "etc"):
        folder.mkdir(parents=True)
    for name in ("systemctl", "useradd"):
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(stat.S_IRWXU)
    (slurm / "sbin" / "slurmrestd").symlink_to(shutil.which("slurmrestd"))
    (slurm / "etc" / "slurm.conf").write_text(CONF)
    (tmp_path / "current.json").write_text(json.dumps(POINTER))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_CALLS": str(tmp_path / "calls"),
           "SCDINO_SLURM_ROOT": str(slurm), "SCDINO_SLURM_STATE": str(tmp_path / "spool"),
           "SCDINO_SYSTEMD_DIR": str(tmp_path / "systemd"), "SCDINO_REST_CONFIG_DIR": str(tmp_path / "etc-scdino"),
           "SCDINO_REST_SCRIPT": str(tmp_path / "sbin" / "scdino-slurm-rest")}
    (tmp_path / "systemd").mkdir()
    (tmp_path / "sbin").mkdir()
    return {"env": env, "root": tmp_path, "conf": slurm / "etc" / "slurm.conf", "calls": tmp_path / "calls"}


def install(head: dict) -> subprocess.CompletedProcess:
    result = subprocess.run([str(SCRIPT), "install", str(head["root"] / "current.json")], env=head["env"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def calls(head: dict) -> list[str]:
    path = head["calls"]
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def test_the_key_the_conf_block_and_the_units_once_and_again_after_an_update(head):
    install(head)
    key = head["root"] / "spool" / "jwt_hs256.key"
    assert key.stat().st_size == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600
    conf = head["conf"].read_text()
    assert conf.startswith(CONF) and conf.count("AuthAltTypes=auth/jwt") == 1
    assert f"AuthAltParameters=jwt_key={key}" in conf
    made = calls(head)
    assert "systemctl restart slurmctld" in made and "useradd --system --no-create-home --shell /sbin/nologin " \
        "slurmrestd" in made
    assert "systemctl enable scdino-slurmrestd.service scdino-rest-token.timer" in made

    units = head["root"] / "systemd"
    service = (units / "scdino-slurmrestd.service").read_text()
    assert "ExecStart=" + str(head["root"] / "opt/slurm/sbin/slurmrestd") + " -a rest_auth/jwt 127.0.0.1:6820" in service
    assert "SLURMRESTD_OPENAPI_PLUGINS=openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38" in service, \
        "the slurmctld plugins Debian's slurmrestd lists, not the slurmdbd ones"
    assert "User=slurmrestd" in service and "OnUnitActiveSec=30min" in (units / "scdino-rest-token.timer").read_text()
    env = (head["root"] / "etc-scdino" / "rest.env").read_text()
    assert f"REST_SECRET={SECRET}" in env and "REST_REGION=us-west-2" in env and "REST_LIFESPAN=7200" in env
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", *(str(unit) for unit in sorted(units.iterdir()))],
                            capture_output=True, text=True, timeout=60)
    problems = [line for line in verify.stderr.splitlines() if "scdino" in line and "User=" not in line]
    assert not problems, verify.stderr

    secret_before = key.read_bytes()
    install(head)
    assert calls(head).count("systemctl restart slurmctld") == 0, "nothing changed: slurmctld keeps running"
    assert head["conf"].read_text() == conf and key.read_bytes() == secret_before

    head["conf"].write_text(CONF + "SlurmctldParameters=idle_on_node_suspend\n")  # an update rewrote slurm.conf
    install(head)
    assert "systemctl restart slurmctld" in calls(head)
    assert head["conf"].read_text().count("AuthAltTypes=auth/jwt") == 1 and key.read_bytes() == secret_before


def test_a_pointer_without_rest_settings_or_a_node_without_slurm_fails_naming_it(head):
    (head["root"] / "current.json").write_text(json.dumps({"bundle": "s3://b/x.zip", "id": "x"}))
    result = subprocess.run([str(SCRIPT), "install", str(head["root"] / "current.json")], env=head["env"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and 'no "rest" entry' in result.stderr
    (head["root"] / "current.json").write_text(json.dumps(POINTER))
    head["conf"].unlink()
    result = subprocess.run([str(SCRIPT), "install", str(head["root"] / "current.json")], env=head["env"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no Slurm configuration at" in result.stdout
