"""After a run: its bill, from Slurm's accounting of its jobs, beside what the planner predicted.

Each job's partition, nodes, allocated CPUs and run time come from the first of these that answers:
`sacct` (Slurm accounting, slurmdbd: a cluster with `cluster.slurm_accounting`), `sacct --completion`
(the job completion log, jobcomp/filetxt: the local cluster) and `scontrol show job` (jobs the
controller still holds, MinJobAge). A job on a preset's queue is billed as the share of its nodes'
vCPUs it held (a whole-node job: its nodes) times the preset's on-demand price in the cluster's
region; its GPU-hours are that node time times the preset's GPUs. On the local cluster (no price)
the unit is core-hours as Slurm allocated them: its nodes declare the CPUs of a preset node, far
more than the machine under them has. The prediction is the row of <run>/plan.json (`plan --save`)
for the preset and node count pretraining ran on.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from training.costs.instances import LOCAL, instance_of_partition
from training.costs.prices import on_demand

log = logging.getLogger(__name__)

FIELDS = "JobID,JobName,Partition,NNodes,AllocCPUS,ElapsedRaw,State"
CLUSTER_CONFIG = Path("/etc/parallelcluster/cfnconfig")
"""ParallelCluster's node facts (cfn_region=...), where the region of a cluster node is read."""


@dataclass(frozen=True)
class JobUse:
    """One job as Slurm accounted it."""

    step: str
    job: str
    partition: str
    nodes: int
    cpus: int
    seconds: int
    state: str


