"""What each channel contributes: every channel combination's run side by side.

scDINO trains one model per entry of its channel-combination list and compares them. Each
combination's run (RunLayout.combination) wrote knn/knn.json and linear/linear.json with the trained
model and both baselines on the same images; this module gathers, per combination, kNN top-1/top-2
at the best k and the linear probe's final top-1 of each, and the pretraining compute, into one
comparison (JSON for tools, Markdown for people). "models" holds one entry per way of getting a
model for each combination: "per_combination" (one pretraining each) and, with
data.compare_channel_adaptive, one entry per kind of data.channel_adaptive_kinds ("bag_of_channels",
"channel_vit": one model pretrained once on data.channels, evaluated on every combination without
retraining, RunLayout.channel_adaptive(kind).evaluation), with the same fields per combination and
each model's total training compute: wall time x ranks as measured, and the analytic training FLOPs
(training.costs.flops.train_flops_per_image x images trained), which compare across CPU and GPU.
"""

from __future__ import annotations

from typing import Any

from training.config import Config
from training.errors import MissingInputError, UserError
from training.eval.tables import markdown_table
from training.results import comparison_bill, knn_headline
from training.rundir import RunLayout, tags
from training.rundir.artifacts import (
    checkpoint_progress,
    load_knn,
    load_linear,
    read_metrics,
    read_timings,
)

PER_COMBINATION = "per_combination"
"""The "models" key of scDINO's way: one pretraining per channel combination. Each channel-adaptive
model trained once and evaluated on every combination is keyed by its kind (model.kind)."""
MODEL_NAMES = {PER_COMBINATION: "one model per combination", "bag_of_channels": "bag-of-channels model",
               "channel_vit": "ChannelViT model"}
"""How tables name each way."""
WHITENED_NOTE = "Every kNN here whitened its features first (eval.knn_whiten), not scDINO's plain cosine."
"""What comparison.md and the report say when the runs' kNN whitened their features."""
PLAIN_ADAPTIVE_NOTE = ("Every kNN here is scDINO's plain cosine, which weighs each channel's part of a "
                       "channel-adaptive model's feature alike; to compare channel-adaptive models, run the knn "
                       "steps and compare again with eval.knn_whiten=true (docs/performance.md measures both).")
"""What they say when channel-adaptive models are compared under the plain kNN."""
SCREEN_NOTE = ("kNN not same batch: a query never votes with a cell of its own imaging batch (data.batch_column), "
               "top-1 / top-2 % at its best k. mAP: retrieval mean average precision of per-well profiles by "
               "treatment (copairs), with the treatments whose FDR-corrected p < 0.05 out of those scored.")
"""What comparison.md and the report say when the runs measured a screen."""


def adaptive_models(comparison: dict[str, Any]) -> list[str]:
    """The channel-adaptive models' keys in comparison["models"], in data.channel_adaptive_kinds order."""
    return [key for key in comparison["models"] if key != PER_COMBINATION]


def knn_note(comparison: dict[str, Any]) -> str | None:
    """The line comparison.md and the report give on how the kNN compared features, if any."""
    if comparison.get("knn_whitened"):
        return WHITENED_NOTE
    return PLAIN_ADAPTIVE_NOTE if adaptive_models(comparison) else None


