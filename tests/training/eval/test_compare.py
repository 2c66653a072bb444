"""`compare`: every channel combination's run side by side, its numbers taken from the files each
run wrote (knn.json, linear.json, timings.json, the checkpoint), and the report section it feeds."""

from __future__ import annotations

import json
from html import escape as html_escape

import pytest
import torch

from training.cli import main
from training.config import Config
from training.costs.flops import train_flops_per_image
from training.errors import MissingInputError, UserError
from training.rundir import RunLayout

COMBINATIONS = ["01", "0", "1"]
HEADLINE = ("final", "raw_pixels", "random_init")
STEPS = 90
"""Global steps each fixture run trained (its checkpoint's "global_step")."""


def knn_file(seed: int) -> dict:
    """A knn.json whose tags have different best k, so a wrong k or tag would show."""
    def entry(shift: float, best: int) -> dict:
        top1 = {"5": 0.4 + shift, "10": 0.45 + shift}
        return {"epoch": 1, "top1": top1, "top2": {k: min(v + 0.2, 1.0) for k, v in top1.items()}, "best_k": best}

    return {"ks": [5, 10], "seed": 0, "temperature": 0.07, "n_reference": 40, "n_query": 20, "class_names": ["a", "b"],
            "tags": {"final": entry(0.1 * seed + 0.05, 10), "epoch_0001": entry(0.0, 5),
                     "raw_pixels": entry(0.02 * seed, 5), "random_init": entry(-0.1, 10)}}


def linear_file(seed: int) -> dict:
    def entry(base: float) -> dict:
        history = [{"epoch": e, "train_loss": 1.0 / e, "val_top1": base + 0.01 * e} for e in (1, 2, 3)]
        return {"epoch": 1, "history": history, "final_top1": history[-1]["val_top1"],
                "best_top1": max(h["val_top1"] for h in history)}

    return {"tags": {"final": entry(0.5 + 0.1 * seed), "raw_pixels": entry(0.3), "random_init": entry(0.2)}}


def write_run(layout: RunLayout, seed: int, *, pretrain_s: float, world_size: int, gpu: bool) -> None:
    """The files a combination's chain leaves that compare reads."""
    layout.knn.mkdir(parents=True)
    layout.linear.mkdir()
    layout.checkpoints.mkdir()
    layout.knn_json.write_text(json.dumps(knn_file(seed)))
    layout.linear_json.write_text(json.dumps(linear_file(seed)))
    layout.timings.write_text(json.dumps({"pretrain": pretrain_s, "knn": 1.0}))
    layout.metrics.write_text(json.dumps({"kind": "epoch", "epoch": 0, "gpu_mem_gb": 1.5 if gpu else None}) + "\n")
    torch.save({"world_size": world_size, "epoch": 1, "global_step": STEPS}, layout.latest_checkpoint)


def flops(world_size: int, **overrides) -> float:
    """Training FLOPs of STEPS steps of the default model on `world_size` ranks (default batch)."""
    config = Config().replace({"data.channel_combinations": COMBINATIONS, **overrides})
    images = STEPS * config.optim.batch_size_per_gpu * world_size
    return float(images * train_flops_per_image(config, config.data.in_chans))


@pytest.fixture
def runs(tmp_path):
    parent = RunLayout(tmp_path / "run")
    for seed, combo in enumerate(COMBINATIONS):
        write_run(parent.combination(combo), seed, pretrain_s=10.0 + seed, world_size=2, gpu=False)
    args = ["--set", f"run.output_dir={parent.root}", "--set", f"data.channel_combinations={','.join(COMBINATIONS)}"]
    return parent, args


def best(entry: dict, which: str) -> float:
    return entry[which][str(entry["best_k"])]


