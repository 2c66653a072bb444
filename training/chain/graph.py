"""The chain of Slurm jobs a run needs, as plain data: `plan_chain(config_path, options, site)`.

One job per step of STEPS, in order (`ingest` in `prepare`'s place when the config sets ingest.table),
each starting only once the one before it succeeded (afterok), and cancelled by Slurm when that one
failed (kill on invalid dependency). --prepare-tasks / --ingest-tasks N make that step an array of N
tasks ("STEP-parts") and a merge job ("STEP").

With data.channel_combinations: the shared steps (prepare or ingest, mean-std) once, left out when their
files exist; then one chain pretrain..report per combination whose report does not exist yet
("STEP:COMBINATION"); with data.compare_channel_adaptive, per kind of data.channel_adaptive_kinds, one
channel-adaptive pretraining ("pretrain:adaptive-KIND") and its evaluation features..linear on each
combination whose linear probe does not exist yet ("STEP:adaptive-KIND-COMBINATION"); and `compare`
after all of them when the chain goes to `report`.

With --profile MODEL (a trained run's directory or a checkpoint file): no training, but the profile
chain PROFILE_STEPS, in which MODEL embeds the config's screen (training/steps/profile.py): `profile
--stage setup` reads the model's card and writes the profile's config (RunLayout.profile_config), which
every later job reads; ingest (an array with --ingest-tasks), mean-std, `profile --stage check` (the
screen's statistics against the card's), features of MODEL, labels, knn and export.

Two ways in, one graph: slurm/submit_pipeline.sh submits it with sbatch on the cluster (sbatch.py has the
command line), a REST client through slurmrestd. Either submits the jobs in order, each after the jobs
its `after` labels name, which come earlier in the list.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

from training.config import Config, load_config
from training.errors import UserError
from training.rundir import RunLayout

STEPS = ("prepare", "mean-std", "pretrain", "features", "labels", "knn", "linear", "export", "plots", "report")
"""The chain's steps in order; each is slurm/<step>.slurm and `python -m training <step>`."""
PROFILE_STEPS = ("profile-setup", "ingest", "mean-std", "profile-check", "features", "labels", "knn", "export")
"""The profile chain's steps in order (--profile); profile-STAGE is slurm/profile.slurm's --stage STAGE."""
SHARED_OUTPUT = {"prepare": "split", "ingest": "split", "mean-std": "mean_std"}
"""Steps every channel combination shares, with the RunLayout attribute of the file that shows each is done."""
MULTI_NODE = frozenset({"pretrain", "features"})
"""Steps that start their own processes on whole nodes; the others run one process on a CPU share."""
EVALUATION = ("features", "labels", "knn", "linear")
"""A channel-adaptive model's steps on each combination: no plots or report, whose attention maps take no
channel subset of a channel-adaptive checkpoint."""
DEFAULT_OUTPUT = "logs/%x_%j.out"
"""sbatch's --output: <job name>_<job id>.out in logs/ of the folder the chain is submitted from."""
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
_COUNT = re.compile(r"[1-9][0-9]*")

SbatchValue = Union[str, int, bool]


@dataclass(frozen=True)
class JobSpec:
    """One Slurm job of the chain.

    label: the job's name in the chain, unique: STEP, STEP:RUN in a combination's or channel-adaptive
        model's run, STEP-parts for an array of parts; submit_pipeline.sh prints it beside the job id.
    script: the batch script, relative to the bundle's root (slurm/<step>.slurm).
    args: the script's arguments: the config, the --set overrides, the run's selector, --parts/--merge.
    sbatch: sbatch's options by long name without dashes, in order, a flag as True (partition, output,
        nodes or cpus-per-task, job-name, comment, array, exclusive); they win over the script's #SBATCH lines
        (sbatch.script_options reads those).
    after: labels of earlier jobs of the chain it waits for: afterok, and Slurm cancels it when one of
        them fails (kill on invalid dependency).
    after_ids: ids of jobs outside the chain it waits for the same way (--after).
    """

    label: str
    script: str
    args: tuple[str, ...]
    sbatch: dict[str, SbatchValue]
    after: tuple[str, ...] = ()
    after_ids: tuple[str, ...] = ()

    @property
    def step(self) -> str:
        return Path(self.script).stem


