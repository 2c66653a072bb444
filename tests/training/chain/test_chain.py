"""The chain's job graph as plain data (training/chain/): which jobs, in which order, after which, with
which arguments and sbatch options, for --from/--to, arrays, channel combinations, channel-adaptive
models and a preset's site settings; what is left out because its files exist (real files in the test's
folder); bad input in one line; and `python -m training chain`'s three outputs. No Slurm: the same
chain submitted is tests/slurm/ (test_pipeline.py, test_combination_chains.py, test_screen.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training.chain import STEPS, ChainOptions, JobSpec, Site, plan, plan_chain
from training.chain.sbatch import command_line, script_options
from training.errors import UserError
from training.rundir import RunLayout

REPO = Path(__file__).resolve().parents[3]
SITE = Site(partition="gpu-g4dn12xl", cpus_per_task=12, ingest_cpus_per_task=2)
CHAIN = ["pretrain", "features", "labels", "knn", "linear", "export", "plots", "report"]
EVALUATION = ["features", "labels", "knn", "linear"]
KIND = "bag_of_channels"


def config(tmp_path: Path, **data) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"run": {"output_dir": str(tmp_path / "run")}, "data": data}))
    return path


def combinations(tmp_path: Path, adaptive: bool = True) -> Path:
    return config(tmp_path, channels="01", channel_combinations=["0", "01"], compare_channel_adaptive=adaptive)


def touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")


def by_label(jobs: list[JobSpec]) -> dict[str, JobSpec]:
    labels = [job.label for job in jobs]
    assert len(set(labels)) == len(labels), labels
    return {job.label: job for job in jobs}


def test_a_single_run_is_one_job_per_step_each_after_the_one_before(tmp_path):
    path = config(tmp_path)
    jobs = plan_chain(path, ChainOptions(overrides=("optim.epochs=2",)), SITE)
    assert [job.label for job in jobs] == list(STEPS)
    assert [job.script for job in jobs] == [f"slurm/{step}.slurm" for step in STEPS]
    assert [job.after for job in jobs] == [(), *[(step,) for step in STEPS[:-1]]]
    assert all(job.args == (str(path), "--set", "optim.epochs=2") and job.after_ids == () for job in jobs)
    jobs = by_label(jobs)
    assert jobs["prepare"].sbatch == {"partition": "gpu-g4dn12xl", "output": "logs/%x_%j.out", "cpus-per-task": 12,
                                      "job-name": "scdino-prepare"}
    assert jobs["pretrain"].sbatch == {"partition": "gpu-g4dn12xl", "output": "logs/%x_%j.out",
                                       "job-name": "scdino-pretrain"}, "whole nodes: the script's resources"


def test_from_to_nodes_and_after_pick_a_slice_of_the_chain(tmp_path):
    options = ChainOptions(first="mean-std", last="knn", nodes=3, after=("41", "42_3"), output="/fsx/w/logs/%x_%j.out")
    jobs = plan_chain(config(tmp_path), options, SITE)
    assert [job.label for job in jobs] == ["mean-std", "pretrain", "features", "labels", "knn"]
    assert jobs[0].after == () and jobs[0].after_ids == ("41", "42_3"), "only the first waits for the outside jobs"
    assert all(job.after_ids == () for job in jobs[1:])
    assert jobs[1].sbatch["nodes"] == 3 and all("nodes" not in job.sbatch for job in jobs if job.label != "pretrain")
    assert {job.sbatch["output"] for job in jobs} == {"/fsx/w/logs/%x_%j.out"}


def test_every_job_carries_the_comment_given(tmp_path):
    """submit_pipeline.sh gives the bundle's mark, which keeps the bundle through code updates while a job lives."""
    jobs = plan_chain(config(tmp_path), ChainOptions(prepare_tasks=2, comment="scdino-bundle:/apps/b-7"), SITE)
    assert {job.sbatch["comment"] for job in jobs} == {"scdino-bundle:/apps/b-7"} and len(jobs) == 11
    assert "--comment=scdino-bundle:/apps/b-7" in command_line(jobs[0], "/apps/b-7")
    assert not [job for job in plan_chain(config(tmp_path), ChainOptions(), SITE) if "comment" in job.sbatch]


