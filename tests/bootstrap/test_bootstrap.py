"""The node bootstrap script, run for real against a local fake of `aws` and tiny bundles: it
follows the pointer, installs once, uses the image's environment when it matches, never flips the
active bundle back to an older pointer's, prunes old bundles, and fails loudly on bad input; on GPU
compute nodes it appends the CloudWatch agent's configuration (a fake agent-ctl records it), the
same on every run, and a monitoring failure never fails the node. On AWS PCS (backend=pcs) the
user data's script, bootstrap/pcs-node.sh, runs it under PCS's paths: FSx mounted with flock, /apps
bound to a directory of the file system, no ParallelCluster node facts (fakes of mount, mountpoint and
systemctl record what would be done to the machine). Its instance-store /scratch, reboots and boot unit
are tested on real block devices in tests/bootstrap/test_pcs_node_disks.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.support.bootstrap_fakes import FAKE_AWS, REQUIREMENTS

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bootstrap" / "on-node-configured.sh"
FAKE_CTL = """#!/usr/bin/env bash
# Fake amazon-cloudwatch-agent-ctl: records its arguments.
echo "$*" >> "${FAKE_CTL_LOG}"
"""
MONITORING = {"gpu_namespace": "scdino-hpc/GPU", "training_namespace": "scdino-hpc/Training",
              "log_group": "scdino-cluster-MonitoringLogs0185DD8B-abc"}
FAKE_SQUEUE = """#!/usr/bin/env bash
# Fake squeue: prints the lines of $FAKE_SQUEUE_JOBS, as the real one prints "%i %T %k" (job id, state,
# comment) with --noheader --all --states=all, or fails as it does when the controller cannot be reached.
echo "$*" >> "${FAKE_SQUEUE_LOG}"
if [[ -n "${FAKE_SQUEUE_FAILS:-}" ]]; then
  echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2
  exit 1
fi
cat "${FAKE_SQUEUE_JOBS}" 2>/dev/null || true
"""


def _bundle(path: Path, *, requirements: str | None = REQUIREMENTS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as bundle:
        if requirements is not None:
            bundle.writestr("requirements.txt", requirements)
        bundle.writestr("training/__init__.py", "")
        bundle.writestr("slurm/env.sh", "")


@pytest.fixture(scope="module")
def shared_venvs(tmp_path_factory) -> Path:
    """The FSx directory of shared environments, kept across tests: one is built once per requirements set."""
    return tmp_path_factory.mktemp("fsx") / "venvs"


@pytest.fixture
def node(tmp_path: Path, shared_venvs: Path) -> dict:
    """A fake S3 bucket, a fake `aws` on PATH, and the node's install dir, image venv and FSx paths."""
    assert shutil.which("python3.11") and shutil.which("flock"), "python3.11 and flock are needed"
    bin_dir, s3_dir = tmp_path / "bin", tmp_path / "s3"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(stat.S_IRWXU)
    # The bootstrap asks Slurm which bundles its jobs use. No Slurm cluster here: a fake squeue prints the jobs
    # a test describes (none by default). tests/slurm/test_bundle_pruning.py asks the local cluster's real one.
    (bin_dir / "squeue").write_text(FAKE_SQUEUE)
    (bin_dir / "squeue").chmod(stat.S_IRWXU)
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "amazon-cloudwatch-agent-ctl").write_text(FAKE_CTL)
    (tmp_path / "agent" / "amazon-cloudwatch-agent-ctl").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_S3_DIR": str(s3_dir),
           "SCDINO_BOOTSTRAP_LOG": str(tmp_path / "bootstrap.log"),
           "SCDINO_IMAGE_VENV": str(tmp_path / "opt" / "scdino-venv"),
           "SCDINO_SHARED_VENVS": str(shared_venvs),
           "SCDINO_CLUSTER_CONFIG": str(tmp_path / "cfnconfig"),
           "SCDINO_CWAGENT_CTL": str(tmp_path / "agent" / "amazon-cloudwatch-agent-ctl"),
           "SCDINO_CWAGENT_CONFIG": str(tmp_path / "agent" / "etc" / "scdino-monitoring.json"),
           "SCDINO_MONITORING_ENV": str(tmp_path / "etc" / "scdino" / "monitoring.env"),
           "SCDINO_EMF_DIR": str(tmp_path / "var" / "log" / "scdino"),
           "FAKE_CTL_LOG": str(tmp_path / "ctl.log"),
           "SCDINO_WORK_DIR": str(tmp_path / "fsx-data" / "work"),
           "FAKE_SQUEUE_JOBS": str(tmp_path / "squeue-jobs"), "FAKE_SQUEUE_LOG": str(tmp_path / "squeue.log"),
           "PIP_NO_INDEX": "1"}
    (tmp_path / "opt").mkdir()
    return {"env": env, "s3": s3_dir, "apps": tmp_path / "apps", "log": tmp_path / "bootstrap.log",
            "work": tmp_path / "fsx-data" / "work",
            "image_venv": tmp_path / "opt" / "scdino-venv", "shared": shared_venvs, "root": tmp_path,
            "bin": bin_dir, "jobs": tmp_path / "squeue-jobs"}


