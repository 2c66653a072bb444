"""The remote commands' work (training/steps/remote.py parses their arguments): submit, status, fetch,
cancel and tunnel against the deployment a Target names (target.py)."""

from __future__ import annotations

import argparse
import posixpath
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
"""Job states after which a job runs nothing more. A pre-empted job is not among them: pretraining, the chain's
pre-emptible job, requeues itself and resumes."""
RUN = RunLayout(Path("."))
"""A run's layout relative to its folder: the run files' paths as the bucket lists them under the run."""


def relative(path: Path) -> str:
    return path.as_posix()


@contextmanager
def aws_errors(target):
    """AWS's refusals and unreachable endpoints as one line each (training/upload/s3.py words S3's)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from training.upload.s3 import explain

    try:
        yield
    except (BotoCoreError, ClientError) as error:
        known = explain(error, target.bucket)
        if known is not None:
            raise known from None
        raise UserError(f"AWS in {target.region}: {str(error).splitlines()[0]}") from None


def run_folder(target, config: Config, args: argparse.Namespace) -> str:
    """The run's folder on the cluster: the argument (absolute, or under the data folder), else --config's."""
    if args.run:
        path = args.run if args.run.startswith("/") else posixpath.join(target.cluster_data, args.run)
        return posixpath.normpath(path)
    if args.config is None:
        raise UserError(f"remote {args.action}: name the run (e.g. runs/NAME, its folder under {target.cluster_data}) "
                        "or give its --config")
    return posixpath.normpath(str(config.run.output_dir))


def folder_of(target, session, run_dir: str):
    from training.remote.bucket import RunFolder

    return RunFolder(session.client("s3"), target.bucket, target.record.data_prefix, target.cluster_data, run_dir)


def rest_api(target, session, last=None):
    """The REST API with a token read now, checked; the OpenAPI document of LAST (the API an earlier look used),
    when given, rather than reading it again (hundreds of kilobytes through the tunnel)."""
    from training.remote.rest import SlurmRest
    from training.remote.target import token, tunnel_hint

    found, user = token(target, session)
    api = SlurmRest(target.endpoint, found, user=user, hint=tunnel_hint(target),
                    openapi=last.openapi() if last is not None else None)
    api.check()
    return api


def submission_of(folder):
    """The submission record beside the run folder, None when there is none."""
    from training.remote.bucket import get_bytes
    from training.remote.jobs import Submission

    raw = get_bytes(folder.s3, folder.bucket, folder.key_of(folder.run + ".jobs.json"))
    return None if raw is None else Submission.from_json(raw.decode())


# --- submit ----------------------------------------------------------------------------------------------

def submit(target, session, config: Config, args: argparse.Namespace) -> int:
    from training.chain import ChainOptions, plan
    from training.chain.sbatch import BUNDLE
    from training.remote.bucket import exists_in
    from training.remote.jobs import Submission, submit_chain
    from training.remote.target import job_environment

    if args.config is None:
        raise UserError("remote submit: give the run's --config (YAML); its run.output_dir is the run's folder on "
                        f"the cluster, under {target.cluster_data}")
    run_dir = posixpath.normpath(str(config.run.output_dir))
    folder = folder_of(target, session, run_dir)
    config_key = folder.key_of(run_dir + ".yaml")  # also refuses a run outside the data folder
    model = profile_model(target, folder, args.profile) if args.profile else ""
    api = rest_api(target, session)
    offered = api.offered()
    print(f"Slurm REST API {api.version} at {target.endpoint} (the server offers {', '.join(offered)})",
          file=sys.stderr)
    shape = site_of(target)
    options = ChainOptions(first=args.first, last=args.last, nodes=args.nodes, prepare_tasks=args.prepare_tasks,
                           ingest_tasks=args.ingest_tasks, overrides=tuple(args.overrides), profile=model)
    chain = plan(args.config, options, shape, exists=exists_in(folder), config_arg=run_dir + ".yaml")
    for line in chain.skipped:
        print(line, file=sys.stderr)
    folder.s3.upload_file(str(args.config), folder.bucket, config_key)
    print(f"config: s3://{folder.bucket}/{config_key} (on the cluster {run_dir}.yaml)", file=sys.stderr)
    environment = job_environment(target, dict(pair_of(pair) for pair in args.env))
    jobs = submit_chain(api, list(chain.jobs), bundle=BUNDLE, slurm_dir=f"{target.bundle}/slurm", run=run_dir,
                        config=run_dir + ".yaml", environment=environment,
                        on_job=lambda label, job_id: print(f"{label} {job_id}", flush=True))
    record = Submission(run=run_dir, config=run_dir + ".yaml", api=api.version, endpoint=target.endpoint,
                        submitted=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), jobs=tuple(jobs))
    folder.s3.put_object(Bucket=folder.bucket, Key=folder.key_of(run_dir + ".jobs.json"), Body=record.to_json().encode())
    print(f"{len(jobs)} jobs submitted; follow them with: python -m training remote status {run_dir} --follow",
          file=sys.stderr)
    return 0


def profile_model(target, folder, model: str) -> str:
    """--profile's model as the jobs name it on the cluster: a run's folder or a checkpoint file, absolute or under
    the data folder. One line when the bucket shows no checkpoint there: without one the chain's first job would
    fail, minutes after the upload and the arrival wait."""
    from training.chain.graph import profile_checkpoint
    from training.remote.bucket import exists_in

    path = posixpath.normpath(model if model.startswith("/") else posixpath.join(target.cluster_data, model))
    checkpoint = profile_checkpoint(path)
    try:
        key = folder.key_of(checkpoint)
    except UserError:  # not exported to the bucket: only the cluster can tell, and profile-setup does
        print(f"--profile {model}: {checkpoint} is outside {target.cluster_data}, not in the bucket; the chain's "
              "first job (profile-setup) checks that it is there", file=sys.stderr)
        return path
    if exists_in(folder)(Path(checkpoint)):
        return path
    where = f"s3://{folder.bucket}/{key} (on the cluster {checkpoint})"
    if checkpoint != path:  # a run's folder: say whether the run is there at all
        run_key = folder.key_of(path) + "/"
        found = folder.s3.list_objects_v2(Bucket=folder.bucket, Prefix=run_key, MaxKeys=1).get("KeyCount", 0)
        if found:
            raise UserError(f"--profile {model}: the run has no checkpoint {where}: its pretraining has not saved "
                            "one yet; profile with a finished run, or name one of its checkpoint files (*.pth)")
    raise UserError(f"--profile {model}: no checkpoint {where}: name a finished run's folder (runs/NAME, under "
                    f"{target.cluster_data}) or a checkpoint file (*.pth)")


def pair_of(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UserError(f"--env {text!r}: give KEY=VALUE, e.g. --env SCDINO_PRESET=p4d.24xlarge")
    return key, value


def site_of(target):
    """The partition and CPUs the jobs take: the cluster's default preset (its first), as slurm/env.sh does."""
    from stacks.shared.presets import node_shape
    from training.chain import Site
    from training.chain.graph import INGEST_CPUS_PER_TASK

    first = node_shape(target.settings().cluster.presets)["presets"][0]
    return Site(partition=first["queue"], cpus_per_task=first["cpus_per_gpu"],
                ingest_cpus_per_task=INGEST_CPUS_PER_TASK)


