"""One chain per channel combination on the local Slurm cluster, sharing prepare and mean-std, then
`compare`; a resubmission reruns nothing that finished. Tiny: ViT-tiny, 32 px crops, 1 epoch, 80
synthetic images, two combinations ("0" and "01"), each pretraining on one node so both run at once.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from slurm_helpers import REPO, log_of

SUBMIT = str(REPO / "slurm" / "submit_pipeline.sh")
COMBINATIONS = ["0", "01"]
CHAIN = ["pretrain", "features", "labels", "knn", "linear", "plots", "report"]
TINY = {
    "run": {"name": "combinations-test", "seed": 0},
    "data": {"num_workers": 0, "holdout_fraction": 0.3, "channel_combinations": COMBINATIONS},
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


def test_dry_run_shares_prepare_and_chains_each_combination(tmp_path):
    """Without a cluster: the order and dependencies of the jobs the submitter would ask for."""
    write_config(tmp_path, tmp_path / "images")
    env = {"PATH": "/usr/bin:/bin", "SCDINO_HOME": str(REPO), "SCDINO_VENV": str(REPO / ".venv")}
    out = subprocess.run([SUBMIT, "run.yaml", "--dry-run", "--nodes", "1"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    scripts = [line.split(".slurm")[0].rsplit("/", 1)[1] for line in out]
    assert scripts == ["prepare", "mean-std", *CHAIN, *CHAIN, "compare"]
    for combo, lines in zip(COMBINATIONS, (out[2:9], out[9:16])):
        assert "--dependency=afterok:<mean-std>" in lines[0]
        for before, line in zip(CHAIN, lines[1:]):
            assert f"--dependency=afterok:<{before}:{combo}>" in line
        assert all(line.endswith(f"--set run.combination={combo}") for line in lines)
        assert all(f"--job-name=scdino-{step}-{combo} " in line for step, line in zip(CHAIN, lines))
    assert "--dependency=afterok:<report:0>:<report:01>" in out[-1] and "run.combination" not in out[-1]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from training.data.synthetic import write_dataset

    root = tmp_path_factory.mktemp("combinations")
    write_dataset(root / "images", classes=4, per_class=20)
    write_config(root, root / "images")
    return root


def submit(cluster, workdir) -> dict[str, str]:
    out = cluster.run(SUBMIT, "run.yaml", "--nodes", "1", cwd=workdir)
    return dict(line.split() for line in out.splitlines())


@pytest.fixture(scope="module")
def chains(cluster, workdir):
    """Submit once and wait for the compare job; every job must complete."""
    jobs = submit(cluster, workdir)
    assert list(jobs) == ["prepare", "mean-std", *[f"{s}:{c}" for c in COMBINATIONS for s in CHAIN], "compare"]
    infos = {}
    for label, job in jobs.items():
        infos[label] = cluster.wait(job, timeout=600)
        assert infos[label]["JobState"] == "COMPLETED", f"{label}: {log_of(workdir, infos[label])}"
    return infos


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
    assert chains["compare"]["StartTime"] >= max(chains[f"report:{c}"]["EndTime"] for c in COMBINATIONS)


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
def test_resubmission_reruns_only_the_comparison(cluster, chains, workdir):
    before = (workdir / "run" / "channels_0" / "timings.json").read_text()
    jobs = submit(cluster, workdir)
    assert list(jobs) == ["compare"], "prepare, mean-std and both finished chains are skipped"
    assert cluster.wait(jobs["compare"], timeout=300)["JobState"] == "COMPLETED"
    assert (workdir / "run" / "channels_0" / "timings.json").read_text() == before


def test_dry_run_skips_what_is_finished(tmp_path):
    """Without a cluster: with split.json and mean_std.json there and combination 0's report written,
    a resubmission asks only for combination 01's chain (straight away) and then compare."""
    write_config(tmp_path, tmp_path / "images")
    run = tmp_path / "run"
    (run / "channels_0").mkdir(parents=True)
    for finished in (run / "split.json", run / "mean_std.json", run / "channels_0" / "report.html"):
        finished.write_text("{}")
    env = {"PATH": "/usr/bin:/bin", "SCDINO_HOME": str(REPO), "SCDINO_VENV": str(REPO / ".venv")}
    done = subprocess.run([SUBMIT, "run.yaml", "--dry-run", "--nodes", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True)
    out = done.stdout.splitlines()
    scripts = [line.split(".slurm")[0].rsplit("/", 1)[1] for line in out]
    assert scripts == [*CHAIN, "compare"]
    assert "--dependency" not in out[0] and out[0].endswith("--set run.combination=01")
    assert "--dependency=afterok:<report:01> " in out[-1]
    assert "prepare: skipped" in done.stderr and "mean-std: skipped" in done.stderr
    assert "channels 0: finished (its report exists), skipped" in done.stderr