def _publish(node: dict, bundle_id: str, *, mtime: int, requirements: str | None = REQUIREMENTS,
             name: str = "current.json", monitoring: dict | None = None, cluster: dict | None = None) -> str:
    """Upload bundle <id>.zip and a pointer to it last modified at `mtime` (with the monitoring names
    and the agent template beside it, and the cluster's shape, when given), and the shape's renderer
    beside it as every deploy does; return the pointer URI."""
    _bundle(node["s3"] / "bundles" / f"{bundle_id}.zip", requirements=requirements)
    pointer = node["s3"] / "bootstrap" / name
    pointer.parent.mkdir(exist_ok=True)
    shutil.copy(REPO_ROOT / "bootstrap" / "cluster-env.py", pointer.parent / "cluster-env.py")
    content = {"bundle": f"s3://bucket/bundles/{bundle_id}.zip", "id": bundle_id}
    if monitoring:
        content["monitoring"] = monitoring
        shutil.copy(REPO_ROOT / "bootstrap" / "cloudwatch-agent.json", pointer.parent / "cloudwatch-agent.json")
    if cluster:
        content["cluster"] = cluster
    pointer.write_text(json.dumps(content))
    os.utime(pointer, (mtime, mtime))
    return f"s3://bucket/bootstrap/{name}"


def _run(node: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=node["env"], capture_output=True, text=True,
                          timeout=300, check=False)


def _install(node: dict, pointer: str, *extra: str) -> subprocess.CompletedProcess:
    result = _run(node, pointer, str(node["apps"] / "scdino"), *extra)
    assert result.returncode == 0, result.stdout[-3000:]
    return result


def _imports_training(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import training"], cwd="/", capture_output=True,
                          check=False).returncode == 0


def test_follows_the_pointer_builds_one_shared_environment_then_reuses(node):
    _install(node, _publish(node, "abc123", mtime=1_000))
    install_dir = node["apps"] / "scdino"
    assert install_dir.is_symlink() and install_dir.resolve() == node["apps"] / "scdino-abc123"
    (shared,) = node["shared"].iterdir()
    assert node["image_venv"].resolve() == shared and (install_dir / ".venv").resolve() == shared
    assert _imports_training(install_dir / ".venv" / "bin" / "python")  # the .pth names the active bundle
    # Where users submit from (the bundle's directory is root's): anyone may make a folder there, sticky.
    assert stat.S_IMODE(node["work"].stat().st_mode) == 0o1777
    second = _install(node, "s3://bucket/bootstrap/current.json", "abc123")
    assert "already installed" in second.stdout and "already installed" in node["log"].read_text()
    assert "note:" not in second.stdout
    assert list(node["shared"].iterdir()) == [shared]


def _image_venv(node: dict, requirements: str) -> None:
    """What ami/scripts/20-python-env.sh leaves: a venv and a record of the requirements it was built from."""
    subprocess.run(["python3.11", "-m", "venv", "--without-pip", str(node["image_venv"])], check=True)
    record = node["image_venv"] / "scdino-requirements"
    record.mkdir()
    (record / "requirements.txt").write_text(requirements)