def test_comparison_numbers_are_those_the_runs_wrote(runs):
    parent, args = runs
    assert main(["compare", *args]) == 0
    comparison = json.loads(parent.comparison_json.read_text())
    per = comparison["models"]["per_combination"]["combinations"]
    assert list(per) == COMBINATIONS
    total = total_flops = 0.0
    for combo in COMBINATIONS:
        run = parent.combination(combo)
        knn, linear = json.loads(run.knn_json.read_text()), json.loads(run.linear_json.read_text())
        for tag in HEADLINE:
            assert per[combo]["knn"][tag]["top1"] == best(knn["tags"][tag], "top1"), (combo, tag)
            assert per[combo]["knn"][tag]["top2"] == best(knn["tags"][tag], "top2"), (combo, tag)
            assert per[combo]["linear"][tag]["final_top1"] == linear["tags"][tag]["history"][-1]["val_top1"]
        seconds = json.loads(run.timings.read_text())["pretrain"] * torch.load(run.latest_checkpoint)["world_size"]
        combination_flops = flops(2, **{"run.combination": combo})
        assert per[combo]["compute"] == {"pretrain_wall_s": seconds / 2, "ranks": 2, "device": "cpu",
                                         "unit": "cpu_rank_s", "value": seconds, "images_trained": STEPS * 30 * 2,
                                         "train_flops": combination_flops}
        total += seconds
        total_flops += combination_flops
    assert per["01"]["compute"]["train_flops"] > per["0"]["compute"]["train_flops"]  # two channels' patch embedding
    assert comparison["models"]["per_combination"]["compute_total"] == {
        "value": total, "unit": "cpu_rank_s", "train_flops": total_flops, "pretrainings": 3}


def test_contribution_reads_single_channels_against_all(runs):
    parent, args = runs
    assert main(["compare", *args]) == 0
    share = json.loads(parent.comparison_json.read_text())["contribution"]
    top1 = {c: best(json.loads(parent.combination(c).knn_json.read_text())["tags"]["final"], "top1")
            for c in COMBINATIONS}
    assert share["all_channels"] == "01" and share["all_top1"] == top1["01"]
    # with two channels, "all but channel 0" is channel 1 alone
    assert share["per_channel"] == {"0": {"alone": top1["0"], "all_but": top1["1"]},
                                    "1": {"alone": top1["1"], "all_but": top1["0"]}}


def test_markdown_and_report_show_the_table_and_figure(runs, capsys):
    parent, args = runs
    assert main(["compare", *args]) == 0
    markdown = parent.comparison_md.read_text()
    first = json.loads(parent.combination("0").knn_json.read_text())["tags"]["final"]
    cell = f"{100 * best(first, 'top1'):.1f} / {100 * best(first, 'top2'):.1f}"
    seconds = json.loads(parent.combination("0").timings.read_text())["pretrain"] * 2
    row = next(line for line in markdown.splitlines() if line.startswith("| 0 (ch0)"))
    assert cell in row and f"{seconds:.0f} cpu_rank_s" in row
    manifest = json.loads(parent.plots_manifest.read_text())
    assert [e["png"] for e in manifest] == ["channel_combinations.png"]
    assert (parent.plots / "channel_combinations.png").stat().st_size > 1000
    assert main(["report", *args]) == 0
    html = parent.report.read_text()
    assert "Channel combinations" in html and cell in html and 'href="channels_01/report.html"' in html
    assert "data:image/png;base64" in html
    assert "No kNN results yet" not in html, "the parent run trains nothing: no empty result sections"
    assert "eval.knn_whiten" not in html and "eval.knn_whiten" not in markdown, "plain kNN: nothing to say"


def test_gpu_runs_count_gpu_seconds(tmp_path):
    parent = RunLayout(tmp_path / "run")
    write_run(parent.combination("0"), 0, pretrain_s=100.0, world_size=8, gpu=True)
    assert main(["compare", "--set", f"run.output_dir={parent.root}", "--set", "data.channel_combinations=0"]) == 0
    comparison = json.loads(parent.comparison_json.read_text())
    compute = comparison["models"]["per_combination"]["combinations"]["0"]["compute"]
    assert (compute["device"], compute["unit"], compute["value"]) == ("gpu", "gpu_s", 800.0)


def test_a_missing_result_names_the_step_and_no_list_is_an_error(runs, tmp_path):
    parent, args = runs
    parent.combination("1").linear_json.unlink()
    with pytest.raises(MissingInputError, match="linear"):
        from training.config import load_config
        from training.eval.compare import build_comparison

        build_comparison(load_config(None, [a for a in args if a != "--set"]), parent)
    assert main(["compare", "--set", f"run.output_dir={tmp_path}"]) == 2
    with pytest.raises(UserError, match="data.channel_combinations"):
        from training.steps import compare

        compare.run(load_config(None, ["data.channel_combinations=0", "run.combination=0"]), parent, None)


