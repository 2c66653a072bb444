"""One chain per channel combination on the local Slurm cluster, sharing prepare and mean-std, and
one channel-adaptive model (data.compare_channel_adaptive; the default kind, bag_of_channels)
trained once and evaluated on each combination, then `compare`; a resubmission reruns nothing that
finished. Tiny: ViT-tiny, 32 px crops, 1 epoch, 80 synthetic images, two combinations ("0" and
"01"), each pretraining on one node so both run at once; the channel-adaptive model trains on
channels 01 (data.channels) only.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support.local_slurm import FINAL_STATES, REPO, log_of
from training.rundir import RunLayout

SUBMIT = str(REPO / "slurm" / "submit_pipeline.sh")
COMBINATIONS = ["0", "01"]
CHAIN = ["pretrain", "features", "labels", "knn", "linear", "export", "plots", "report"]
EVALUATION = ["features", "labels", "knn", "linear"]
"""The channel-adaptive model's steps on each combination (after its one pretraining)."""
KIND = "bag_of_channels"
ADAPTIVE = f"adaptive-{KIND}"
"""How job labels and names call the channel-adaptive model's run."""
ADAPTIVE_JOBS = [f"pretrain:{ADAPTIVE}", *[f"{s}:{ADAPTIVE}-{c}" for c in COMBINATIONS for s in EVALUATION]]
TINY = {
    "run": {"name": "combinations-test", "seed": 0},
    "data": {"num_workers": 0, "holdout_fraction": 0.3, "channels": "01", "channel_combinations": COMBINATIONS,
             "compare_channel_adaptive": True},
    "model": {"arch": "vit_tiny", "patch_size": 8, "out_dim": 128},
    "dino": {"global_crop_size": 32, "local_crop_size": 16, "local_crops_number": 2},
    "optim": {"epochs": 1, "batch_size_per_gpu": 16, "warmup_epochs": 0},
    "train": {"precision": "fp32", "saveckp_freq": 1, "log_every": 1, "tensorboard": False},
    "eval": {"batch_size": 64, "image_size": 32, "knn_k": [5, 10], "linear_epochs": 3, "umap_neighbors": 10,
             "attention_images_per_class": 1},
}


def write_config(root, images) -> None:
    config = {**TINY, "run": {**TINY["run"], "output_dir": str(root / "run")},
              "data": {**TINY["data"], "source": str(images)}}
    (root / "run.yaml").write_text(yaml.safe_dump(config))


def dry_run(workdir: Path, *options: str, check: bool = True) -> subprocess.CompletedProcess:
    """submit_pipeline.sh --dry-run on run.yaml in WORKDIR, without a cluster."""
    env = {"PATH": "/usr/bin:/bin", "SCDINO_HOME": str(REPO), "SCDINO_VENV": str(REPO / ".venv")}
    return subprocess.run([SUBMIT, "run.yaml", "--dry-run", "--nodes", "1", *options], cwd=workdir, env=env,
                          capture_output=True, text=True, check=check)


def scripts_of(lines: list[str]) -> list[str]:
    return [line.split(".slurm")[0].rsplit("/", 1)[1] for line in lines]


def test_dry_run_shares_prepare_and_chains_each_combination(tmp_path):
    """Without a cluster: the order and dependencies of the jobs the submitter would ask for."""
    write_config(tmp_path, tmp_path / "images")
    out = dry_run(tmp_path).stdout.splitlines()
    scripts = scripts_of(out)
    assert scripts == ["prepare", "mean-std", *CHAIN, *CHAIN, "pretrain", *EVALUATION, *EVALUATION, "compare"]
    chains = (out[2:2 + len(CHAIN)], out[2 + len(CHAIN):2 + 2 * len(CHAIN)])
    for combo, lines in zip(COMBINATIONS, chains):
        assert "--dependency=afterok:<mean-std>" in lines[0]
        for before, line in zip(CHAIN, lines[1:]):
            assert f"--dependency=afterok:<{before}:{combo}>" in line
        assert all(line.endswith(f"--set run.combination={combo}") for line in lines)
        assert all(f"--job-name=scdino-{step}-{combo} " in line for step, line in zip(CHAIN, lines))
    assert out[-1].endswith("compare.slurm run.yaml"), "compare runs on the whole run"
    ends = [f"<report:{c}>" for c in COMBINATIONS] + [f"<linear:{ADAPTIVE}-{c}>" for c in COMBINATIONS]
    assert f"--dependency=afterok:{':'.join(ends)} " in out[-1]