def test_uses_the_image_environment_when_it_was_built_from_the_bundle_requirements(node):
    _image_venv(node, REQUIREMENTS)
    result = _install(node, _publish(node, "abc123", mtime=1_000))
    assert not node["image_venv"].is_symlink() and "creating" not in result.stdout
    assert (node["apps"] / "scdino" / ".venv").resolve() == node["image_venv"]
    assert _imports_training(node["image_venv"] / "bin" / "python")


def test_falls_back_to_a_shared_environment_when_the_image_is_older_than_the_requirements(node):
    _image_venv(node, "torch==0.1\n")
    result = _install(node, _publish(node, "abc123", mtime=1_000))
    assert "built from other requirements" in result.stdout
    assert node["image_venv"].is_symlink() and node["image_venv"].resolve().parent == node["shared"]
    assert (node["image_venv"].parent / "scdino-venv.image").is_dir()
    restored = _install(node, _publish(node, "back444", mtime=2_000, requirements="torch==0.1\n"))
    assert "restoring" in restored.stdout and not node["image_venv"].is_symlink()
    assert (node["apps"] / "scdino").resolve() == node["apps"] / "scdino-back444"


def test_an_older_pointer_never_flips_the_active_bundle_back(node):
    old = _publish(node, "old111", mtime=1_000, name="seen-by-a-slow-node.json")
    _install(node, _publish(node, "new222", mtime=2_000))
    result = _install(node, old)
    assert (node["apps"] / "scdino").resolve() == node["apps"] / "scdino-new222"
    assert "is newer than ours" in result.stdout


def test_keeps_only_the_active_and_the_previous_bundle(node):
    for stamp, bundle_id in enumerate(("one111", "two222", "three333"), start=1):
        _install(node, _publish(node, bundle_id, mtime=1_000 * stamp))
    remaining = sorted(path.name for path in node["apps"].glob("scdino-*") if path.is_dir())
    assert remaining == ["scdino-three333", "scdino-two222"]


def _bundles(node: dict) -> list[str]:
    return sorted(path.name for path in node["apps"].glob("scdino-*") if path.is_dir())


def _activate_in_turn(node: dict, *bundle_ids: str, start: int = 1, requirements: dict | None = None) -> None:
    """Deploy each bundle in turn (pointers 1,000 s apart) and run the bootstrap after each deploy."""
    for stamp, bundle_id in enumerate(bundle_ids, start=start):
        _install(node, _publish(node, bundle_id, mtime=1_000 * stamp,
                                requirements=(requirements or {}).get(bundle_id, REQUIREMENTS)))


def test_a_node_booting_on_the_same_pointer_keeps_the_previous_bundle(node):
    """Each node that boots after a deploy activates the same bundle again: the previous one stays."""
    _activate_in_turn(node, "one111", "two222")
    again = _publish(node, "two222", mtime=2_500)  # a later deploy that changed only the cluster's settings
    _install(node, again)
    _install(node, again)
    assert _bundles(node) == ["scdino-one111", "scdino-two222"]


def test_two_activations_spare_the_bundle_a_job_names_and_the_next_prunes_it_once_the_job_ended(node):
    held = node["apps"] / "scdino-one111"
    _activate_in_turn(node, "one111")
    # What squeue prints: a running job and a pending array naming the first bundle in their comments (the
    # array by another spelling of the folder, with a user's own comment before the mark), a finished job
    # naming the second (finished: it holds nothing), and a job without a comment.
    node["jobs"].write_text(f"17 RUNNING scdino-bundle:{held}\n"
                            f"18_[3-5] PENDING my screen scdino-bundle:{node['apps']}/scdino/../scdino-one111\n"
                            f"16 COMPLETED scdino-bundle:{node['apps']}/scdino-two222\n"
                            "19 RUNNING (null)\n")
    _activate_in_turn(node, "two222", "three333", start=2)
    assert _bundles(node) == ["scdino-one111", "scdino-three333", "scdino-two222"]
    assert f"keeping {held}: job(s) 17 18_[3-5] use it" in node["log"].read_text()
    assert _imports_training(held / ".venv" / "bin" / "python") and (held / "training").is_dir()
    asked = Path(node["env"]["FAKE_SQUEUE_LOG"]).read_text().splitlines()
    assert asked[-1] == "--noheader --all --states=all --format=%i %T %k"
    node["jobs"].write_text(f"17 COMPLETED scdino-bundle:{held}\n18_5 CANCELLED scdino-bundle:{held}\n")
    _activate_in_turn(node, "four444", start=4)
    assert _bundles(node) == ["scdino-four444", "scdino-three333"]
    assert f"removing old bundle {held}" in node["log"].read_text()