def test_arrays_of_parts_and_their_merge(tmp_path):
    jobs = by_label(plan_chain(config(tmp_path), ChainOptions(prepare_tasks=4, last="mean-std"), SITE))
    assert list(jobs) == ["prepare-parts", "prepare", "mean-std"]
    parts, merge = jobs["prepare-parts"], jobs["prepare"]
    assert parts.sbatch == {"partition": "gpu-g4dn12xl", "output": "logs/%x_%j.out", "cpus-per-task": 12,
                            "job-name": "scdino-prepare-parts", "array": "0-3", "exclusive": True}
    assert parts.args[-2:] == ("--parts", "4") and merge.args[-3:] == ("--merge", "--parts", "4")
    assert merge.after == ("prepare-parts",) and "array" not in merge.sbatch and jobs["mean-std"].after == ("prepare",)


def test_a_screen_starts_with_ingest_whose_tasks_take_the_ingest_cpus(tmp_path):
    path = tmp_path / "screen.yaml"
    path.write_text(yaml.safe_dump({"run": {"output_dir": str(tmp_path / "run")},
                                    "ingest": {"table": str(tmp_path / "load_data.csv")}}))
    jobs = by_label(plan_chain(path, ChainOptions(ingest_tasks=2, last="knn"), SITE))
    assert list(jobs) == ["ingest-parts", "ingest", "mean-std", "pretrain", "features", "labels", "knn"]
    assert jobs["ingest-parts"].sbatch["cpus-per-task"] == 2 and "exclusive" not in jobs["ingest-parts"].sbatch
    assert jobs["ingest"].sbatch["cpus-per-task"] == 2 and jobs["mean-std"].sbatch["cpus-per-task"] == 12
    with pytest.raises(UserError, match=r"^unknown step 'prepare'; steps: ingest mean-std pretrain "):
        plan(path, ChainOptions(first="prepare"), SITE)


def test_a_preset_s_site_settings_reach_every_job(tmp_path):
    """p5.48xlarge as env.sh reads it from the site file: its partition, 24 CPUs a GPU."""
    site = Site(partition="gpu-p548xl", cpus_per_task=24, ingest_cpus_per_task=3)
    jobs = plan_chain(config(tmp_path), ChainOptions(ingest_tasks=2), site)
    assert {job.sbatch["partition"] for job in jobs} == {"gpu-p548xl"}
    assert {job.sbatch.get("cpus-per-task") for job in jobs} == {24, None}


def test_combinations_share_the_first_steps_and_compare_waits_for_every_chain(tmp_path):
    jobs = plan_chain(combinations(tmp_path), ChainOptions(), SITE)
    labels = [job.label for job in jobs]
    per_combination = [f"{step}:{c}" for c in ("0", "01") for step in CHAIN]
    adaptive = [f"pretrain:adaptive-{KIND}", *[f"{s}:adaptive-{KIND}-{c}" for c in ("0", "01") for s in EVALUATION]]
    assert labels == ["prepare", "mean-std", *per_combination, *adaptive, "compare"]
    jobs = by_label(jobs)
    for combination in ("0", "01"):
        chain = [f"{step}:{combination}" for step in CHAIN]
        assert jobs[chain[0]].after == ("mean-std",)
        assert [jobs[label].after for label in chain[1:]] == [(label,) for label in chain[:-1]]
        assert all(jobs[label].args[-2:] == ("--set", f"run.combination={combination}") for label in chain)
        assert jobs[chain[0]].sbatch["job-name"] == f"scdino-pretrain-{combination}"
    assert jobs["compare"].after == ("report:0", "report:01", f"linear:adaptive-{KIND}-0", f"linear:adaptive-{KIND}-01")
    assert jobs["compare"].args == (str(tmp_path / "run.yaml"),), "compare reads the whole run"


def test_the_channel_adaptive_model_trains_once_and_is_evaluated_per_combination(tmp_path):
    jobs = by_label(plan_chain(combinations(tmp_path), ChainOptions(nodes=1), SITE))
    pretrain = jobs[f"pretrain:adaptive-{KIND}"]
    assert pretrain.after == ("mean-std",) and pretrain.sbatch["nodes"] == 1
    assert pretrain.args[1:] == ("--set", f"run.channel_adaptive={KIND}")
    assert pretrain.sbatch["job-name"] == f"scdino-pretrain-adaptive-{KIND}"
    for combination in ("0", "01"):
        first = jobs[f"features:adaptive-{KIND}-{combination}"]
        assert first.after == (f"pretrain:adaptive-{KIND}",)
        assert first.args[1:] == ("--set", f"run.channel_adaptive={KIND}", "--set", f"run.combination={combination}")
        assert f"export:adaptive-{KIND}-{combination}" not in jobs, "evaluation only: no export, plots or report"