def test_dry_run_trains_the_channel_adaptive_model_once_and_evaluates_it_per_combination(tmp_path):
    """Without a cluster: one pretraining after mean-std, then features..linear per combination after it."""
    write_config(tmp_path, tmp_path / "images")
    out = dry_run(tmp_path).stdout.splitlines()
    pretrain, evaluations = out[2 + 2 * len(CHAIN)], out[3 + 2 * len(CHAIN):-1]
    assert scripts_of([pretrain]) == ["pretrain"] and "--nodes=1 " in pretrain
    assert f"--job-name=scdino-pretrain-{ADAPTIVE} " in pretrain and "--dependency=afterok:<mean-std> " in pretrain
    assert pretrain.endswith(f"pretrain.slurm run.yaml --set run.channel_adaptive={KIND}")
    for combo, lines in zip(COMBINATIONS, (evaluations[:4], evaluations[4:])):
        assert scripts_of(lines) == EVALUATION
        after = [f"pretrain:{ADAPTIVE}", *[f"{s}:{ADAPTIVE}-{combo}" for s in EVALUATION]]
        for before, step, line in zip(after, EVALUATION, lines):
            assert f"--job-name=scdino-{step}-{ADAPTIVE}-{combo} --dependency=afterok:<{before}> " in line
            assert line.endswith(f"--set run.channel_adaptive={KIND} --set run.combination={combo}")


def test_dry_run_from_knn_evaluates_without_pretraining(tmp_path):
    write_config(tmp_path, tmp_path / "images")
    out = dry_run(tmp_path, "--from", "knn").stdout.splitlines()
    assert scripts_of(out) == ["knn", "linear", "export", "plots", "report"] * 2 + ["knn", "linear"] * 2 + ["compare"]
    first = out[2 * len(CHAIN[CHAIN.index("knn"):])]
    assert "--dependency" not in first and first.endswith(f"--set run.channel_adaptive={KIND} --set run.combination=0")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from training.data.synthetic.folders import write_dataset

    root = tmp_path_factory.mktemp("combinations")
    write_dataset(root / "images", classes=4, per_class=20)
    write_config(root, root / "images")
    return root


def submit(cluster, workdir) -> dict[str, str]:
    # a few interpreter starts per combination (run paths) besides the sbatch calls
    out = cluster.run(SUBMIT, "run.yaml", "--nodes", "1", cwd=workdir, timeout=180)
    return dict(line.split() for line in out.splitlines())


@pytest.fixture(scope="module")
def chains(cluster, workdir):
    """Submit once and wait for the compare job; every job must complete."""
    jobs = submit(cluster, workdir)
    per_combination = [f"{s}:{c}" for c in COMBINATIONS for s in CHAIN]
    assert list(jobs) == ["prepare", "mean-std", *per_combination, *ADAPTIVE_JOBS, "compare"]
    infos = wait_all(cluster, jobs, timeout=2400)
    for label, info in infos.items():
        assert info["JobState"] == "COMPLETED", f"{label}: {log_of(workdir, info)}"
    return infos


def wait_all(cluster, jobs: dict[str, str], timeout: float) -> dict[str, dict[str, str]]:
    """Each job's record, read as soon as it ends: Slurm forgets a job MinJobAge (600 s) after its
    end, and the channel-adaptive jobs, submitted last, may end long before a combination's chain."""
    infos: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + timeout
    while True:
        for label in [label for label in jobs if label not in infos]:
            info = cluster.job(jobs[label])
            if info.get("JobState") in FINAL_STATES:
                infos[label] = info
        if len(infos) == len(jobs):
            return {label: infos[label] for label in jobs}
        assert time.monotonic() < deadline, f"not finished after {timeout} s: {sorted(set(jobs) - set(infos))}"
        time.sleep(2)