def test_when_squeue_fails_nothing_is_removed(node):
    node["env"]["FAKE_SQUEUE_FAILS"] = "1"
    _activate_in_turn(node, "one111", "two222", "three333")
    assert _bundles(node) == ["scdino-one111", "scdino-three333", "scdino-two222"]
    log = node["log"].read_text()
    assert "Unable to contact slurm controller" in log and "squeue failed (exit 1)" in log
    assert "Slurm could not be asked which bundles its jobs use (see above): no bundle or environment removed" in log
    del node["env"]["FAKE_SQUEUE_FAILS"]
    _activate_in_turn(node, "four444", start=4)  # Slurm answers again: the next run catches up
    assert _bundles(node) == ["scdino-four444", "scdino-three333"]


def _requirements_id(requirements: str) -> str:
    """The bootstrap's name for an environment: its requirement files' text, hashed (requirements_id)."""
    return hashlib.sha256(requirements.encode()).hexdigest()[:16]


def _shared_environment(directory: Path) -> None:
    """A finished shared environment, as the first node to need it leaves it. Made here without pip, which
    the bootstrap then finds ready: building each with pip would take ~8 s on the 2-core machine."""
    subprocess.run(["python3.11", "-m", "venv", "--without-pip", str(directory)], check=True)
    (directory / ".ready").touch()


def test_shared_environments_are_pruned_to_those_of_the_kept_bundles(node, tmp_path):
    shared = tmp_path / "fsx" / "venvs"  # this test's own: pruning removes environments other tests reuse
    node["env"]["SCDINO_SHARED_VENVS"] = str(shared)
    requirements = {bundle_id: f"pip\n# {bundle_id}\n" for bundle_id in ("one111", "two222", "three333", "four444")}
    ids = {bundle_id: _requirements_id(text) for bundle_id, text in requirements.items()}
    for name in [*ids.values(), "0123456789abcdef"]:  # the last: an environment of requirements no bundle has
        _shared_environment(shared / name)
    _activate_in_turn(node, "one111", requirements=requirements)
    node["jobs"].write_text(f"17 SUSPENDED scdino-bundle:{node['apps']}/scdino-one111\n")
    _activate_in_turn(node, "two222", "three333", "four444", start=2, requirements=requirements)
    assert _bundles(node) == ["scdino-four444", "scdino-one111", "scdino-three333"]
    assert sorted(path.name for path in shared.iterdir()) == sorted([ids["one111"], ids["three333"], ids["four444"]])
    assert node["image_venv"].resolve() == shared / ids["four444"]
    assert f"removing the shared environment {shared / ids['two222']}" in node["log"].read_text()


def _env_sh_venv(home: Path, node: dict) -> tuple[str, str]:
    """SCDINO_VENV and SCDINO_VENV_NOTE as slurm/env.sh sets them in a job whose SCDINO_HOME is `home`."""
    env = {"PATH": "/usr/bin:/bin", "SCDINO_HOME": str(home), "SCDINO_SHARED_VENVS": node["env"]["SCDINO_SHARED_VENVS"]}
    out = subprocess.run(["bash", "-c", 'source slurm/env.sh && echo "$SCDINO_VENV" && echo "$SCDINO_VENV_NOTE"'],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True).stdout
    venv, note = out.split("\n")[:2]
    return venv, note