def test_two_kinds_each_train_one_model(tmp_path):
    options = ChainOptions(overrides=("data.channel_adaptive_kinds=bag_of_channels,channel_vit",))
    jobs = by_label(plan_chain(combinations(tmp_path), options, SITE))
    assert jobs["pretrain:adaptive-channel_vit"].after == ("mean-std",)
    assert jobs["compare"].after[-2:] == ("linear:adaptive-channel_vit-0", "linear:adaptive-channel_vit-01")


def test_from_knn_evaluates_without_pretraining_or_waiting(tmp_path):
    jobs = plan_chain(combinations(tmp_path), ChainOptions(first="knn"), SITE)
    assert [job.step for job in jobs] == ["knn", "linear", "export", "plots", "report"] * 2 + ["knn", "linear"] * 2 + [
        "compare"]
    assert [job.label for job in jobs if not job.after] == ["knn:0", "knn:01", f"knn:adaptive-{KIND}-0",
                                                             f"knn:adaptive-{KIND}-01"]


def test_to_before_report_submits_no_compare(tmp_path):
    jobs = plan_chain(combinations(tmp_path), ChainOptions(last="pretrain"), SITE)
    assert [job.label for job in jobs] == ["prepare", "mean-std", "pretrain:0", "pretrain:01", f"pretrain:adaptive-{KIND}"]


def test_what_is_finished_is_left_out_and_said(tmp_path):
    parent = RunLayout(tmp_path / "run")
    touch(parent.split, parent.mean_std, parent.combination("0").report,
          parent.channel_adaptive(KIND).evaluation("0").linear_json)
    chain = plan(combinations(tmp_path), ChainOptions(after=("7",)), SITE)
    jobs = by_label(list(chain.jobs))
    assert list(jobs) == [*[f"{s}:01" for s in CHAIN], f"pretrain:adaptive-{KIND}",
                          *[f"{s}:adaptive-{KIND}-01" for s in EVALUATION], "compare"]
    assert jobs["pretrain:01"].after_ids == ("7",) and jobs[f"pretrain:adaptive-{KIND}"].after_ids == ("7",)
    assert jobs["compare"].after == ("report:01", f"linear:adaptive-{KIND}-01") and jobs["compare"].after_ids == ()
    assert chain.skipped == ("prepare: skipped, its output is there", "mean-std: skipped, its output is there",
                             "channels 0: finished (its report exists), skipped",
                             f"channel-adaptive {KIND} model on 0: evaluated (its linear probe exists), skipped")
    assert chain.run_dir == tmp_path / "run"
    touch(parent.combination("01").report, parent.channel_adaptive(KIND).evaluation("01").linear_json)
    (compare,) = plan_chain(combinations(tmp_path), ChainOptions(after=("7",)), SITE)
    assert compare.label == "compare" and compare.after == () and compare.after_ids == ("7",)


def test_a_client_off_the_cluster_says_where_files_exist_and_how_jobs_read_the_config(tmp_path):
    """A REST client plans on a laptop: the run folder is elsewhere (its `exists` looks there) and the jobs
    read the config uploaded beside the run."""
    remote = {RunLayout(tmp_path / "run").split, RunLayout(tmp_path / "run").mean_std}
    jobs = plan_chain(combinations(tmp_path, adaptive=False), ChainOptions(last="pretrain"), SITE,
                      exists=remote.__contains__, config_arg="/fsx/data/runs/x/run.yaml")
    assert [job.label for job in jobs] == ["pretrain:0", "pretrain:01"]
    assert {job.args[0] for job in jobs} == {"/fsx/data/runs/x/run.yaml"}