# --- status ----------------------------------------------------------------------------------------------

def job_states(target, session, record, last=None):
    """{label: state} from the REST API for the record's jobs, a note when the API could not be asked, and the API
    for the next look (its token is read again each look, the head node renewing it; its document is kept)."""
    try:
        api = rest_api(target, session, last)
        states = {}
        for job in record.jobs:
            tasks = api.jobs(job.job_id)
            states[job.label] = summarise([task.state for task in tasks]) if tasks else "forgotten by Slurm"
        return states, "", api
    except UserError as error:  # no tunnel, no token: the bucket still tells
        return {}, f"not from the REST API ({error})", None


def summarise(states: list[str]) -> str:
    """One state for an array's tasks: the worst ended one, else running, else pending, else completed."""
    for state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "RUNNING", "PENDING"):
        if state in states:
            return state
    return states[0] if states else "unknown"


def status(target, session, run_dir: str, args: argparse.Namespace) -> int:
    folder = folder_of(target, session, run_dir)
    record = submission_of(folder)
    listing = folder.listing()
    if record is None and not listing:
        raise UserError(f"no run at s3://{folder.bucket}/{folder.root_key} and no submission record beside it: "
                        f"check the name ({run_dir}); runs are folders under {target.cluster_data}")
    api = None
    while True:
        states, note, api = job_states(target, session, record, api) if record else ({}, "no submission record", None)
        lines, ended, failed = describe(folder, record, states, listing, args.lines)
        print("\n".join(lines + ([f"(job states {note})"] if note else [])), flush=True)
        if not args.follow or ended or note:
            return 1 if failed else 0
        time.sleep(args.interval)
        listing = folder.listing()
        print("", flush=True)