INGEST_CPUS_PER_TASK = 2
"""CPUs of each ingest job or array task unless the site says otherwise: its cropping runs on one core, a
second reads ahead (slurm/env.sh's default of SCDINO_INGEST_CPUS_PER_TASK; a test keeps the two equal)."""


@dataclass(frozen=True)
class Site:
    """The cluster's settings the jobs' resources come from: slurm/env.sh computes them from the site
    file (the chosen preset's partition and CPUs) and the environment."""

    partition: str
    """Slurm partition (ParallelCluster or PCS queue) every job goes to (SCDINO_PARTITION)."""
    cpus_per_task: int
    """CPUs of a single-process step: one GPU's share of a node (SCDINO_CPUS_PER_TASK)."""
    ingest_cpus_per_task: int
    """CPUs of each ingest job or array task (SCDINO_INGEST_CPUS_PER_TASK)."""

    def __post_init__(self) -> None:
        if not self.partition or re.search(r"\s", self.partition):
            raise UserError(f"partition must be a Slurm partition name, got {self.partition!r}")
        check_count("cpus_per_task", self.cpus_per_task)
        check_count("ingest_cpus_per_task", self.ingest_cpus_per_task)


@dataclass(frozen=True)
class ChainOptions:
    """What to submit of the chain: submit_pipeline.sh's options, under the same names."""

    first: str | None = None
    """--from: the first step (its inputs must exist in the run directory); default the chain's first."""
    last: str = "report"
    """--to: the last step; `compare` follows only when it is report. In a profile chain, report (the
    default) means its last step, export."""
    nodes: int | None = None
    """--nodes: pretraining nodes; default pretrain.slurm's."""
    after: tuple[str, ...] = ()
    """--after: ids of jobs outside the chain that its first jobs wait for (e.g. a data staging job)."""
    prepare_tasks: int = 1
    """--prepare-tasks: prepare as an array of N tasks, then a merge job (1: one job)."""
    ingest_tasks: int = 1
    """--ingest-tasks: ingest as an array of N tasks, then a merge job (1: one job)."""
    overrides: tuple[str, ...] = ()
    """--set key=value, given to every step so that all read the same configuration."""
    output: str = DEFAULT_OUTPUT
    """sbatch's --output pattern of every job."""
    comment: str = ""
    """sbatch's --comment of every job, when given: submit_pipeline.sh's is the bundle's mark
    (scdino-bundle:<folder>, slurm/env.sh), which keeps that bundle through code updates while a job lives."""
    profile: str = ""
    """--profile: a trained model (its run's directory, or a checkpoint file *.pth) that embeds the
    config's screen: the profile chain (PROFILE_STEPS) instead of training. Empty: the training chain."""

    def __post_init__(self) -> None:
        if self.profile and self.prepare_tasks != 1:
            raise UserError("--prepare-tasks does not apply to --profile, which ingests the screen's load table: "
                            "use --ingest-tasks")
        if self.nodes is not None:
            check_count("--nodes", self.nodes)
        check_count("--prepare-tasks", self.prepare_tasks)
        check_count("--ingest-tasks", self.ingest_tasks)
        for job in self.after:
            if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
                raise UserError(f"--after must be a Slurm job id (digits, e.g. 1234), got {job!r}")
        if not self.output:
            raise UserError("output must be sbatch's --output pattern, e.g. logs/%x_%j.out")


@dataclass(frozen=True)
class Chain:
    """A planned chain: the run directory, the jobs in submission order and what was left out."""

    run_dir: Path
    jobs: tuple[JobSpec, ...]
    skipped: tuple[str, ...] = field(default=())
    """One sentence per step or run left out because its files exist."""

    def as_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "skipped": list(self.skipped), "jobs": [asdict(job) for job in self.jobs]}


def check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a positive integer, got {value!r}")


def count(flag: str, text: str) -> int:
    """A positive integer given on the command line as FLAG's TEXT."""
    if not _COUNT.fullmatch(text):
        raise UserError(f"{flag} must be a positive integer, got '{text}'")
    return int(text)


def plan_chain(config_path: str | Path, options: ChainOptions, site: Site, *,
               exists: Callable[[Path], bool] = os.path.exists, config_arg: str | None = None) -> list[JobSpec]:
    """The chain's jobs in submission order (see plan)."""
    return list(plan(config_path, options, site, exists=exists, config_arg=config_arg).jobs)