@pytest.mark.slurm
@pytest.mark.slow
def test_each_combination_ran_its_chain_after_the_shared_steps(chains, workdir):
    for combo in COMBINATIONS:
        labels = ["mean-std", *[f"{s}:{combo}" for s in CHAIN]]
        for before, after in zip(labels, labels[1:]):
            assert chains[after]["StartTime"] >= chains[before]["EndTime"], (before, after)
        assert chains[f"pretrain:{combo}"]["JobName"] == f"scdino-pretrain-{combo}"
        run = workdir / "run" / f"channels_{combo}"
        assert yaml.safe_load((run / "config.yaml").read_text())["data"]["channels"] == combo
        for relative in ("checkpoints/checkpoint.pth", "knn/knn.json", "linear/linear.json", "report.html"):
            assert (run / relative).exists(), (combo, relative)
        assert not (run / "packed").exists() and not (run / "split.json").exists(), "shared, not copied"
    ends = [chains[f"report:{c}"]["EndTime"] for c in COMBINATIONS]
    assert chains["compare"]["StartTime"] >= max(ends + [chains[f"linear:{ADAPTIVE}-{c}"]["EndTime"] for c in COMBINATIONS])


@pytest.mark.slurm
@pytest.mark.slow
def test_the_channel_adaptive_model_trained_once_and_was_evaluated_on_each_combination(chains, workdir):
    assert chains[f"pretrain:{ADAPTIVE}"]["StartTime"] >= chains["mean-std"]["EndTime"]
    assert chains[f"pretrain:{ADAPTIVE}"]["JobName"] == f"scdino-pretrain-{ADAPTIVE}"
    model = RunLayout(workdir / "run").channel_adaptive(KIND)
    trained = yaml.safe_load(model.config.read_text())
    assert trained["model"]["kind"] == KIND and trained["data"]["channels"] == "01"
    assert model.latest_checkpoint.is_file() and "pretrain" in json.loads(model.timings.read_text())
    for combo in COMBINATIONS:
        labels = [f"pretrain:{ADAPTIVE}", *[f"{s}:{ADAPTIVE}-{combo}" for s in EVALUATION]]
        for before, after in zip(labels, labels[1:]):
            assert chains[after]["StartTime"] >= chains[before]["EndTime"], (before, after)
        assert chains[f"features:{ADAPTIVE}-{combo}"]["JobName"] == f"scdino-features-{ADAPTIVE}-{combo}"
        evaluation = model.evaluation(combo)
        assert yaml.safe_load(evaluation.config.read_text())["data"]["channels"] == combo
        index = json.loads((evaluation.features("final") / "index.json").read_text())
        assert index["checkpoint"] == str(model.latest_checkpoint) and index["channels"] == combo
        assert not (evaluation.root / "checkpoints").exists(), "evaluated, not retrained"
        assert evaluation.knn_json.is_file() and evaluation.linear_json.is_file()


@pytest.mark.slurm
@pytest.mark.slow
def test_comparison_holds_the_numbers_each_run_wrote(chains, workdir):
    run = workdir / "run"
    comparison = json.loads((run / "comparison.json").read_text())
    per = comparison["models"]["per_combination"]["combinations"]
    assert list(per) == COMBINATIONS
    for combo in COMBINATIONS:
        knn = json.loads((run / f"channels_{combo}" / "knn" / "knn.json").read_text())
        linear = json.loads((run / f"channels_{combo}" / "linear" / "linear.json").read_text())
        for tag in ("final", "raw_pixels", "random_init"):
            entry = knn["tags"][tag]
            assert per[combo]["knn"][tag]["top1"] == entry["top1"][str(entry["best_k"])]
            assert per[combo]["knn"][tag]["top2"] == entry["top2"][str(entry["best_k"])]
            assert per[combo]["linear"][tag]["final_top1"] == linear["tags"][tag]["history"][-1]["val_top1"]
        timings = json.loads((run / f"channels_{combo}" / "timings.json").read_text())
        # one node, SCDINO_CPU_PROCS_PER_NODE ranks on CPU
        assert per[combo]["compute"]["device"] == "cpu" and per[combo]["compute"]["ranks"] >= 1
        assert per[combo]["compute"]["value"] == pytest.approx(timings["pretrain"] * per[combo]["compute"]["ranks"])
    html = (run / "report.html").read_text()
    assert "Channel combinations" in html and 'href="channels_01/report.html"' in html
    assert (run / "plots" / "channel_combinations.png").is_file()