ADAPTIVE_WALL_S, ADAPTIVE_RANKS = 7.5, 4
KIND = "bag_of_channels"


@pytest.fixture
def adaptive_runs(runs):
    """The per-combination runs plus the channel-adaptive model (trained on 4 GPUs) and its
    evaluation on every combination, with figures of their own."""
    parent, args = runs
    model = parent.channel_adaptive(KIND)
    model.checkpoints.mkdir(parents=True)
    model.timings.write_text(json.dumps({"pretrain": ADAPTIVE_WALL_S}))
    model.metrics.write_text(json.dumps({"kind": "epoch", "epoch": 0, "gpu_mem_gb": 3.0}) + "\n")
    torch.save({"world_size": ADAPTIVE_RANKS, "epoch": 1, "global_step": STEPS}, model.latest_checkpoint)
    for seed, combo in zip((2.5, 3.5, 4.5), COMBINATIONS):
        evaluation = model.evaluation(combo)
        evaluation.knn.mkdir(parents=True)
        evaluation.linear.mkdir()
        evaluation.knn_json.write_text(json.dumps(knn_file(seed)))
        evaluation.linear_json.write_text(json.dumps(linear_file(seed)))
    return parent, [*args, "--set", "data.compare_channel_adaptive=true"]


def test_channel_adaptive_numbers_are_those_its_evaluations_wrote(adaptive_runs):
    parent, args = adaptive_runs
    assert main(["compare", *args]) == 0
    models = json.loads(parent.comparison_json.read_text())["models"]
    assert list(models) == ["per_combination", KIND]
    adaptive = models[KIND]
    assert adaptive["kind"] == KIND and adaptive["run"] == f"channel_adaptive_{KIND}"
    assert list(adaptive["combinations"]) == COMBINATIONS
    for combo in COMBINATIONS:
        entry = adaptive["combinations"][combo]
        run = parent.root / f"channel_adaptive_{KIND}" / f"channels_{combo}"
        knn = json.loads((run / "knn" / "knn.json").read_text())
        linear = json.loads((run / "linear" / "linear.json").read_text())
        assert entry["run"] == f"channel_adaptive_{KIND}/channels_{combo}" and entry["channels"] == combo
        for tag in HEADLINE:
            assert entry["knn"][tag]["top1"] == best(knn["tags"][tag], "top1"), (combo, tag)
            assert entry["knn"][tag]["top2"] == best(knn["tags"][tag], "top2"), (combo, tag)
            history = [h["val_top1"] for h in linear["tags"][tag]["history"]]
            assert entry["linear"][tag] == {"final_top1": history[-1], "best_top1": max(history)}, (combo, tag)
        own = models["per_combination"]["combinations"][combo]["knn"]["final"]["top1"]
        assert entry["knn"]["final"]["top1"] != own, "the two models' figures come from different files"
    value = ADAPTIVE_WALL_S * ADAPTIVE_RANKS
    adaptive_flops = flops(ADAPTIVE_RANKS, **{"model.kind": KIND})
    assert adaptive["compute"] == {"pretrain_wall_s": ADAPTIVE_WALL_S, "ranks": ADAPTIVE_RANKS, "device": "gpu",
                                   "unit": "gpu_s", "value": value, "images_trained": STEPS * 30 * ADAPTIVE_RANKS,
                                   "train_flops": adaptive_flops}
    assert adaptive["compute_total"] == {"value": value, "unit": "gpu_s", "train_flops": adaptive_flops,
                                         "pretrainings": 1}
    per_total = models["per_combination"]["compute_total"]
    assert (per_total["value"], per_total["unit"]) == ((10.0 + 11.0 + 12.0) * 2, "cpu_rank_s")


