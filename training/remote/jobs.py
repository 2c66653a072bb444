"""The planner's chain (training/chain) as REST job descriptions, submitted in order; the submission record.

slurmrestd reads no #SBATCH line: `job_options` merges a script's #SBATCH lines with the planner's options
(the latter winning, as on sbatch's command line), and fields.py maps them onto the API version's fields.

The chain starts with one job of its own, `arrival`: the configuration goes up to the bucket and reaches
the file system through the association's auto-import a little later, so the job waits for it (at most
ARRIVAL_MINUTES) and makes the run's log folder, in which every later job writes its log (Slurm opens a
job's log before its script runs, and fails a job whose log folder is missing).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

from training.chain import JobSpec
from training.chain.sbatch import script_options
from training.remote.fields import JobRequest
from training.remote.rest import SlurmRest
from training.rundir import RunLayout

ARRIVAL = "arrival"
ARRIVAL_MINUTES = 15


def job_options(job: JobSpec, bundle: Path, log_dir: str, ids: Mapping[str, str]) -> dict[str, str | bool | None]:
    """sbatch's options of a planned job as a REST submission sends them: the script's #SBATCH lines, the
    planner's options over them, its log in the run's log folder, its dependency on the jobs it waits for."""
    options: dict[str, str | bool | None] = {**script_options(bundle / job.script), **job.sbatch}
    options["output"] = f"{log_dir}/{Path(str(options.get('output', '%x_%j.out'))).name}"
    waits = [ids[label] for label in job.after] + list(job.after_ids)
    if waits:
        options["dependency"] = f"afterok:{':'.join(waits)}"
        options["kill-on-invalid-dep"] = "yes"
    return {name: value if value is not True else None for name, value in options.items()}


def arrival_script(config: str, log_dir: str) -> str:
    """The chain's first job: wait for the uploaded configuration on the file system, make the log folder."""
    return "\n".join([
        "#!/bin/bash",
        "# Submitted by `python -m training remote submit` (training/remote/jobs.py): the configuration went up",
        "# to the bucket; the data repository association imports it onto the file system within seconds",
        f"# to minutes. Wait for it (at most {ARRIVAL_MINUTES} min), then make the log folder of the run.",
        "set -euo pipefail",
        f"config={shlex.quote(config)}",
        f"for _ in $(seq {ARRIVAL_MINUTES * 12}); do [ -r \"$config\" ] && break; sleep 5; done",
        f'[ -r "$config" ] || {{ echo "$config: not on the file system after {ARRIVAL_MINUTES} min: is the '
        'data repository association importing (aws fsx describe-data-repository-associations)?" >&2; exit 1; }',
        f"mkdir -p {shlex.quote(log_dir)}",
        'echo "$config arrived; logs in ' + log_dir.replace('"', '\\"') + '"',
        ""])


@dataclass(frozen=True)
class Submitted:
    """One submitted job, as the submission record keeps it."""

    label: str
    job_id: str
    name: str
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Submission:
    """What `remote submit` did: where, with which API version, which jobs; kept beside the run in the bucket."""

    run: str
    """The run folder on the cluster, e.g. /fsx/data/runs/NAME."""
    config: str
    """The configuration the jobs read, on the cluster."""
    api: str
    endpoint: str
    submitted: str
    jobs: tuple[Submitted, ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Submission:
        data = json.loads(text)
        jobs = tuple(Submitted(**{**job, "after": tuple(job.get("after", ()))}) for job in data.pop("jobs", []))
        return cls(**data, jobs=jobs)


def submit_chain(api: SlurmRest, jobs: list[JobSpec], *, bundle: Path, slurm_dir: str, run: str, config: str,
                 environment: dict[str, str], on_job=lambda label, job_id: None) -> list[Submitted]:
    """Submit `arrival`, then the planned jobs in order, each after the jobs it waits for (and the first ones
    after `arrival`); the jobs run the cluster's copies of the scripts' text (bundle: the local copy of the
    bundle; slurm_dir: where the cluster has its slurm/)."""
    log_dir = RunLayout(Path(run)).logs.as_posix()
    ids: dict[str, str] = {}
    done: list[Submitted] = []
    environment = {**environment, "SCDINO_SLURM_DIR": slurm_dir}

    def send(label: str, request: JobRequest, after: tuple[str, ...]) -> None:
        ids[label] = api.submit(request)
        done.append(Submitted(label, ids[label], str(request.options.get("job-name", label)), after))
        on_job(label, ids[label])

    arrival = {"job-name": f"scdino-{ARRIVAL}", "ntasks": "1", "cpus-per-task": "1",
               "time": str(ARRIVAL_MINUTES + 5),  # its wait, and time to start and to say why it gave up
               "output": "/tmp/scdino-arrival-%j.out"}
    first = jobs[0].sbatch.get("partition") if jobs else None
    if first:
        arrival["partition"] = str(first)
    send(ARRIVAL, JobRequest(arrival_script(config, log_dir), (), environment, "/tmp", arrival), ())
    for job in jobs:
        after = job.after or (ARRIVAL,)
        spec = JobSpec(job.label, job.script, job.args, job.sbatch, after, job.after_ids)
        options = job_options(spec, bundle, log_dir, ids)
        script = (bundle / job.script).read_text()
        send(job.label, JobRequest(script, tuple(job.args), environment, run, options), after)
    return done