@pytest.mark.slurm
@pytest.mark.slow
def test_comparison_holds_the_numbers_the_channel_adaptive_evaluations_wrote(chains, workdir):
    parent = RunLayout(workdir / "run")
    models = json.loads(parent.comparison_json.read_text())["models"]
    adaptive = models[KIND]
    assert list(adaptive["combinations"]) == COMBINATIONS
    for combo in COMBINATIONS:
        evaluation = parent.channel_adaptive(KIND).evaluation(combo)
        knn = json.loads(evaluation.knn_json.read_text())
        linear = json.loads(evaluation.linear_json.read_text())
        for tag in ("final", "raw_pixels", "random_init"):
            entry, history = knn["tags"][tag], [h["val_top1"] for h in linear["tags"][tag]["history"]]
            assert adaptive["combinations"][combo]["knn"][tag]["top1"] == entry["top1"][str(entry["best_k"])]
            assert adaptive["combinations"][combo]["knn"][tag]["top2"] == entry["top2"][str(entry["best_k"])]
            assert adaptive["combinations"][combo]["linear"][tag] == {"final_top1": history[-1],
                                                                     "best_top1": max(history)}
    timings = json.loads(parent.channel_adaptive(KIND).timings.read_text())
    compute = adaptive["compute"]
    assert compute["device"] == "cpu" and compute["unit"] == "cpu_rank_s" and compute["ranks"] >= 1
    assert compute["value"] == pytest.approx(timings["pretrain"] * compute["ranks"])
    assert compute["train_flops"] > 0 and compute["images_trained"] > 0
    assert adaptive["compute_total"] == {"value": compute["value"], "unit": "cpu_rank_s",
                                         "train_flops": compute["train_flops"], "pretrainings": 1}
    per_total = sum(e["compute"]["value"] for e in models["per_combination"]["combinations"].values())
    assert models["per_combination"]["compute_total"]["value"] == pytest.approx(per_total)
    total_row = next(line for line in parent.comparison_md.read_text().splitlines()
                     if line.startswith("| total training compute "))
    assert f"{compute['value']:.0f} cpu_rank_s, " in total_row and "(1 pretraining)" in total_row
    assert "bag-of-channels model" in parent.report.read_text()


@pytest.mark.slurm
@pytest.mark.slow
def test_resubmission_reruns_only_the_comparison(cluster, chains, workdir):
    model = RunLayout(workdir / "run").channel_adaptive(KIND)
    watched = [workdir / "run" / "channels_0" / "timings.json", model.timings, model.evaluation("0").timings]
    before = [path.read_text() for path in watched]
    jobs = submit(cluster, workdir)
    assert list(jobs) == ["compare"], "prepare, mean-std, both finished chains and the channel-adaptive model are skipped"
    assert cluster.wait(jobs["compare"], timeout=300)["JobState"] == "COMPLETED"
    assert [path.read_text() for path in watched] == before