def test_channel_adaptive_contribution_reads_its_own_single_channels(adaptive_runs):
    parent, args = adaptive_runs
    assert main(["compare", *args]) == 0
    share = json.loads(parent.comparison_json.read_text())["models"][KIND]["contribution"]
    top1 = {c: best(json.loads(parent.channel_adaptive(KIND).evaluation(c).knn_json.read_text())["tags"]["final"], "top1")
            for c in COMBINATIONS}
    assert share == {"all_channels": "01", "all_top1": top1["01"],
                     "per_channel": {"0": {"alone": top1["0"], "all_but": top1["1"]},
                                     "1": {"alone": top1["1"], "all_but": top1["0"]}}}


def cells(markdown: str, first: str) -> list[str]:
    """The cells of the first Markdown table row whose first cell is `first`."""
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {first} "))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_markdown_shows_both_models_side_by_side_with_their_compute(adaptive_runs):
    parent, args = adaptive_runs
    assert main(["compare", *args]) == 0
    markdown = parent.comparison_md.read_text()
    own = parent.combination("0")
    adaptive = parent.channel_adaptive(KIND).evaluation("0")
    figures = []
    for run in (own, adaptive):
        knn = json.loads(run.knn_json.read_text())["tags"]["final"]
        linear = json.loads(run.linear_json.read_text())["tags"]["final"]["history"][-1]["val_top1"]
        figures += [f"{100 * best(knn, 'top1'):.1f} / {100 * best(knn, 'top2'):.1f}", f"{100 * linear:.1f}"]
    assert cells(markdown, "0 (ch0)") == ["0 (ch0)", *figures]
    per_total = sum(json.loads(parent.combination(c).timings.read_text())["pretrain"] * 2 for c in COMBINATIONS)
    per_flops = sum(flops(2, **{"run.combination": c}) for c in COMBINATIONS) / 1e15
    adaptive_flops = flops(ADAPTIVE_RANKS, **{"model.kind": KIND}) / 1e15
    assert cells(markdown, "total training compute") == [
        "total training compute", f"{per_total:.0f} cpu_rank_s, {per_flops:.3g} PFLOP (3 pretrainings)", "",
        f"{ADAPTIVE_WALL_S * ADAPTIVE_RANKS:.0f} gpu_s, {adaptive_flops:.3g} PFLOP (1 pretraining)", ""]
    assert "## The bag-of-channels model, trained once on channels 01234, against its baselines" in markdown
    plain_note = "plain cosine, which weighs each channel's part of a channel-adaptive model's feature alike"
    assert plain_note in markdown and "eval.knn_whiten=true" in markdown  # the fixture's kNN are plain
    assert main(["report", *args]) == 0
    html = parent.report.read_text()
    assert "bag-of-channels model" in html and figures[2] in html and "1 pretraining" in html
    assert html_escape(plain_note) in html


def test_without_the_option_the_comparison_has_one_model(adaptive_runs):
    parent, args = adaptive_runs
    off = [a for a in args if a != "data.compare_channel_adaptive=true"][:-1]
    assert main(["compare", *off]) == 0
    assert list(json.loads(parent.comparison_json.read_text())["models"]) == ["per_combination"]
    markdown = parent.comparison_md.read_text()
    assert "bag-of-channels" not in markdown and "##" not in markdown
    assert "plain cosine" not in markdown  # nothing to say about scDINO's own kNN among its own runs


def test_a_missing_evaluation_names_its_file_and_the_step_to_run(adaptive_runs, capsys):
    parent, args = adaptive_runs
    missing = parent.channel_adaptive(KIND).evaluation("1").linear_json
    missing.unlink()
    assert main(["compare", *args]) == 2
    error = capsys.readouterr().err
    assert str(missing) in error
    assert f"python -m training linear --set run.channel_adaptive={KIND} --set run.combination=1" in error
    parent.channel_adaptive(KIND).latest_checkpoint.unlink()
    assert main(["compare", *args]) == 2
    error = capsys.readouterr().err
    assert str(parent.channel_adaptive(KIND).latest_checkpoint) in error
    assert f"python -m training pretrain --set run.channel_adaptive={KIND}" in error


def test_compare_refuses_the_channel_adaptive_models_run(adaptive_runs, capsys):
    parent, args = adaptive_runs
    assert main(["compare", *args, "--set", f"run.channel_adaptive={KIND}"]) == 2
    assert "runs on the whole run (run.combination and run.channel_adaptive empty)" in capsys.readouterr().err
    assert not parent.comparison_json.exists()