def plan(config_path: str | Path, options: ChainOptions, site: Site, *,
         exists: Callable[[Path], bool] = os.path.exists, config_arg: str | None = None) -> Chain:
    """The chain for the config at CONFIG_PATH with OPTIONS on SITE. EXISTS tells whether a run file is
    there (the shared steps, finished combinations and evaluations are left out); a client off the
    cluster passes one that looks where the run folder is. The jobs read the config as CONFIG_ARG
    (default: CONFIG_PATH as given). A bad configuration or option is a UserError of one line."""
    try:
        config = load_config(config_path, options.overrides)
    except UserError as exc:
        raise UserError(f"bad configuration: {exc}") from None
    return _Planner(config, options, site, exists, str(config_arg or config_path)).chain()


@dataclass(frozen=True)
class _Wait:
    """What a job waits for: labels of jobs of the chain and ids of jobs outside it."""

    labels: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()


def profile_checkpoint(model: str) -> str:
    """The checkpoint a profile's MODEL names: the file itself (*.pth), else the run directory's latest."""
    return model if model.endswith(".pth") else str(RunLayout(Path(model)).latest_checkpoint)


def run_selector(run: str) -> tuple[str, ...]:
    """The --set arguments that pick the run a job label calls RUN: "" the run itself, COMBINATION that
    combination's run, adaptive-KIND the channel-adaptive model of KIND (kinds have no hyphen),
    adaptive-KIND-COMBINATION that model evaluated on COMBINATION."""
    if not run:
        return ()
    if run.startswith("adaptive-"):
        kind, _, combination = run.removeprefix("adaptive-").partition("-")
        selector = ("--set", f"run.channel_adaptive={kind}")
        return (*selector, "--set", f"run.combination={combination}") if combination else selector
    return ("--set", f"run.combination={run}")