def test_dry_run_skips_what_is_finished(tmp_path):
    """Without a cluster: with split.json and mean_std.json there, combination 0's report written and
    the channel-adaptive model evaluated on 0, a resubmission asks for combination 01's chain and the
    channel-adaptive pretraining (straight away), its evaluation on 01, then compare."""
    write_config(tmp_path, tmp_path / "images")
    parent = RunLayout(tmp_path / "run")
    finished = [parent.split, parent.mean_std, parent.combination("0").report,
                parent.channel_adaptive(KIND).evaluation("0").linear_json]
    for path in finished:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    done = dry_run(tmp_path)
    out = done.stdout.splitlines()
    assert scripts_of(out) == [*CHAIN, "pretrain", *EVALUATION, "compare"]
    assert "--dependency" not in out[0] and out[0].endswith("--set run.combination=01")
    assert "--dependency" not in out[len(CHAIN)] and out[len(CHAIN)].endswith(f"--set run.channel_adaptive={KIND}")
    assert out[len(CHAIN) + 1].endswith(f"--set run.channel_adaptive={KIND} --set run.combination=01")
    assert f"--dependency=afterok:<report:01>:<linear:{ADAPTIVE}-01> " in out[-1]
    assert "prepare: skipped" in done.stderr and "mean-std: skipped" in done.stderr
    assert "channels 0: finished (its report exists), skipped" in done.stderr
    assert f"channel-adaptive {KIND} model on 0: evaluated (its linear probe exists), skipped" in done.stderr


def test_dry_run_skips_the_channel_adaptive_model_once_every_evaluation_is_done(tmp_path):
    write_config(tmp_path, tmp_path / "images")
    parent = RunLayout(tmp_path / "run")
    for combo in COMBINATIONS:
        for path in (parent.combination(combo).report, parent.channel_adaptive(KIND).evaluation(combo).linear_json):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
    for path in (parent.split, parent.mean_std):
        path.write_text("{}")
    out = dry_run(tmp_path).stdout.splitlines()
    assert scripts_of(out) == ["compare"] and "--dependency" not in out[0]


def test_dry_run_without_the_option_submits_no_channel_adaptive_job(tmp_path):
    write_config(tmp_path, tmp_path / "images")
    out = dry_run(tmp_path, "--set", "data.compare_channel_adaptive=false").stdout
    assert scripts_of(out.splitlines()) == ["prepare", "mean-std", *CHAIN, *CHAIN, "compare"]
    assert "run.channel_adaptive" not in out and "--dependency=afterok:<report:0>:<report:01> " in out


def test_dry_run_refuses_a_combination_the_channel_adaptive_model_cannot_read(tmp_path):
    write_config(tmp_path, tmp_path / "images")
    done = dry_run(tmp_path, "--set", "data.channel_combinations=0,2", check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert "trains on data.channels='01', so it cannot be evaluated on '2'" in done.stderr
    assert "submit_pipeline: error: bad configuration" in done.stderr


def test_dry_run_trains_one_model_of_each_listed_kind(tmp_path):
    """data.channel_adaptive_kinds with two kinds: each its own pretraining and evaluations, and
    compare after all of them."""
    write_config(tmp_path, tmp_path / "images")
    out = dry_run(tmp_path, "--set", "data.channel_adaptive_kinds=bag_of_channels,channel_vit").stdout.splitlines()
    assert scripts_of(out) == ["prepare", "mean-std", *CHAIN, *CHAIN,
                               "pretrain", *EVALUATION, *EVALUATION, "pretrain", *EVALUATION, *EVALUATION, "compare"]
    vit_pretrain = out[2 + 2 * len(CHAIN) + 1 + 2 * len(EVALUATION)]
    assert "--job-name=scdino-pretrain-adaptive-channel_vit " in vit_pretrain
    assert vit_pretrain.endswith("--set run.channel_adaptive=channel_vit")
    first_vit = out[out.index(vit_pretrain) + 1]
    assert first_vit.endswith("--set run.channel_adaptive=channel_vit --set run.combination=0")
    assert "--dependency=afterok:<pretrain:adaptive-channel_vit> " in first_vit
    ends = [f"<report:{c}>" for c in COMBINATIONS] + [f"<linear:adaptive-{k}-{c}>" for k in (KIND, "channel_vit")
                                                      for c in COMBINATIONS]
    assert f"--dependency=afterok:{':'.join(ends)} " in out[-1]