def test_a_node_follows_the_active_bundle_and_each_job_takes_its_own_bundle_s_environment(node, tmp_path):
    """A static node booted with the old requirements; another node installed a bundle with new ones."""
    shared = tmp_path / "fsx" / "venvs"
    node["env"]["SCDINO_SHARED_VENVS"] = str(shared)
    old, new = "torch==0.1\n", "pip\n"
    _image_venv(node, old)  # this node's image was built from the old requirements
    old_pointer = _publish(node, "old111", mtime=1_000, requirements=old, name="seen-by-this-node.json")
    _install(node, old_pointer)
    assert not node["image_venv"].is_symlink()
    _shared_environment(shared / _requirements_id(new))
    # Another node, from the official image, installs a later deploy's bundle: its own /opt in place of this one's.
    (node["root"] / "opt").rename(node["root"] / "opt-this-node")
    (node["root"] / "opt").mkdir()
    _install(node, _publish(node, "new222", mtime=2_000, requirements=new))
    (node["root"] / "opt").rename(node["root"] / "opt-other-node")
    (node["root"] / "opt-this-node").rename(node["root"] / "opt")
    assert (node["apps"] / "scdino").resolve() == node["apps"] / "scdino-new222"
    # A job of the old bundle, on this node: its bundle's environment is this node's (the image's).
    assert _env_sh_venv(node["apps"] / "scdino-old111", node) == (str(node["apps"] / "scdino-old111" / ".venv"), "")
    # A job of the new bundle here finds no environment of its requirements on this node but the one on FSx.
    assert _env_sh_venv(node["apps"] / "scdino", node) == (str(shared / _requirements_id(new)), "")
    # The bootstrap runs again here with the pointer it read before the deploy: it leaves the newer bundle
    # active, and this node's environment now follows that bundle's requirements.
    result = _install(node, old_pointer)
    assert "is newer than ours" in result.stdout and "follows the active bundle" in result.stdout
    assert node["image_venv"].resolve() == shared / _requirements_id(new)
    assert _imports_training(node["image_venv"] / "bin" / "python")  # the .pth names /apps/scdino there too
    assert _env_sh_venv(node["apps"] / "scdino", node) == (str(node["apps"] / "scdino-new222" / ".venv"), "")
    # The old bundle's job now takes the image's environment, set aside beside this node's.
    assert _env_sh_venv(node["apps"] / "scdino-old111", node) == (f"{node['image_venv']}.image", "")
    # Requirements no environment was built from: the bundle's .venv, and a note naming them.
    (node["apps"] / "scdino-old111" / "requirements.txt").write_text("numpy==0.1\n")
    venv, note = _env_sh_venv(node["apps"] / "scdino-old111", node)
    assert venv == str(node["apps"] / "scdino-old111" / ".venv")
    assert note == f"no environment on this node was built from the bundle's requirements " \
                   f"({_requirements_id('numpy==0.1' + chr(10))})"


def test_the_head_node_notes_a_pointer_newer_than_its_configuration(node):
    result = _install(node, _publish(node, "new222", mtime=2_000), "old111")
    assert "note: configuration names bundle old111, the pointer new222" in result.stdout


@pytest.mark.parametrize("args, message", [
    ((), "usage:"),
    (("https://example.com/current.json",), "the pointer must be an s3://...json URI"),
    (("s3://bucket/bootstrap/current.json",), "bundle has no requirements.txt"),
])
def test_fails_loudly_without_leaving_a_ready_install(node, args, message):
    _publish(node, "empty", mtime=1_000, requirements=None)
    install_dir = node["apps"] / "scdino"
    result = _run(node, *args, str(install_dir)) if args else _run(node)
    assert result.returncode != 0
    assert "ERROR" in result.stdout and message in result.stdout
    assert message in node["log"].read_text()
    assert not install_dir.exists()