def _run(command: list[str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _parse_sacct(text: str, steps: dict[str, str]) -> list[JobUse]:
    """Each line of a job asked for; an array's tasks (accounting names them JOBID_TASK) count for its step."""
    uses = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 7 or fields[0].split("_")[0] not in steps:
            continue
        job, _name, partition, nodes, cpus, seconds, state = fields[:7]
        uses.append(JobUse(steps[job.split("_")[0]], job, partition, int(nodes or 0), int(cpus or 0),
                           int(seconds or 0), state.split()[0] if state else ""))
    return uses


def _from_scontrol(steps: dict[str, str]) -> list[JobUse]:
    uses = []
    for job, step in steps.items():
        text = _run(["scontrol", "show", "job", "-o", job])
        fields = dict(item.split("=", 1) for item in (text or "").split() if "=" in item)
        start, end = fields.get("StartTime", ""), fields.get("EndTime", "")
        if not (start[:1].isdigit() and end[:1].isdigit()):
            continue
        seconds = int((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())
        uses.append(JobUse(step, job, fields.get("Partition", ""), int(fields.get("NumNodes", "0").split("-")[0]),
                           int(fields.get("NumCPUs", "0")), seconds, fields.get("JobState", "")))
    return uses


def accounting(jobs: list[tuple[str, str]]) -> tuple[list[JobUse], str]:
    """Each job's use and which of Slurm's sources gave it."""
    steps = {job: step for step, job in jobs}
    if not steps:
        return [], "no jobs given"
    ids = ",".join(steps)
    for source, command in (("sacct", ["sacct", "-X"]), ("sacct --completion (job completion log)",
                                                          ["sacct", "--completion"])):
        text = _run([*command, "-n", "-P", "-j", ids, f"--format={FIELDS}"])
        uses = _parse_sacct(text, steps) if text else []
        if uses:
            return uses, source
    uses = _from_scontrol(steps)
    return uses, ("scontrol show job" if uses else "none: neither sacct, sacct --completion nor scontrol knew "
                  "the jobs (accounting off, or the controller forgot them)")


def cluster_name() -> str:
    text = _run(["scontrol", "show", "config"]) or ""
    return next((line.split("=", 1)[1].strip() for line in text.splitlines()
                 if line.split("=", 1)[0].strip() == "ClusterName"), "")


def region(environ: dict[str, str] | None = None) -> str | None:
    """The cluster's region: AWS_REGION or AWS_DEFAULT_REGION, else ParallelCluster's node facts."""
    env = os.environ if environ is None else environ
    found = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if found or not CLUSTER_CONFIG.is_file():
        return found
    return next((line.split("=", 1)[1].strip() for line in CLUSTER_CONFIG.read_text().splitlines()
                 if line.startswith("cfn_region=")), None)


def job_line(use: JobUse, *, local: bool, where: str | None) -> dict[str, Any]:
    """One job's hours and cost: node share x GPUs and x price on a preset, allocated cores locally."""
    hours = use.seconds / 3600
    facts = None if local else instance_of_partition(use.partition)
    line: dict[str, Any] = {**asdict(use), "preset": LOCAL if local else (facts.instance_type if facts
                                                                                 else None)}
    if local or facts is None:
        return {**line, "unit": "core_h", "unit_h": round(use.cpus * hours, 6), "node_h": round(use.nodes * hours, 6),
                "cost_usd": None}
    share = min(1.0, use.cpus / (use.nodes * facts.vcpus)) if use.nodes else 0.0
    node_h = use.nodes * hours * share
    price = on_demand(facts.instance_type, where) if where else None
    return {**line, "unit": "gpu_h", "unit_h": round(node_h * facts.gpus, 6), "node_h": round(node_h, 6),
            "cost_usd": round(node_h * price.usd_per_hour, 4) if price else None,
            "price": asdict(price) if price else None}


def _total(lines: list[dict[str, Any]]) -> dict[str, Any]:
    costs = [line["cost_usd"] for line in lines]
    return {"seconds": sum(line["seconds"] for line in lines), "node_h": round(sum(line["node_h"] for line in lines), 6),
            "unit_h": round(sum(line["unit_h"] for line in lines), 6),
            "cost_usd": round(sum(costs), 2) if costs and None not in costs else None}


def predicted(plan: dict[str, Any] | None, pretrain: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The planner's row for the preset and node count pretraining ran on."""
    if not plan or not pretrain:
        return None
    preset, nodes = pretrain[-1]["preset"], pretrain[-1]["nodes"]
    row = next((r for r in plan.get("rows", []) if r["preset"] == preset and r["nodes"] == nodes), None)
    if row is None:
        return {"note": f"the saved plan has no row for {preset} on {nodes} node(s)"}
    return {"preset": preset, "nodes": nodes, "pretrain_s": row["pretrain"]["pretrain_s"], "wall_h": row["wall_h"],
            "unit_h": row["gpu_h"], "unit": row["unit"], "cost_usd": row["cost_usd"], "bottleneck": row["bottleneck"]}


def build_bill(jobs: list[tuple[str, str]], *, plan: dict[str, Any] | None = None, local: bool | None = None,
               where: str | None = None) -> dict[str, Any]:
    """The run's bill: every job's line, pretraining's and the whole run's totals, the prediction."""
    uses, source = accounting(jobs)
    local = cluster_name() == LOCAL if local is None else local
    where = None if local else (where or region())
    lines = [job_line(use, local=local, where=where) for use in uses]
    pretrain = [line for line in lines if line["step"].split(":")[0] == "pretrain"]
    units = sorted({line["unit"] for line in lines})
    return {"source": source, "cluster": LOCAL if local else "aws", "region": where,
            "unit": "+".join(units) or None, "jobs": lines, "pretrain": _total(pretrain), "total": _total(lines),
            "predicted": predicted(plan, pretrain),
            "note": ("core-hours as Slurm allocated them; no price on the local cluster" if local else
                     "GPU-hours and on-demand cost of the share of each job's nodes it held")}


def combination_bills(bill: dict[str, Any] | None, combinations: list[str]) -> dict[str, Any] | None:
    """comparison.json's bill: per channel combination and per channel-adaptive model (by kind), the
    totals of their jobs ("STEP:COMBINATION" and "STEP:adaptive-KIND[-COMBINATION]" in the
    submitter's labels; kinds have no hyphen)."""
    if not bill:
        return None

    def part(label_ok) -> dict[str, Any]:
        return _total([line for line in bill["jobs"] if label_ok(line["step"].partition(":")[2])])

    per = {combo: part(lambda suffix, c=combo: suffix == c) for combo in combinations}
    kinds = sorted({line["step"].partition(":")[2].removeprefix("adaptive-").split("-")[0]
                    for line in bill["jobs"] if line["step"].partition(":")[2].startswith("adaptive-")})
    adaptive = {kind: part(lambda suffix, k=kind: suffix == f"adaptive-{k}" or suffix.startswith(f"adaptive-{k}-"))
                for kind in kinds}
    return {"unit": bill["unit"], "source": bill["source"], "per_combination": per,
            "channel_adaptive": adaptive or None, "total": bill["total"]}
