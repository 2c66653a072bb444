"""The sbatch scripts' conventions, checked without a cluster: shellcheck, commented #SBATCH lines,
section order, no partition of their own, site defaults that match what the CDK app deploys
(stacks/shared/presets.py), and the submitter's choice of preset from the cluster's site file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.local_slurm import REPO

SCRIPTS = sorted((REPO / "slurm").glob("*.slurm"))
SHELL_FILES = [*SCRIPTS, *sorted((REPO / "slurm").glob("*.sh")), REPO / "scripts" / "local-slurm.sh",
               REPO / "scripts" / "demo.sh"]
SECTIONS = ["# --- resources ---", "# --- user variables ---", "# --- environment ---", "# --- launch ---"]
PIPELINE_STEPS = ["prepare", "mean-std", "pretrain", "features", "labels", "knn", "linear", "export", "plots",
                  "report"]


def env_sh_defaults() -> dict[str, str]:
    out = subprocess.run(["bash", "-c", "set -a && source slurm/env.sh && env"], cwd=REPO,
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if line.startswith("SCDINO_"))


def test_shellcheck_is_clean():
    files = [str(p.relative_to(REPO)) for p in SHELL_FILES if p.exists()]
    result = subprocess.run(["shellcheck", "-x", *files], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_one_script_per_pipeline_step():
    assert {p.stem for p in SCRIPTS} >= set(PIPELINE_STEPS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_sbatch_line_is_commented_and_sections_are_in_order(script):
    text = script.read_text()
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            assert re.match(r"#SBATCH \S+\s+# \S", line), f"{script.name}: uncommented: {line}"
    positions = [text.find(section) for section in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), f"{script.name}: sections {positions}"
    assert "set -euo pipefail" in text
    assert "#SBATCH --output=logs/%x_%j.out" in text


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_names_a_partition_the_cluster_may_lack(script):
    """By hand, `sbatch` sends a script to the cluster's default partition; submit_pipeline.sh passes the site's."""
    assert not re.findall(r"^#SBATCH\s+(?:--partition|-p)\b", script.read_text(), re.M)


def _site_file(tmp_path: Path, presets: list[str]) -> Path:
    """The site file the nodes write for a cluster of `presets`, rendered by the bootstrap's own code."""
    from stacks.shared.presets import node_shape

    pointer, site = tmp_path / "current.json", tmp_path / "cluster.env"
    pointer.write_text(json.dumps({"cluster": node_shape(presets)}))
    subprocess.run([sys.executable, str(REPO / "bootstrap" / "cluster-env.py"), str(pointer), str(site)], check=True)
    return site


def _dry_run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "run.yaml").write_text("run: {output_dir: out}\n")
    return subprocess.run([str(REPO / "slurm" / "submit_pipeline.sh"), "run.yaml", "--dry-run", "--to", "mean-std",
                           *args], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)


def test_the_submitter_takes_the_cluster_s_default_preset_or_the_one_named(tmp_path):
    site = str(_site_file(tmp_path, ["g4dn.12xlarge", "p5.48xlarge"]))
    default = _dry_run(tmp_path, SCDINO_CLUSTER_ENV=site)
    assert default.returncode == 0, default.stderr
    assert all("--partition=gpu-g4dn12xl " in line and "--cpus-per-task=12 " in line
               for line in default.stdout.splitlines())
    for name in ("p5.48xlarge", "gpu-p548xl"):  # the instance type as people know it, or the partition
        named = _dry_run(tmp_path, "--preset", name, SCDINO_CLUSTER_ENV=site, SCDINO_PARTITION="gpu-g4dn12xl")
        assert named.returncode == 0, named.stderr
        lines = named.stdout.splitlines()
        assert len(lines) == 2 and all("--partition=gpu-p548xl " in line and "--cpus-per-task=24 " in line
                                       for line in lines)