@pytest.mark.parametrize(("options", "message"), [
    (dict(first="nope"), "unknown step 'nope'; steps: prepare mean-std pretrain features labels knn linear export "
                         "plots report"),
    (dict(first="knn", last="features"), "--from knn comes after --to features"),
    (dict(last="compare"), "unknown step 'compare'; steps: prepare "),
    (dict(overrides=("data.chanels=0",)), "bad configuration: unknown config key 'data.chanels': did you mean "
                                          "'channels'?"),
])
def test_bad_steps_and_configurations_are_one_line(tmp_path, options, message):
    with pytest.raises(UserError) as raised:
        plan(config(tmp_path), ChainOptions(**options), SITE)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ChainOptions(nodes=0), "--nodes must be a positive integer, got 0"),
    (lambda: ChainOptions(prepare_tasks=True), "--prepare-tasks must be a positive integer, got True"),
    (lambda: ChainOptions(ingest_tasks=-2), "--ingest-tasks must be a positive integer, got -2"),
    (lambda: ChainOptions(after=("12;rm",)), "--after must be a Slurm job id (digits, e.g. 1234), got '12;rm'"),
    (lambda: Site("gpu a", 12, 2), "partition must be a Slurm partition name, got 'gpu a'"),
    (lambda: Site("gpu", 0, 2), "cpus_per_task must be a positive integer, got 0"),
])
def test_bad_options_are_one_line_naming_the_option(make, message):
    with pytest.raises(UserError) as raised:
        make()
    assert str(raised.value) == message


def test_a_config_that_cannot_be_read_is_a_bad_configuration(tmp_path):
    with pytest.raises(UserError, match=r"^bad configuration: config file not found: "):
        plan(tmp_path / "none.yaml", ChainOptions(), SITE)
    with pytest.raises(UserError, match=r"^bad configuration: .*cannot be evaluated on '2'"):
        plan(combinations(tmp_path), ChainOptions(overrides=("data.channel_combinations=0,2",)), SITE)


def test_the_command_line_names_jobs_by_id_or_placeholder():
    job = JobSpec("knn:01", "slurm/knn.slurm", ("run.yaml", "--set", "run.combination=01"),
                  {"partition": "p", "cpus-per-task": 12, "exclusive": True, "requeue": False},
                  after=("labels:01",), after_ids=("9",))
    assert command_line(job, "/apps/scdino") == [
        "--parsable", "--partition=p", "--cpus-per-task=12", "--exclusive",
        "--dependency=afterok:<labels:01>:9", "--kill-on-invalid-dep=yes",
        "/apps/scdino/slurm/knn.slurm", "run.yaml", "--set", "run.combination=01"]
    assert "--dependency=afterok:120:9" in command_line(job, "/apps/scdino", {"labels:01": "120"})
    alone = JobSpec("prepare", "slurm/prepare.slurm", ("run.yaml",), {"partition": "p"})
    assert not [word for word in command_line(alone, ".") if word.startswith(("--dependency", "--kill"))]


def test_a_plain_step_s_job_name_is_its_script_s_own():
    """The planner names every job; for a step in its own run that is the name the script gives itself, so
    a job submitted by hand and one of the chain look alike in squeue and in the log's name."""
    jobs = plan_chain(REPO / "configs" / "demo.yaml", ChainOptions(), SITE)
    for job in jobs:
        assert script_options(REPO / job.script)["job-name"] == job.sbatch["job-name"], job.script


def test_script_options_are_the_script_s_sbatch_lines(tmp_path):
    options = script_options(REPO / "slurm" / "pretrain.slurm")
    assert options["job-name"] == "scdino-pretrain" and options["nodes"] == "2" and options["exclusive"] is True
    assert options["output"] == "logs/%x_%j.out" and options["signal"] == "B:USR1@600" and options["requeue"] is True
    script = tmp_path / "bad.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --time=1:00:00\n#SBATCH -N 2\necho\n#SBATCH --nodes=3\n")
    with pytest.raises(UserError, match=r"bad.slurm line 3: '#SBATCH -N 2': write #SBATCH options as --name"):
        script_options(script)
    script.write_text("#!/bin/bash\n#SBATCH --time=1:00:00\necho\n#SBATCH --nodes=3\n")
    assert script_options(script) == {"time": "1:00:00"}, "sbatch reads no #SBATCH line after the first command"