class _Planner:
    def __init__(self, config: Config, options: ChainOptions, site: Site, exists: Callable[[Path], bool],
                 config_arg: str) -> None:
        self.config, self.options, self.site, self.exists = config, options, site, exists
        self.layout = RunLayout.from_config(config)
        self.common_args = (config_arg, *(arg for override in options.overrides for arg in ("--set", override)))
        self.steps = ("ingest", *STEPS[1:]) if config.ingest.table else STEPS
        self.step_args: dict[str, tuple[str, ...]] = {}
        """Arguments a step's jobs take after the config's (the profile's features: the model)."""
        if options.profile:
            self.profile_chain(config)
        self.jobs: list[JobSpec] = []
        self.skipped: list[str] = []

    def profile_chain(self, config: Config) -> None:
        """PROFILE_STEPS: the profile's jobs read the config `profile --stage setup` writes; its stages
        read the config as given, and the model."""
        if not config.ingest.table:
            raise UserError("--profile embeds a screen's load table: set ingest.table in the config")
        self.steps = PROFILE_STEPS
        self.stage_args = (*self.common_args, "--model", self.options.profile)
        self.common_args = (str(self.layout.profile_config),)
        self.step_args = {"features": ("--checkpoint", profile_checkpoint(self.options.profile), "--epochs", "none")}

    def chain(self) -> Chain:
        last = self.steps[-1] if self.options.profile and self.options.last == "report" else self.options.last
        first, last = self.index(self.options.first or self.steps[0]), self.index(last)
        if first > last:
            raise UserError(f"--from {self.options.first} comes after --to {self.options.last}")
        selected = self.steps[first:last + 1]
        start = _Wait(ids=self.options.after)
        if self.options.profile:
            self.add_chain(selected, start)
        elif self.config.data.channel_combinations:
            self.combinations(selected, start)
        else:
            self.add_chain(selected, start)
        return Chain(self.layout.root, tuple(self.jobs), tuple(self.skipped))

    def index(self, step: str) -> int:
        if step not in self.steps:
            raise UserError(f"unknown step '{step}'; steps: {' '.join(self.steps)}")
        return self.steps.index(step)

    def combinations(self, selected: tuple[str, ...], start: _Wait) -> None:
        """The shared steps once, unless their files are there; a chain per unfinished combination,
        the channel-adaptive models' when compared; then compare."""
        shared, per_combination = [], [step for step in selected if step not in SHARED_OUTPUT]
        for step in (step for step in selected if step in SHARED_OUTPUT):
            if self.exists(getattr(self.layout, SHARED_OUTPUT[step])):
                self.skipped.append(f"{step}: skipped, its output is there")
            else:
                shared.append(step)
        shared_end = self.add_chain(shared, start)
        ends: list[str] = []
        for combination in self.config.data.channel_combinations:
            if self.exists(self.layout.combination(combination).report):
                self.skipped.append(f"channels {combination}: finished (its report exists), skipped")
                continue
            ends += self.add_chain(per_combination, shared_end, combination).labels
        if self.config.data.compare_channel_adaptive:
            for kind in self.config.data.channel_adaptive_kinds:
                ends += self.channel_adaptive(kind, per_combination, shared_end)
        if self.options.last == "report":
            self.add("compare", _Wait(tuple(ends)) if ends else shared_end)

    def channel_adaptive(self, kind: str, steps: list[str], after: _Wait) -> list[str]:
        """The channel-adaptive model of KIND: its pretraining if among STEPS, then for each combination
        not yet evaluated the evaluation steps among STEPS; the labels of the evaluations' last jobs."""
        model = self.layout.channel_adaptive(kind)
        pending = []
        for combination in self.config.data.channel_combinations:
            if self.exists(model.evaluation(combination).linear_json):
                self.skipped.append(f"channel-adaptive {kind} model on {combination}: evaluated (its linear probe "
                                    "exists), skipped")
            else:
                pending.append(combination)
        if not pending:
            return []
        if "pretrain" in steps:
            after = self.add("pretrain", after, f"adaptive-{kind}")
        evaluation = [step for step in steps if step in EVALUATION]
        if not evaluation:
            return []
        return [label for combination in pending
                for label in self.add_chain(evaluation, after, f"adaptive-{kind}-{combination}").labels]

    def add_chain(self, steps: list[str] | tuple[str, ...], after: _Wait, run: str = "") -> _Wait:
        """STEPS one after the other in the run called RUN, the first after AFTER; what waits for the last."""
        for step in steps:
            after = self.add(step, after, run)
        return after

    def add(self, step: str, after: _Wait, run: str = "") -> _Wait:
        """STEP of the run called RUN after AFTER (as an array and its merge when asked); returns what
        waits for it."""
        if step.startswith("profile-"):
            stage = ("--stage", step.removeprefix("profile-"))
            return self.job(step, "profile", (*self.stage_args, *stage), {}, after)
        args = (*self.common_args, *run_selector(run), *self.step_args.get(step, ()))
        tasks = {"prepare": self.options.prepare_tasks, "ingest": self.options.ingest_tasks}.get(step, 1)
        if tasks == 1:
            return self.job(f"{step}:{run}" if run else step, step, args, {}, after)
        array: dict[str, SbatchValue] = {"array": f"0-{tasks - 1}"}
        if step == "prepare":
            # whole nodes, each task with the node's cores and its own link to FSx (decoding and reading are
            # what a part spends its time on); ingest's tasks crop on one core each, several to a node
            array["exclusive"] = True
        parts = self.job(f"{step}-parts", step, (*args, "--parts", str(tasks)), array, after)
        return self.job(step, step, (*args, "--merge", "--parts", str(tasks)), {}, parts)

    def job(self, label: str, step: str, args: tuple[str, ...], extra: dict[str, SbatchValue], after: _Wait) -> _Wait:
        sbatch: dict[str, SbatchValue] = {"partition": self.site.partition, "output": self.options.output}
        if step not in MULTI_NODE:
            sbatch["cpus-per-task"] = self.site.ingest_cpus_per_task if step == "ingest" else self.site.cpus_per_task
        elif step == "pretrain" and self.options.nodes:
            sbatch["nodes"] = self.options.nodes
        sbatch["job-name"] = "scdino-" + label.replace(":", "-", 1)
        if self.options.comment:
            sbatch["comment"] = self.options.comment
        self.jobs.append(JobSpec(label, f"slurm/{step}.slurm", args, {**sbatch, **extra}, after.labels, after.ids))
        return _Wait((label,))
