"""The cluster's shape reaches its nodes, rehearsed without AWS. The app is synthesised from a settings
file of p5 nodes only (ParallelCluster) and from one of g4dn + p4d nodes (ParallelCluster and AWS PCS),
as `npx cdk deploy -c settings=...` would; the nodes' site file is rendered from the synthesised pointer
by the code the node bootstrap runs (bootstrap/cluster-env.py); the local Slurm cluster is started with
that site file (its partitions, the first the default); and docs/deploy.md's submission commands run as
written, read out of the guide, with nothing exported by hand: each chain lands in the partition the
guide promises and completes.

The commands run as the guide writes them, but for two things: /apps/scdino is this checkout (the
bundle is its training/ + slurm/), and `--to prepare` ends each chain after its first step, so that the
test takes seconds (the whole chain runs in test_pipeline.py). Each command runs in a user's folder of its
own whose demo.yaml is the tiny run of slurm_helpers.py on a small synthetic dataset, not the demo's.

The local cluster is shared: the test waits until no job is queued before it changes the cluster's
partitions, and starts the usual cluster again at the end, failed or not."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from stacks.shared.constants import BUNDLE_DIR
from stacks.shared.presets import PRESETS
from stacks.shared.settings import load_settings_file
from tests.support.cdk_synth import cluster_config, node_pointer, resources, synthesize
from tests.support.local_slurm import LOCAL_SLURM, REPO, TINY_PIPELINE, Cluster, log_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

GUIDE = REPO / "docs" / "deploy.md"
SUBMITTER = f"{BUNDLE_DIR}/slurm/submit_pipeline.sh"
SHAPE_VARIABLES = ("SCDINO_PARTITION", "SCDINO_GPUS_PER_NODE", "SCDINO_CPUS_PER_GPU", "SCDINO_INSTANCE_TYPE",
                   "SCDINO_CPUS_PER_TASK", "SCDINO_PRESET", "SCDINO_CLUSTER_ENV")
QUIET_TIMEOUT = 600
"""Seconds to wait for the shared cluster's queue to empty (another session's demo may be running)."""


def guide_submissions() -> list[list[str]]:
    """Each `/apps/scdino/slurm/submit_pipeline.sh ...` command of the guide's shell blocks, as words."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == SUBMITTER:
                commands.append(words)
    return commands


def the_other_preset(command: list[str]) -> str | None:
    return command[command.index("--preset") + 1] if "--preset" in command else None


def default_partition(synth, backend: str) -> str:
    """Where `sbatch` without --partition goes on the synthesised cluster: ParallelCluster's first queue, or
    the PCS queue that carries Default=YES."""
    if backend == "parallelcluster":
        return cluster_config(synth)["Scheduling"]["SlurmQueues"][0]["Name"]
    default = {"SlurmCustomSettings": [{"ParameterName": "Default", "ParameterValue": "YES"}]}
    (name,) = [queue["Properties"]["Name"] for queue in resources(synth.json["cluster"], "AWS::PCS::Queue").values()
               if queue["Properties"].get("SlurmConfiguration") == default]
    return name


def site_file(tmp_path: Path, backend: str, presets: list[str]) -> Path:
    """Synthesise the app from a settings file, then render the nodes' site file from its pointer."""
    settings = tmp_path / "my-settings.yaml"
    settings.write_text(yaml.safe_dump({"backend": backend, "cluster": {"presets": presets, "max_nodes": 2}}))
    synth = synthesize(tmp_path / "cdk.out", load_settings_file(str(settings)))
    pointer = node_pointer(synth)
    (tmp_path / "current.json").write_text(json.dumps(pointer))
    site = tmp_path / "cluster.env"
    subprocess.run(["python3", str(REPO / "bootstrap" / "cluster-env.py"), str(tmp_path / "current.json"), str(site)],
                   check=True)
    assert pointer["cluster"]["presets"][0]["queue"] == default_partition(synth, backend) == PRESETS[presets[0]].queue_name
    return site


def wait_for_an_empty_queue(cluster: Cluster) -> None:
    deadline = time.monotonic() + QUIET_TIMEOUT
    while cluster.run("squeue", "-h").strip():
        if time.monotonic() > deadline:
            pytest.fail(f"the local cluster still has jobs after {QUIET_TIMEOUT} s (another session's?): "
                        "run this test when `squeue` is empty", pytrace=False)
        time.sleep(5)