def test_the_submitter_refuses_a_preset_the_cluster_lacks_in_one_line(tmp_path):
    site = str(_site_file(tmp_path, ["p5.48xlarge"]))
    lacking = _dry_run(tmp_path, "--preset", "p4d.24xlarge", SCDINO_CLUSTER_ENV=site)
    assert lacking.returncode == 2 and lacking.stdout == ""
    assert lacking.stderr.splitlines()[-1] == ("submit_pipeline: error: this cluster has no preset 'p4d.24xlarge'; "
                                               "its presets: p5.48xlarge (partition gpu-p548xl)")
    no_site = _dry_run(tmp_path, "--preset", "p5.48xlarge", SCDINO_CLUSTER_ENV=str(tmp_path / "none.env"))
    assert no_site.returncode == 2 and no_site.stdout == ""
    assert "no cluster site file at" in no_site.stderr and "set SCDINO_PARTITION" in no_site.stderr


def test_env_sh_defaults_match_the_cdk_cluster():
    from stacks.shared.presets import SLURM_DEFAULTS

    defaults = env_sh_defaults()
    for name, value in SLURM_DEFAULTS.items():
        assert defaults[name] == value, f"slurm/env.sh {name}={defaults[name]}, stacks/shared/presets.py says {value}"
    assert defaults["SCDINO_HOME"] == "/apps/scdino"
    assert defaults["SCDINO_VENV"] == "/apps/scdino/.venv"
    assert defaults["SCDINO_FSX"] == "/fsx" and defaults["SCDINO_SCRATCH"] == "/scratch"