def _site_partition(install_dir: Path) -> str:
    """The partition slurm/env.sh takes on a node whose bundle is `install_dir` (SCDINO_HOME)."""
    env = {"PATH": "/usr/bin:/bin", "SCDINO_HOME": str(install_dir)}
    return subprocess.run(["bash", "-c", 'source slurm/env.sh && echo "$SCDINO_PARTITION"'], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_cluster_shape_lands_beside_the_bundle_and_follows_the_newest_pointer(node):
    from stacks.shared.presets import node_shape

    install_dir = node["apps"] / "scdino"
    _install(node, _publish(node, "abc123", mtime=1_000, cluster=node_shape(["g4dn.12xlarge", "p4d.24xlarge"])))
    site = install_dir / "cluster.env"
    assert stat.S_IMODE(site.stat().st_mode) == 0o644  # every user's jobs source it
    assert _site_partition(install_dir) == "gpu-g4dn12xl"
    # A deploy that changes only the presets: the same bundle, a newer pointer (the head node's OnNodeUpdated).
    result = _install(node, _publish(node, "abc123", mtime=2_000, cluster=node_shape(["p5.48xlarge"])))
    assert "already installed" in result.stdout and "cluster shape in" in result.stdout
    assert _site_partition(install_dir) == "gpu-p548xl"
    # A slow node that read an older pointer leaves the shape alone, as it leaves the bundle.
    slow = _publish(node, "abc123", mtime=1_500, name="seen-by-a-slow-node.json", cluster=node_shape(["g5.12xlarge"]))
    _install(node, slow)
    assert _site_partition(install_dir) == "gpu-p548xl"


def test_a_pointer_without_a_cluster_shape_leaves_env_sh_its_defaults(node):
    result = _install(node, _publish(node, "abc123", mtime=1_000))
    assert "the pointer has no cluster shape (an older deploy)" in result.stdout
    assert not (node["apps"] / "scdino" / "cluster.env").exists()
    assert _site_partition(node["apps"] / "scdino") == "gpu-g4dn12xl"


def test_a_malformed_cluster_shape_fails_the_node_naming_the_field(node):
    """The shape ends up in a file every job sources: a queue name that is not one is refused, not written."""
    bad = {"presets": [{"instance_type": "p5.48xlarge", "queue": "gpu-p548xl; reboot", "gpus_per_node": 8,
                        "cpus_per_gpu": 24}]}
    result = _run(node, _publish(node, "abc123", mtime=1_000, cluster=bad), str(node["apps"] / "scdino"))
    assert result.returncode != 0
    assert '"cluster" preset 0: queue must match' in result.stdout and "ERROR: could not write" in result.stdout
    assert not (node["apps"] / "scdino").exists()


def test_lock_wait_stays_below_parallelcluster_node_bootstrap_timeout(pcluster_constants):
    (wait,) = re.findall(r"^readonly LOCK_WAIT_SECONDS=(\d+)$", SCRIPT.read_text(), flags=re.M)
    # The wait plus the install that follows it must fit in the node's bootstrap timeout.
    assert int(wait) <= pcluster_constants["NODE_BOOTSTRAP_TIMEOUT"] - 300


def _gpu_compute_node(node: dict) -> None:
    (node["root"] / "cfnconfig").write_text("cfn_node_type=ComputeFleet\n")
    (node["bin"] / "nvidia-smi").write_text("#!/bin/sh\n")
    (node["bin"] / "nvidia-smi").chmod(stat.S_IRWXU)


def test_a_gpu_compute_node_appends_the_agent_configuration_the_same_each_run(node):
    from tests.support.cloudwatch_agent_keys import check_agent_config

    _gpu_compute_node(node)
    pointer = _publish(node, "abc123", mtime=1_000, monitoring=MONITORING)
    first = _install(node, pointer)
    config_path = Path(node["env"]["SCDINO_CWAGENT_CONFIG"])
    config, first_text = json.loads(config_path.read_text()), config_path.read_text()
    check_agent_config(config)
    emf_log = Path(node["env"]["SCDINO_EMF_DIR"]) / "emf.log"
    assert config["metrics"]["namespace"] == "scdino-hpc/GPU"
    items = config["logs"]["logs_collected"]["files"]["collect_list"]
    assert {item["log_group_name"] for item in items} == {MONITORING["log_group"]}
    assert str(emf_log) in {item["file_path"] for item in items}
    assert stat.S_IMODE(emf_log.parent.stat().st_mode) == 0o1777
    env_file = Path(node["env"]["SCDINO_MONITORING_ENV"])
    exported = subprocess.run(["bash", "-c", f"source {env_file} && env"], capture_output=True, text=True,
                              check=True).stdout
    assert f"SCDINO_EMF_LOG={emf_log}" in exported and "SCDINO_EMF_NAMESPACE=scdino-hpc/Training" in exported
    assert "CloudWatch agent: GPU metrics in scdino-hpc/GPU" in first.stdout
    _install(node, pointer)
    calls = Path(node["env"]["FAKE_CTL_LOG"]).read_text().splitlines()
    assert calls == [f"-a append-config -m ec2 -s -c file:{config_path}"] * 2
    assert config_path.read_text() == first_text


def test_no_agent_configuration_on_the_head_node_or_without_gpus(node):
    (node["root"] / "cfnconfig").write_text("cfn_node_type=HeadNode\n")
    _install(node, _publish(node, "abc123", mtime=1_000, monitoring=MONITORING))
    (node["root"] / "cfnconfig").write_text("cfn_node_type=ComputeFleet\n")
    result = _install(node, _publish(node, "abc123", mtime=1_000, monitoring=MONITORING))
    assert "no nvidia-smi: no GPU monitoring" in result.stdout
    assert not Path(node["env"]["SCDINO_CWAGENT_CONFIG"]).exists()
    assert not Path(node["env"]["FAKE_CTL_LOG"]).exists()


def test_a_monitoring_failure_is_logged_and_the_node_still_installs(node):
    _gpu_compute_node(node)
    pointer = _publish(node, "abc123", mtime=1_000, monitoring=MONITORING)
    (node["s3"] / "bootstrap" / "cloudwatch-agent.json").write_text('{"metrics": {"namespace": "@TYPO@"}}')
    result = _install(node, pointer)
    assert "WARNING: monitoring was not set up" in result.stdout and "done" in result.stdout
    assert (node["apps"] / "scdino").resolve() == node["apps"] / "scdino-abc123"


# --- AWS PCS: bootstrap/pcs-node.sh, then the same bootstrap -------------------------------------------

PCS_NODE = REPO_ROOT / "bootstrap" / "pcs-node.sh"
FAKE_SYSTEM = {
    "mount": """#!/usr/bin/env bash
# Fake mount: records its arguments and the mount point; a bind mount shows the source at the target (as a link).
echo "mount $*" >> "${FAKE_CALLS}"
echo "${@: -1}" >> "${FAKE_MOUNTS}"
if [[ "$1" == --bind ]]; then rmdir "$3"; ln -s "$2" "$3"; fi
""",
    "mountpoint": """#!/usr/bin/env bash
# Fake mountpoint: a directory is a mount point while the mount table of this boot lists it.
[[ "$1" == -q ]] && shift
grep -qsxF -- "$1" "${FAKE_MOUNTS}"
""",
    "systemctl": '#!/usr/bin/env bash\necho "systemctl $*" >> "${FAKE_CALLS}"\n',
    "nvidia-smi": "#!/bin/sh\n",
}
PCS_SETTINGS = {"SCDINO_FSX_DNS": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
                "SCDINO_FSX_MOUNT_NAME": "abcdefgh", "SCDINO_REGION": "us-east-1", "SCDINO_BOOTSTRAP_URI": "s3://bucket/bootstrap/on-node-configured.sh",
                "SCDINO_POINTER_URI": "s3://bucket/bootstrap/current.json"}
"""What the user data exports above the node script (the node type apart)."""


def _pcs_node(node: dict, node_type: str) -> dict:
    """The PCS node's directories under the test's root, the fakes on PATH, the bootstrap in the bucket."""
    root = node["root"]
    for name, script in FAKE_SYSTEM.items():
        (node["bin"] / name).write_text(script)
        (node["bin"] / name).chmod(stat.S_IRWXU)
    (node["s3"] / "bootstrap").mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, node["s3"] / "bootstrap" / "on-node-configured.sh")
    paths = {"fsx": root / "fsx", "apps": root / "apps", "scratch": root / "scratch", "fstab": root / "etc" / "fstab",
             "profile": root / "etc" / "profile.d", "calls": root / "calls.log", "mounts": root / "mounts",
             "systemd": root / "etc" / "systemd" / "system", "node_env": root / "etc" / "scdino" / "pcs-node.env"}
    (root / "etc").mkdir(exist_ok=True)
    # No instance-store disks: /scratch is tested on real block devices (tests/bootstrap/test_pcs_node_disks.py).
    env = {**node["env"], "FAKE_CALLS": str(paths["calls"]), "FAKE_MOUNTS": str(paths["mounts"]),
           "SCDINO_INSTANCE_STORE_DISKS": "", **PCS_SETTINGS, "SCDINO_NODE_TYPE": node_type,
           "SCDINO_FSX_DIR": str(paths["fsx"]), "SCDINO_APPS_DIR": str(paths["apps"]),
           "SCDINO_SCRATCH_DIR": str(paths["scratch"]), "SCDINO_FSTAB": str(paths["fstab"]),
           "SCDINO_PROFILE_DIR": str(paths["profile"]), "SCDINO_SYSTEMD_DIR": str(paths["systemd"]),
           "SCDINO_NODE_ENV": str(paths["node_env"]),
           "SCDINO_NODE_SCRIPT_COPY": str(root / "opt" / "scdino" / "pcs-node.sh"),
           "SCDINO_BOOTSTRAP_COPY": str(root / "opt" / "scdino" / "on-node-configured.sh")}
    return {**paths, "env": env}