def start_local_cluster(site: Path | None) -> None:
    """scripts/local-slurm.sh start with `site` as the cluster's site file (None: the usual cluster)."""
    env = {key: value for key, value in os.environ.items() if key not in SHAPE_VARIABLES}
    if site:
        env["SCDINO_CLUSTER_ENV"] = str(site)
    result = subprocess.run([str(LOCAL_SLURM), "start"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def shared_cluster(cluster):
    """The session's local cluster, started again as usual when the module ends."""
    yield cluster
    wait_for_an_empty_queue(cluster)
    start_local_cluster(None)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    from training.data.synthetic.folders import write_dataset

    root = tmp_path_factory.mktemp("images")
    write_dataset(root, classes=2, per_class=12)
    return root


def user_folder(folder: Path, images: Path) -> Path:
    """What the guide's first steps leave in a user's folder: demo.yaml (here the tiny run) and its images."""
    folder.mkdir()
    config = {**TINY_PIPELINE, "data": {**TINY_PIPELINE["data"], "source": str(images)}}
    (folder / "demo.yaml").write_text(yaml.safe_dump(config))
    return folder


def submit(cluster: Cluster, site: Path, command: list[str], folder: Path) -> subprocess.CompletedProcess:
    """The guide's command, the bundle path this checkout, stopping after prepare; only the site file is set."""
    env = {key: value for key, value in cluster.env.items() if key not in SHAPE_VARIABLES}
    env["SCDINO_CLUSTER_ENV"] = str(site)  # where the node bootstrap writes it: /apps/scdino/cluster.env
    words = [str(REPO / word.removeprefix(f"{BUNDLE_DIR}/")) if word.startswith(BUNDLE_DIR) else word
             for word in command]
    return subprocess.run([*words, "--to", "prepare"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)


CLUSTERS = [
    pytest.param("parallelcluster", ["p5.48xlarge"], id="p5-only"),
    pytest.param("parallelcluster", ["g4dn.12xlarge", "p4d.24xlarge"], id="g4dn+p4d"),
    pytest.param("pcs", ["g4dn.12xlarge", "p4d.24xlarge"], id="g4dn+p4d-pcs"),
]


@pytest.mark.parametrize("backend, presets", CLUSTERS)
def test_the_guide_s_submissions_land_on_the_cluster_s_partitions(shared_cluster, images, tmp_path, backend, presets):
    commands = guide_submissions()
    assert [the_other_preset(command) for command in commands] == [None, "p4d.24xlarge"], commands
    site = site_file(tmp_path, backend, presets)
    wait_for_an_empty_queue(shared_cluster)
    start_local_cluster(site)
    partitions = shared_cluster.run("sinfo", "-h", "-o", "%P").split()
    assert partitions == [PRESETS[presets[0]].queue_name + "*", *(PRESETS[name].queue_name for name in presets[1:])]
    # By hand, a script goes to the cluster's default partition: none of them names one.
    held = shared_cluster.sbatch("prepare.slurm", "demo.yaml", cwd=user_folder(tmp_path / "by-hand", images),
                                 options=("--hold",))
    assert shared_cluster.job(held)["Partition"] == PRESETS[presets[0]].queue_name
    shared_cluster.run("scancel", held)
    for index, command in enumerate(commands):
        other = the_other_preset(command)
        folder = user_folder(tmp_path / f"user-{index}", images)
        result = submit(shared_cluster, site, command, folder)
        if other and other not in presets:
            assert result.returncode == 2 and result.stdout == ""
            assert result.stderr.splitlines()[-1].startswith(f"submit_pipeline: error: this cluster has no preset "
                                                            f"'{other}'; its presets: {presets[0]}")
            continue
        assert result.returncode == 0, result.stderr
        (line,) = result.stdout.splitlines()
        step, job = line.split()
        preset = PRESETS[other or presets[0]]
        info = shared_cluster.wait(job, timeout=300)
        assert step == "prepare" and info["JobState"] == "COMPLETED", log_of(folder, info)
        assert (info["Partition"], info["NumCPUs"]) == (preset.queue_name, str(preset.cpus_per_gpu))