def test_env_sh_values_are_overridable():
    env = {"PATH": "/usr/bin:/bin", "SCDINO_PARTITION": "p", "SCDINO_GPUS_PER_NODE": "8"}
    out = subprocess.run(["bash", "-c", "source slurm/env.sh && echo $SCDINO_PARTITION $SCDINO_GPUS_PER_NODE"],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["p", "8"]


def test_submitter_dry_run_chains_every_step_with_afterok(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("run: {output_dir: out}\n")
    out = subprocess.run([str(REPO / "slurm" / "submit_pipeline.sh"), str(config), "--dry-run", "--from", "mean-std",
                          "--to", "knn", "--nodes", "3", "--set", "optim.epochs=2"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert [re.search(r"slurm/(\S+)\.slurm", line).group(1) for line in out] == PIPELINE_STEPS[1:6]
    assert "--dependency" not in out[0]
    for before, line in zip(PIPELINE_STEPS[1:5], out[1:]):
        assert f"--dependency=afterok:<{before}>" in line and "--kill-on-invalid-dep=yes" in line
    assert "--nodes=3" in out[1] and all(line.endswith("--set optim.epochs=2") for line in out)


def test_submitter_rejects_unknown_steps_and_missing_configs(tmp_path):
    script = str(REPO / "slurm" / "submit_pipeline.sh")
    result = subprocess.run([script, str(tmp_path / "none.yaml")], capture_output=True, text=True)
    assert result.returncode == 2 and "config file not found" in result.stderr
    (tmp_path / "c.yaml").write_text("{}\n")
    result = subprocess.run([script, str(tmp_path / "c.yaml"), "--from", "nope"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown step 'nope'" in result.stderr


def _as_nobody(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """COMMAND as the user nobody. The submitter plans the chain with the bundle's Python, which every user
    reads on a cluster (/apps/scdino/.venv); this checkout's venv may link into a home folder that only root
    reads, so nobody may read and search anywhere (CAP_DAC_READ_SEARCH), and still write only where nobody may."""
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *caps, *command], cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)}, capture_output=True, text=True)


def test_a_user_submits_from_a_folder_of_their_own_and_is_told_when_the_folder_is_not_theirs():
    """docs/deploy.md's first login: not root, the bundle's directory root's (as the bootstrap installs it), a
    work folder anyone may make a folder in (mode 1777, as the bootstrap makes /fsx/data/work)."""
    root = Path(tempfile.mkdtemp(prefix="scdino-login-"))
    try:
        root.chmod(0o755)
        bundle, work = root / "apps-scdino", root / "work"
        bundle.mkdir()
        work.mkdir(mode=0o1777)
        work.chmod(0o1777)
        config = root / "demo.yaml"
        config.write_text((REPO / "configs" / "demo.yaml").read_text())
        config.chmod(0o644)
        submit = str(REPO / "slurm" / "submit_pipeline.sh")
        refused = _as_nobody([submit, str(config), "--dry-run"], cwd=bundle)
        assert refused.returncode == 2 and "cannot write the log folder 'logs'" in refused.stderr
        assert "/fsx/data/work/$USER" in refused.stderr and not (bundle / "logs").exists()
        mine = _as_nobody(["mkdir", "-p", str(work / "nobody")], cwd=work)
        assert mine.returncode == 0, mine.stderr
        submitted = _as_nobody([submit, str(config), "--dry-run"], cwd=work / "nobody")
        assert submitted.returncode == 0, submitted.stderr
        assert (work / "nobody" / "logs").stat().st_uid == 65534
        assert all("--output=logs/%x_%j.out" in line for line in submitted.stdout.splitlines())
    finally:
        shutil.rmtree(root)


def launch_args(**env: str) -> list[str]:
    """The srun command line torchrun_all_nodes builds for an allocation described by env
    (srun and scontrol replaced by functions that print their arguments)."""
    script = """
        source slurm/env.sh && source slurm/lib.sh
        srun() { printf '%s\\n' "$@"; }
        scontrol() { echo node1; echo node2; }
        torchrun_all_nodes -m training pretrain --config run.yaml
    """
    base = {"PATH": "/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_ON_NODE": "48", "SCDINO_PYTHON": "/bin/true"}
    out = subprocess.run(["bash", "-c", script], cwd=REPO, env={**base, **env}, capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()


def test_gpu_allocation_gives_one_worker_per_gpu_and_asks_the_step_for_them():
    args = launch_args(SLURM_GPUS_ON_NODE="4")
    assert "--gres=gpu:4" in args and "--nproc_per_node=4" in args
    assert "--ntasks-per-node=1" in args and "--nnodes=2" in args and "--cpus-per-task=48" in args
    assert "--rdzv_endpoint=node1:29507" in args and "--rdzv_backend=c10d" in args
    assert args[args.index("-c") + 1] == 'trap "" USR1; exec "$0" "$@"', "torchrun must ignore USR1"
    assert args[-5:] == ["-m", "training", "pretrain", "--config", "run.yaml"]


def test_cpu_allocation_runs_gloo_workers_without_a_gpu_request():
    args = launch_args(SCDINO_CPU_PROCS_PER_NODE="2")
    assert "--nproc_per_node=2" in args
    assert not any(a.startswith("--gres") for a in args)


def test_cuda_visible_devices_counts_when_slurm_does_not_say():
    args = launch_args(CUDA_VISIBLE_DEVICES="0,1")
    assert "--nproc_per_node=2" in args and not any(a.startswith("--gres") for a in args)


def preempted_launch(tmp_path, requeue_refused: bool) -> subprocess.CompletedProcess:
    """run_healing around a launch that was pre-empted (it leaves the PREEMPTED marker and exits 0),
    with scontrol and sleep replaced by functions that print what they were asked."""
    (tmp_path / "run.yaml").write_text(f"run:\n  output_dir: {tmp_path / 'run'}\n")
    script = """
        set -euo pipefail
        source slurm/env.sh && source slurm/lib.sh
        scontrol() { echo "scontrol $*"; [ -z "$REFUSE" ]; }
        sleep() { echo "sleep $*"; }
        preempted() { mkdir -p "$RUN/checkpoints" && echo USR1 >"$RUN/checkpoints/PREEMPTED"; }
        rc=0
        run_healing "$CONFIG" -- preempted || rc=$?
        echo "rc=$rc"
    """
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SCDINO_PYTHON": sys.executable, "PYTHONPATH": str(REPO),
           "CONFIG": str(tmp_path / "run.yaml"), "RUN": str(tmp_path / "run"), "REFUSE": "1" if requeue_refused else ""}
    return subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_a_preempted_launch_requeues_the_job_and_waits_for_slurm(tmp_path):
    done = preempted_launch(tmp_path, requeue_refused=False)
    assert done.stdout.splitlines() == ["scontrol requeue 7", "sleep 300", "rc=0"], done.stderr


def test_a_refused_requeue_after_preemption_fails_the_job_instead_of_completing_it(tmp_path):
    """Training stopped early: if scontrol will not requeue, the job must not end as a success."""
    done = preempted_launch(tmp_path, requeue_refused=True)
    assert done.stdout.splitlines()[-1] != "rc=0", done.stdout + done.stderr
    assert "sleep 300" not in done.stdout
    assert "scontrol requeue failed; resubmit the job" in done.stderr