def chain_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training", "chain", "--config", str(combinations(tmp_path)),
                           "--partition", "q", "--cpus-per-task", "6", "--ingest-cpus-per-task", "2", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_command_prints_the_plan_as_json_and_for_the_submitter(tmp_path):
    touch(RunLayout(tmp_path / "run").split)
    expected = plan_chain(combinations(tmp_path), ChainOptions(nodes=2), Site("q", 6, 2))
    done = chain_command(tmp_path, "--nodes", "2", "--format", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["run_dir"] == str(tmp_path / "run") and document["skipped"] == ["prepare: skipped, its output is there"]
    assert [JobSpec(**{**job, "args": tuple(job["args"]), "after": tuple(job["after"]),
                       "after_ids": tuple(job["after_ids"])}) for job in document["jobs"]] == expected
    assert done.stderr.splitlines() == [f"run directory: {tmp_path / 'run'}", "prepare: skipped, its output is there"]

    done = chain_command(tmp_path, "--nodes", "2", "--format", "nul", "--bundle", "/apps/scdino")
    fields, records = done.stdout.split("\0")[:-1], []
    while fields:
        label, count, rest = fields[0], int(fields[1]), fields[2:]
        records.append((label, rest[:count]))
        fields = rest[count:]
    assert records == [(job.label, command_line(job, "/apps/scdino")) for job in expected]

    done = chain_command(tmp_path, "--nodes", "2")
    assert done.stdout.splitlines() == ["sbatch " + " ".join(command_line(job, REPO)) for job in expected]


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "two"], "error: --nodes must be a positive integer, got 'two'"),
    (["--after", "x"], "error: --after must be a Slurm job id (digits, e.g. 1234), got 'x'"),
    (["--set", "data.channel_combinations=0,2"], "error: bad configuration: data.compare_channel_adaptive: "),
])
def test_the_command_refuses_bad_input_in_one_line(tmp_path, args, message):
    done = chain_command(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(message), done.stderr


def screen(tmp_path: Path, **ingest) -> Path:
    path = tmp_path / "plates.yaml"
    path.write_text(yaml.safe_dump({"run": {"output_dir": str(tmp_path / "plates")},
                                    "ingest": {"table": str(tmp_path / "load_data.csv"), **ingest}}))
    return path


def test_a_profile_chain_embeds_a_screen_with_the_model_after_its_card_is_checked(tmp_path):
    """--profile: no training; the stages read the config as given, every other job the profile's own."""
    path, model = screen(tmp_path), str(tmp_path / "pilot")
    jobs = plan_chain(path, ChainOptions(profile=model, ingest_tasks=2, overrides=("eval.knn_k=[5]",)), SITE)
    assert [job.label for job in jobs] == ["profile-setup", "ingest-parts", "ingest", "mean-std", "profile-check",
                                          "features", "labels", "knn", "export"]
    assert [job.after for job in jobs] == [(), *[(job.label,) for job in jobs[:-1]]]
    jobs = by_label(jobs)
    given = (str(path), "--set", "eval.knn_k=[5]", "--model", model)
    assert jobs["profile-setup"].args == (*given, "--stage", "setup")
    assert jobs["profile-check"].args == (*given, "--stage", "check")
    assert jobs["profile-setup"].script == jobs["profile-check"].script == "slurm/profile.slurm"
    assert jobs["profile-check"].sbatch["job-name"] == "scdino-profile-check"
    own = str(RunLayout(tmp_path / "plates").profile_config)
    assert jobs["ingest-parts"].args == (own, "--parts", "2") and jobs["ingest"].args == (own, "--merge", "--parts", "2")
    assert jobs["features"].args == (own, "--checkpoint", str(RunLayout(Path(model)).latest_checkpoint),
                                     "--epochs", "none")
    assert jobs["labels"].args == jobs["knn"].args == jobs["export"].args == (own,)


def test_a_profile_takes_a_checkpoint_file_as_it_is_and_stops_where_asked(tmp_path):
    jobs = plan_chain(screen(tmp_path), ChainOptions(profile="/fsx/m/epoch_0015.pth", first="features", last="knn"),
                      SITE)
    assert [job.label for job in jobs] == ["features", "labels", "knn"]
    assert jobs[0].args[1:3] == ("--checkpoint", "/fsx/m/epoch_0015.pth")


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: plan(config(tmp), ChainOptions(profile="m"), SITE),
     "--profile embeds a screen's load table: set ingest.table in the config"),
    (lambda tmp: plan(screen(tmp), ChainOptions(profile="m", prepare_tasks=2), SITE),
     "--prepare-tasks does not apply to --profile, which ingests the screen's load table: use --ingest-tasks"),
    (lambda tmp: plan(screen(tmp), ChainOptions(profile="m", last="pretrain"), SITE),
     "unknown step 'pretrain'; steps: profile-setup ingest mean-std profile-check features labels knn export"),
])
def test_a_profile_chain_that_cannot_be_planned_is_one_line(tmp_path, make, message):
    with pytest.raises(UserError) as raised:
        make(tmp_path)
    assert str(raised.value) == message