def describe(folder, record, states: dict[str, str], listing, lines: int) -> tuple[list[str], bool, bool]:
    """The status lines; whether every job has ended, and whether one failed."""
    timings = folder.read_json(relative(RUN.timings)) or {}
    out = [f"run {folder.run}  (s3://{folder.bucket}/{folder.root_key})"]
    jobs = record.jobs if record else ()
    proven: set[str] = set()  # the jobs a completed job waited for: completed too (afterok)
    shown = []
    for job in reversed(jobs):  # those come before it in the record
        state = states.get(job.label, "")
        if not state or state == "forgotten by Slurm":  # the run's own steps time themselves in timings.json
            if job.label in timings or job.label in proven:
                state = "COMPLETED (from the run folder)"
            else:
                state = state or "unknown"
        if state.startswith("COMPLETED"):
            proven.update(job.after)
        shown.append((job, state))
    ended = bool(jobs)
    failed = False
    for job, state in reversed(shown):
        took = f"  {timings[job.label]:.0f} s" if isinstance(timings.get(job.label), (int, float)) else ""
        out.append(f"  {job.label:<16} {job.job_id:>8}  {state}{took}")
        log = f"{relative(RUN.logs)}/{job.name}_{job.job_id}.out"
        if log in listing and lines > 0:
            out += [f"      | {text}" for text in folder.tail(log, lines)]
        base = state.split(" ")[0]
        ended = ended and (base in FINAL or state == "forgotten by Slurm")
        failed = failed or base in FINAL - {"COMPLETED"}
    out += knn_lines(folder)
    for name, path, part in (("results", RUN.results, "results,bill"), ("report", RUN.report, "report")):
        if relative(path) in listing:
            out.append(f"  {name + ':':<8} s3://{folder.bucket}/{folder.root_key}{relative(path)} (fetch --what {part})")
    return out, ended, failed


def knn_lines(folder) -> list[str]:
    """The newest kNN figures: top-1 at the best k of each model knn.json has."""
    knn = folder.read_json(relative(RUN.knn_json))
    if not knn or "tags" not in knn:
        return []
    from training.results import knn_headline

    return [f"  kNN {entry['label']}: top-1 {entry['top1']:.3f} at k={entry['best_k']}"
            for entry in knn_headline(knn).values()]


# --- fetch, cancel, tunnel -------------------------------------------------------------------------------

def fetch(target, session, run_dir: str, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from training.remote.bucket import PARTS, select
    from training.remote.bucket import fetch as download

    folder = folder_of(target, session, run_dir)
    listing = folder.listing()
    if not listing:
        raise UserError(f"no run at s3://{folder.bucket}/{folder.root_key}: check the name ({run_dir}); runs are "
                        f"folders under {target.cluster_data}")
    parts = list(PARTS) if args.what == "all" else [part.strip() for part in args.what.split(",") if part.strip()]
    paths = select(listing, parts)
    into = args.into or Path("runs") / "remote" / posixpath.basename(run_dir)
    done = download(folder, paths, into, listing=listing,
                    progress=lambda name, size: tqdm(total=size, unit="B", unit_scale=True, desc=name))
    print(f"{into}: {done.downloaded} file(s) downloaded ({done.bytes} bytes), {done.skipped} already here; "
          f"{', '.join(parts)}", file=sys.stderr)
    return 0


def cancel(target, session, run_dir: str, args: argparse.Namespace | None = None) -> int:
    from training.remote.rest import JobUnknown

    folder = folder_of(target, session, run_dir)
    record = submission_of(folder)
    if record is None:
        raise UserError(f"no submission record s3://{folder.bucket}/{folder.key_of(run_dir + '.jobs.json')}: was "
                        f"{run_dir} submitted with `python -m training remote submit`?")
    api = rest_api(target, session)
    cancelled = []
    for job in record.jobs:
        tasks = api.jobs(job.job_id)
        if tasks and any(task.state not in FINAL for task in tasks):
            try:
                api.cancel(job.job_id)
                cancelled.append(f"{job.label} {job.job_id}")
            except JobUnknown:
                pass
    print(f"cancelled {len(cancelled)} job(s) of {run_dir}" + (f": {', '.join(cancelled)}" if cancelled else
                                                               " (none was left)"), file=sys.stderr)
    return 0


def tunnel(target, print_only: bool) -> int:
    import os
    import shlex
    import shutil

    from training.remote.target import aws_session, tunnel_command

    session = aws_session(target) if target.record.backend == "pcs" and not print_only else None
    command = tunnel_command(target, session)
    if print_only or target.record.backend == "pcs":
        print(" ".join(shlex.quote(word) if not word.startswith("$(") else f'"{word}"' for word in command))
        if print_only:
            return 0
    program = shutil.which("aws")
    if program is None:
        raise UserError("aws is not on PATH: install the AWS CLI v2 and the Session Manager plugin "
                        "(docs/deploy.md, Prerequisites)")
    if target.record.backend == "pcs":
        from stacks.deployment import capture, login_node_finder

        command[command.index("--target") + 1] = capture(login_node_finder(target.record))
    os.execv(program, command)
    return 0