def knn_scores(knn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per headline tag (trained, raw pixels, random init): best k and top-1/top-2 there, and where
    the run measured them the not-same-batch kNN's and the mAP."""
    return {tag: {key: entry[key] for key in ("best_k", "top1", "top2", "not_same_batch", "map") if key in entry}
            for tag, entry in knn_headline(knn).items()}


def linear_scores(linear: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per headline tag the linear probe evaluated: final and best validation top-1."""
    return {tag: {"final_top1": linear["tags"][tag]["final_top1"], "best_top1": linear["tags"][tag]["best_top1"]}
            for tag in tags.HEADLINE if tag in linear["tags"]}


def pretrain_compute(layout: RunLayout, config: Config) -> dict[str, Any]:
    """Pretraining cost of the run `config` describes: wall seconds of the pretrain step
    (timings.json, last attempt) times the ranks that trained (the checkpoint's world size):
    GPU-seconds on GPUs (one GPU per rank), CPU rank-seconds otherwise (core-seconds when each rank
    has one core, as with OMP_NUM_THREADS=1); and `train_flops`, the analytic FLOPs of the steps
    trained (global step x global batch x the model kind's FLOPs per image), whatever the device."""
    from training.costs.flops import train_flops_per_image

    wall = read_timings(layout).get("pretrain")
    progress = checkpoint_progress(layout)
    ranks = progress.get("world_size")
    on_gpu = any(r.get("gpu_mem_gb") is not None for r in read_metrics(layout)) if layout.metrics.is_file() else False
    value = round(wall * ranks, 3) if wall is not None and ranks else None
    images = progress["global_step"] * config.optim.batch_size_per_gpu * ranks if ranks and "global_step" in progress \
        else None
    flops = float(images * train_flops_per_image(config, config.data.in_chans)) if images is not None else None
    return {"pretrain_wall_s": wall, "ranks": ranks, "device": "gpu" if on_gpu else "cpu",
            "unit": "gpu_s" if on_gpu else "cpu_rank_s", "value": value, "images_trained": images,
            "train_flops": flops}


def run_results(run: RunLayout, selector: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """knn.json and linear.json of one run; a missing one names the step to run, with `selector`
    (the --set arguments that pick that run)."""
    for path, step in ((run.knn_json, "knn"), (run.linear_json, "linear")):
        if not path.is_file():
            raise MissingInputError(f"{step} results", path, f"{step} {selector}")
    return load_knn(run), load_linear(run)


def scores_entry(config: Config, parent: RunLayout, run: RunLayout, combination: str, selector: str) -> dict[str, Any]:
    """One combination's kNN and linear-probe figures of one model, read from the files `run` wrote."""
    names = config.data.for_combination(combination).channel_names or tuple(f"ch{c}" for c in combination)
    knn, linear = run_results(run, selector)
    return {"run": run.root.relative_to(parent.root).as_posix(), "channels": combination,
            "channel_names": list(names), "knn": knn_scores(knn), "knn_whitened": bool(knn.get("whitened", False)),
            "linear": linear_scores(linear)}


def combination_entry(config: Config, layout: RunLayout, combination: str) -> dict[str, Any]:
    """One combination's figures, read from the files its run wrote."""
    run = layout.combination(combination)
    entry = scores_entry(config, layout, run, combination, f"--set run.combination={combination}")
    return {**entry, "compute": pretrain_compute(run, config.replace({"run.combination": combination}))}


def channel_adaptive_model(config: Config, layout: RunLayout, kind: str) -> dict[str, Any]:
    """The channel-adaptive model of `kind`: its figures on every combination (its evaluations'
    files) and the compute of its one pretraining."""
    model = layout.channel_adaptive(kind)
    if not model.latest_checkpoint.is_file():
        raise MissingInputError(f"the {MODEL_NAMES[kind]}'s checkpoint", model.latest_checkpoint,
                                f"pretrain --set run.channel_adaptive={kind}")
    selector = f"--set run.channel_adaptive={kind} --set run.combination="
    entries = {combo: scores_entry(config, layout, model.evaluation(combo), combo, selector + combo)
               for combo in config.data.channel_combinations}
    compute = pretrain_compute(model, config.replace({"run.channel_adaptive": kind}))
    return {"description": f"one {MODEL_NAMES[kind]} ({kind}) pretrained once on channels "
                           f"{config.data.channels}, evaluated on every combination without retraining",
            "kind": kind, "run": model.root.name, "channels": config.data.channels, "combinations": entries,
            "compute": compute, "compute_total": _total([compute]), "contribution": contribution(entries)}


def _total(computes: list[dict[str, Any]]) -> dict[str, Any]:
    """Summed compute of some pretrainings: measured (in their unit) and analytic FLOPs; None where
    any part is unknown."""
    values = [c["value"] for c in computes]
    flops = [c["train_flops"] for c in computes]
    return {"value": round(sum(values), 3) if values and None not in values else None,
            "unit": "+".join(sorted({c["unit"] for c in computes})),
            "train_flops": float(sum(flops)) if flops and None not in flops else None,
            "pretrainings": len(computes)}


def contribution(entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per channel: trained kNN top-1 with that channel alone and with all channels but it, against
    all channels together (the combination holding every listed channel), where those were run."""
    top1 = {combo: e["knn"][tags.FINAL]["top1"] for combo, e in entries.items() if tags.FINAL in e["knn"]}
    every = sorted(set("".join(entries)))
    full = next((combo for combo in top1 if sorted(combo) == every), None)
    per_channel = {}
    for channel in every:
        without = next((top1[c] for c in top1 if sorted(c) == [x for x in every if x != channel]), None)
        per_channel[channel] = {"alone": top1.get(channel), "all_but": without}
    return {"all_channels": full, "all_top1": top1.get(full) if full else None, "per_channel": per_channel}


def build_comparison(config: Config, layout: RunLayout) -> dict[str, Any]:
    """The comparison of every combination in data.channel_combinations: run on their own, and
    evaluated with the channel-adaptive model when data.compare_channel_adaptive."""
    combinations = config.data.channel_combinations
    entries = {combo: combination_entry(config, layout, combo) for combo in combinations}
    models = {PER_COMBINATION: {"description": "one pretraining per combination (scDINO)", "combinations": entries,
                                "compute_total": _total([e["compute"] for e in entries.values()])}}
    if config.data.compare_channel_adaptive:
        for kind in config.data.channel_adaptive_kinds:
            models[kind] = channel_adaptive_model(config, layout, kind)
    return {"combinations": list(combinations), "models": models, "knn_whitened": same_knn_rule(models),
            "contribution": contribution(entries),
            "bill": comparison_bill(layout, list(combinations))}  # None until `summary --jobs` has run


def same_knn_rule(models: dict[str, Any]) -> bool:
    """Whether every run's kNN whitened its features (eval.knn_whiten); refused when the runs
    disagree, since a whitened kNN and a plain one do not compare."""
    runs = {True: [], False: []}
    for model in models.values():
        for entry in model["combinations"].values():
            runs[entry["knn_whitened"]].append(entry["run"])
    if runs[True] and runs[False]:
        raise UserError(f"the kNN of {', '.join(runs[True])} whitened its features and that of "
                        f"{', '.join(runs[False])} did not: run `knn` again on them all with the same "
                        "--set eval.knn_whiten=true or false, then `compare`")
    return bool(runs[True])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _knn_cell(entry: dict[str, Any], tag: str) -> str:
    knn = entry["knn"].get(tag)
    return "-" if knn is None else f"{_pct(knn['top1'])} / {_pct(knn['top2'])}"


def _linear_cell(entry: dict[str, Any], tag: str) -> str:
    return _pct(entry["linear"][tag]["final_top1"]) if tag in entry["linear"] else "-"


def _cost(compute: dict[str, Any]) -> str:
    """Measured compute and, where known, the analytic training FLOPs (PFLOP = 1e15)."""
    measured = "-" if compute["value"] is None else f"{compute['value']:.0f} {compute['unit']}"
    flops = compute.get("train_flops")
    return measured if flops is None else f"{measured}, {flops / 1e15:.3g} PFLOP"


def _channels_cell(combo: str, entry: dict[str, Any]) -> str:
    return f"{combo} ({', '.join(entry['channel_names'])})"


def _measured(entries: dict[str, Any], key: str) -> bool:
    """Whether any combination's run measured `key` ("not_same_batch", "map") for any tag."""
    return any(key in scores for entry in entries.values() for scores in entry["knn"].values())


def _screen_cells(entry: dict[str, Any], tag: str, key: str) -> str:
    """Not-same-batch top-1 / top-2 at its best k, or mAP (significant / treatments), of one tag."""
    found = entry["knn"].get(tag, {}).get(key)
    if found is None:
        return "-"
    if key == "map":
        return "-" if found["mean_map"] is None else \
            f"{found['mean_map']:.3f} ({found['n_significant']}/{found['n_treatments']})"
    return f"{_pct(found['top1'])} / {_pct(found['top2'])}"


def comparison_rows(comparison: dict[str, Any], model: str = PER_COMBINATION) -> tuple[list[str], list[list[str]]]:
    """Header and one row per combination: kNN top-1 / top-2 (and where measured not-same-batch kNN
    and mAP) and linear top-1 of the trained model and of both baselines, and the pretraining
    compute where each combination has its own."""
    entries = comparison["models"][model]["combinations"]
    own_compute = all("compute" in entry for entry in entries.values())
    screen = [key for key in ("not_same_batch", "map") if _measured(entries, key)]
    names = {"not_same_batch": "kNN not same batch", "map": "mAP (q<0.05)"}
    header = ["channels", *[f"kNN {tags.LABELS[t]}" for t in tags.HEADLINE],
              *[f"{names[key]} {tags.LABELS[t]}" for key in screen for t in tags.HEADLINE],
              *[f"linear {tags.LABELS[t]}" for t in tags.HEADLINE], *(["pretrain compute"] if own_compute else [])]
    rows = []
    for combo, entry in entries.items():
        knn = [_knn_cell(entry, t) for t in tags.HEADLINE]
        measures = [_screen_cells(entry, t, key) for key in screen for t in tags.HEADLINE]
        linear = [_linear_cell(entry, t) for t in tags.HEADLINE]
        rows.append([_channels_cell(combo, entry), *knn, *measures, *linear,
                     *([_cost(entry["compute"])] if own_compute else [])])
    return header, rows


def side_by_side_rows(comparison: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and one row per combination with each model's trained kNN top-1 / top-2 and linear
    top-1, then one row with each model's total training compute."""
    models = comparison["models"]
    header = ["channels", *[f"{what}, {MODEL_NAMES[m]}" for m in models for what in ("kNN", "linear")]]
    rows = []
    for combo in comparison["combinations"]:
        cells = [cell for m in models for cell in (_knn_cell(models[m]["combinations"][combo], tags.FINAL),
                                                   _linear_cell(models[m]["combinations"][combo], tags.FINAL))]
        rows.append([_channels_cell(combo, models[PER_COMBINATION]["combinations"][combo]), *cells])
    totals = []
    for m in models:
        total = models[m]["compute_total"]
        count = total.get("pretrainings", 1)
        totals += [f"{_cost(total)} ({count} pretraining{'s' if count > 1 else ''})", ""]
    rows.append(["total training compute", *totals])
    return header, rows


def contribution_lines(comparison: dict[str, Any]) -> list[str]:
    """What each channel adds (trained kNN top-1 alone and all but it), for each model."""
    share = comparison["contribution"]
    if not share["all_channels"]:
        return []
    line = f"All channels ({share['all_channels']}): trained kNN top-1 {_pct(share['all_top1'])} %"
    header = ["channel", "alone", "all but it"]
    rows = [[c, _pct(v["alone"]), _pct(v["all_but"])] for c, v in share["per_channel"].items()]
    adaptive = adaptive_models(comparison)
    if adaptive:
        line += f" ({MODEL_NAMES[PER_COMBINATION]})"
    for model in adaptive:
        other = comparison["models"][model]["contribution"]
        line += f", {_pct(other['all_top1'])} % ({MODEL_NAMES[model]})"
        header += [f"alone, {MODEL_NAMES[model]}", f"all but it, {MODEL_NAMES[model]}"]
        for row, channel in zip(rows, share["per_channel"]):
            row += [_pct(other["per_channel"][channel]["alone"]), _pct(other["per_channel"][channel]["all_but"])]
    return [line + ".", "", markdown_table(header, rows)]


def comparison_markdown(comparison: dict[str, Any]) -> str:
    """comparison.md: the models side by side (with channel-adaptive ones), each model's table
    against its baselines, then what each channel adds."""
    parts = ["# Channel combinations (kNN top-1 / top-2 % at the best k; linear probe final top-1 %)", ""]
    if any(_measured(model["combinations"], key) for model in comparison["models"].values()
           for key in ("not_same_batch", "map")):
        parts += [SCREEN_NOTE, ""]
    note = knn_note(comparison)
    if note:
        parts += [note, ""]
    adaptive = adaptive_models(comparison)
    if adaptive:
        others = " and ".join(f"one {MODEL_NAMES[m]}" for m in adaptive)
        parts += [f"## {MODEL_NAMES[PER_COMBINATION].capitalize()} against {others}",
                  "", markdown_table(*side_by_side_rows(comparison)), "",
                  f"## {MODEL_NAMES[PER_COMBINATION].capitalize()} (scDINO), against its baselines", ""]
    parts += [markdown_table(*comparison_rows(comparison)), ""]
    for model in adaptive:
        entry = comparison["models"][model]
        parts += [f"## The {MODEL_NAMES[model]}, trained once on channels {entry['channels']}, "
                  "against its baselines", "", markdown_table(*comparison_rows(comparison, model)), ""]
    return "\n".join(parts + contribution_lines(comparison)) + "\n"
