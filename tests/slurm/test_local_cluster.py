"""The local cluster itself, and the generic launcher and all-reduce benchmark jobs on it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.local_slurm import LOCAL_SLURM, REPO, log_of

pytestmark = pytest.mark.slurm


def site_default(name: str) -> str:
    return subprocess.run(["bash", "-c", f'source slurm/env.sh && echo "${name}"'], cwd=REPO,
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout.strip()


def test_cluster_has_two_idle_nodes_in_the_site_partition(cluster):
    out = cluster.run("sinfo", "-h", "-N", "-o", "%N %P %T")
    rows = {tuple(line.split()) for line in out.splitlines()}
    partition = site_default("SCDINO_PARTITION") + "*"
    assert {(node, part) for node, part, _ in rows} == {("node1", partition), ("node2", partition)}
    assert all(state in ("idle", "mixed", "allocated") for _, _, state in rows)


def test_start_again_is_a_quick_no_op(cluster):
    pids = sorted(p.read_text() for p in (cluster.base / "run").glob("*.pid"))
    start = time.monotonic()
    subprocess.run([str(LOCAL_SLURM), "start"], check=True, capture_output=True, timeout=60)
    assert time.monotonic() - start < 10
    assert sorted(p.read_text() for p in (cluster.base / "run").glob("*.pid")) == pids, "no daemon restarted"


def whole_cluster_job(cluster, tmp_path) -> str:
    """A job holding both nodes until cancelled, as an interrupted pretraining does."""
    job = cluster.run("sbatch", "--parsable", "--nodes=2", "--exclusive", f"--output={tmp_path}/held_%j.out",
                      "--wrap", "srun sleep 900", cwd=tmp_path).strip()
    deadline = time.monotonic() + 120
    while cluster.job(job)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} did not start: {cluster.job(job)}"
        time.sleep(0.5)
    return job


def start_again(cluster) -> str:
    result = subprocess.run([str(LOCAL_SLURM), "start"], env=cluster.env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_jobs_left_on_the_cluster_do_not_come_back_after_a_stop(cluster, tmp_path):
    job = whole_cluster_job(cluster, tmp_path)
    stop = subprocess.run([str(LOCAL_SLURM), "stop"], env=cluster.env, capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert f"cancelled 1 job(s) still on the cluster: {job}" in stop.stderr
    start_again(cluster)
    assert cluster.run("squeue", "-h", "-o", "%A") == ""
    # the nodes are free for the next command at once
    job = cluster.run("sbatch", "--parsable", "--nodes=2", f"--output={tmp_path}/after_%j.out", "--wrap", "srun true",
                      cwd=tmp_path).strip()
    assert cluster.wait(job, timeout=120)["JobState"] == "COMPLETED"


def test_jobs_a_stopped_controller_restores_are_cancelled_when_it_starts_again(cluster, tmp_path):
    job = whole_cluster_job(cluster, tmp_path)
    pid = int((cluster.base / "run" / "slurmctld.pid").read_text())
    # The controller stopped by other means than `local-slurm.sh stop` (a shutdown, an older script): it
    # saves its jobs in the state folder and restores them when it starts again.
    cluster.run("scontrol", "shutdown", "slurmctld")
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z":
        assert time.monotonic() < deadline, "slurmctld did not shut down"
        time.sleep(0.2)
    said = start_again(cluster)
    assert "restored from the last run (their processes ended with it)" in said and f" {job}" in said, said
    assert cluster.run("squeue", "-h", "-o", "%A") == ""


def test_torchrun_launcher_runs_ddp_across_both_nodes(cluster, tmp_path):
    out = tmp_path / "ddp.json"
    job = cluster.sbatch("torchrun.slurm", str(REPO / "examples" / "ddp_minimal.py"), "--steps", "5",
                         "--out", str(out), cwd=tmp_path, options=("--nodes=2", "--output=ddp_%j.out"))
    info = cluster.wait(job, timeout=180)
    assert info["JobState"] == "COMPLETED", log_of(tmp_path, info)
    result = json.loads(out.read_text())
    assert result["ok"] and result["params_identical"]
    assert result["world_size"] == 2 and result["backend"] == "gloo"
    mode = (cluster.base / "mode").read_text().strip()
    assert result["hosts"] == (["node1", "node2"] if mode == "netns" else result["hosts"])


def test_allreduce_job_reports_bus_bandwidth_against_expected(cluster, tmp_path):
    (tmp_path / "logs").mkdir()
    job = cluster.sbatch("nccl_tests.slurm", "--sizes", "64K,1M", "--iters", "3", cwd=tmp_path)
    info = cluster.wait(job, timeout=180)
    log = log_of(tmp_path, info)
    assert info["JobState"] == "COMPLETED", log
    assert "nccl-tests skipped" in log, "no GPU here: all_reduce_perf must be skipped, saying why"
    result = json.loads((tmp_path / "logs" / f"allreduce_{job}.json").read_text())
    assert (result["ranks"], result["nodes"], result["backend"]) == (2, 2, "gloo")
    assert [r["bytes"] for r in result["results"]] == [65536, 1048576]
    for row in result["results"]:
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 2 * (2 - 1) / 2, rel=1e-3)
    assert result["busbw_gbs"] == max(r["busbw_gbs"] for r in result["results"]) > 0
    assert result["expected_busbw_gbs"] == 5.0 and result["instance_type"] == "g4dn.12xlarge"
    assert result["verdict"].startswith("informational")