def _run_pcs_node(pcs: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PCS_NODE)], env=pcs["env"], capture_output=True, text=True, timeout=300,
                          check=False)


def test_a_pcs_gpu_node_mounts_fsx_with_flock_installs_onto_fsx_and_monitors(node):
    _publish(node, "abc123", mtime=1_000, monitoring=MONITORING)
    pcs = _pcs_node(node, "ComputeFleet")
    assert not Path(node["env"]["SCDINO_CLUSTER_CONFIG"]).exists()  # no ParallelCluster node facts on PCS
    result = _run_pcs_node(pcs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    calls = pcs["calls"].read_text().splitlines()
    source = "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh"
    assert f"mount -t lustre -o relatime,flock {source} {pcs['fsx']}" in calls
    assert pcs["fstab"].read_text().startswith(f"{source} {pcs['fsx']} lustre defaults,relatime,flock,_netdev")
    # /apps is the file system's directory, so the bundle installed once is every node's /apps/scdino.
    assert f"mount --bind {pcs['fsx']}/.scdino/apps {pcs['apps']}" in calls
    assert (pcs["apps"] / "scdino").resolve() == (pcs["fsx"] / ".scdino" / "apps" / "scdino-abc123").resolve()
    assert _imports_training(pcs["apps"] / "scdino" / ".venv" / "bin" / "python")
    assert (pcs["profile"] / "scdino-region.sh").read_text() == "export AWS_DEFAULT_REGION=us-east-1\n"
    log = node["log"].read_text()
    assert "node type ComputeFleet" in log and "CloudWatch agent: GPU metrics in scdino-hpc/GPU" in log
    # Rerun while everything is mounted: nothing mounted or formatted twice, one fstab line.
    assert _run_pcs_node(pcs).returncode == 0
    assert [call for call in pcs["calls"].read_text().splitlines() if not call.startswith("systemctl")] == [
        call for call in calls if not call.startswith("systemctl")]
    assert len(pcs["fstab"].read_text().splitlines()) == 1


def test_a_pcs_login_node_installs_the_same_bundle_without_gpu_monitoring(node):
    _publish(node, "abc123", mtime=1_000, monitoring=MONITORING)
    pcs = _pcs_node(node, "LoginNode")
    result = _run_pcs_node(pcs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "no instance-store NVMe" in result.stdout
    assert "node type LoginNode" in node["log"].read_text()
    assert (pcs["apps"] / "scdino").resolve().parent == (pcs["fsx"] / ".scdino" / "apps").resolve()
    assert not Path(node["env"]["SCDINO_CWAGENT_CONFIG"]).exists()


def test_a_pcs_node_refuses_an_unknown_node_type(node):
    pcs = _pcs_node(node, "HeadNode")
    result = _run_pcs_node(pcs)
    assert result.returncode != 0 and "SCDINO_NODE_TYPE must be ComputeFleet or LoginNode" in result.stdout
    assert not pcs["calls"].exists()


def test_the_pcs_node_script_s_places_are_the_cluster_layout():
    from stacks.shared.constants import APPS_MOUNT_DIR, BUNDLE_DIR, FSX_MOUNT_DIR, SCRATCH_DIR

    text = PCS_NODE.read_text()
    for variable, path in (("FSX_DIR", FSX_MOUNT_DIR), ("APPS_DIR", APPS_MOUNT_DIR), ("SCRATCH_DIR", SCRATCH_DIR)):
        assert f"readonly {variable}=${{SCDINO_{variable}:-{path}}}" in text, variable
    assert '"${APPS_DIR}/scdino"' in text and BUNDLE_DIR == f"{APPS_MOUNT_DIR}/scdino"