def test_every_kept_kind_is_a_model_of_its_own(adaptive_runs):
    """data.channel_adaptive_kinds lists two kinds: each one's files give its own "models" entry,
    in the listed order, its FLOPs counted for its own kind."""
    parent, args = adaptive_runs
    other = parent.channel_adaptive("channel_vit")
    other.checkpoints.mkdir(parents=True)
    other.timings.write_text(json.dumps({"pretrain": 20.0}))
    torch.save({"world_size": 1, "epoch": 1, "global_step": STEPS}, other.latest_checkpoint)
    for seed, combo in zip((0.5, 1.5, 2.0), COMBINATIONS):
        evaluation = other.evaluation(combo)
        evaluation.knn.mkdir(parents=True)
        evaluation.linear.mkdir()
        evaluation.knn_json.write_text(json.dumps(knn_file(seed)))
        evaluation.linear_json.write_text(json.dumps(linear_file(seed)))
    both = [*args, "--set", "data.channel_adaptive_kinds=channel_vit,bag_of_channels"]
    assert main(["compare", *both]) == 0
    models = json.loads(parent.comparison_json.read_text())["models"]
    assert list(models) == ["per_combination", "channel_vit", KIND]
    vit_top1 = best(json.loads(other.evaluation("0").knn_json.read_text())["tags"]["final"], "top1")
    assert models["channel_vit"]["combinations"]["0"]["knn"]["final"]["top1"] == vit_top1
    assert models["channel_vit"]["compute_total"]["train_flops"] == flops(1, **{"model.kind": "channel_vit"})
    per_rank = {m: models[m]["compute_total"]["train_flops"] / models[m]["compute"]["ranks"] for m in ("channel_vit", KIND)}
    assert per_rank["channel_vit"] > 2 * per_rank[KIND]  # C x the tokens against one channel's
    markdown = parent.comparison_md.read_text()
    assert "against one ChannelViT model and one bag-of-channels model" in markdown


def test_a_whitened_knn_and_a_plain_one_are_not_compared(runs, capsys):
    parent, args = runs
    first = parent.combination(COMBINATIONS[0]).knn_json
    first.write_text(json.dumps({**json.loads(first.read_text()), "whitened": True}))
    assert main(["compare", *args]) == 2
    error = capsys.readouterr().err
    assert "eval.knn_whiten" in error and f"channels_{COMBINATIONS[0]}" in error
    assert not parent.comparison_json.exists()
    for combo in COMBINATIONS[1:]:
        path = parent.combination(combo).knn_json
        path.write_text(json.dumps({**json.loads(path.read_text()), "whitened": True}))
    assert main(["compare", *args]) == 0
    assert json.loads(parent.comparison_json.read_text())["knn_whitened"] is True
    assert "whitened its features first (eval.knn_whiten)" in parent.comparison_md.read_text()
    assert main(["report", *args]) == 0
    assert "whitened its features first (eval.knn_whiten)" in parent.report.read_text()


def test_the_channel_adaptive_model_whitened_alone_is_not_compared(adaptive_runs, capsys):
    """The mix that matters: the per-combination runs plain, the channel-adaptive model's evaluations whitened."""
    parent, args = adaptive_runs
    for combo in COMBINATIONS:
        path = parent.channel_adaptive(KIND).evaluation(combo).knn_json
        path.write_text(json.dumps({**json.loads(path.read_text()), "whitened": True}))
    assert main(["compare", *args]) == 2
    error = capsys.readouterr().err
    assert f"the kNN of channel_adaptive_{KIND}/channels_{COMBINATIONS[0]}" in error
    assert f"whitened its features and that of channels_{COMBINATIONS[0]}, " in error
    assert "eval.knn_whiten" in error and not parent.comparison_json.exists()
    for combo in COMBINATIONS:  # every run whitened: compared, and said so instead of the plain-kNN advice
        path = parent.combination(combo).knn_json
        path.write_text(json.dumps({**json.loads(path.read_text()), "whitened": True}))
    assert main(["compare", *args]) == 0
    markdown = parent.comparison_md.read_text()
    assert "whitened its features first (eval.knn_whiten)" in markdown and "plain cosine, which" not in markdown
