"""What each channel contributes: every channel combination's run side by side.

scDINO trains one model per entry of its channel-combination list and compares them. Each
combination's run (RunLayout.combination) wrote knn/knn.json and linear/linear.json with the trained
model and both baselines on the same images; this module gathers, per combination, kNN top-1/top-2
at the best k and the linear probe's final top-1 of each, and the pretraining compute, into one
comparison (JSON for tools, Markdown for people). "models" holds one entry per way of getting a
model for each combination ("per_combination": one pretraining each), so that another approach (a
single channel-adaptive model evaluated on every combination) sits beside it with the same fields.
"""

from __future__ import annotations

from typing import Any

from training.config import Config
from training.eval.tables import markdown_table
from training.rundir import RunLayout, tags
from training.rundir.artifacts import (
    checkpoint_world_size,
    load_knn,
    load_linear,
    read_metrics,
    read_timings,
)
from training.rundir.summary import knn_headline

PER_COMBINATION = "per_combination"
"""The "models" key of scDINO's way: one pretraining per channel combination."""


def knn_scores(knn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per headline tag (trained, raw pixels, random init): best k and top-1/top-2 there."""
    return {tag: {"best_k": entry["best_k"], "top1": entry["top1"], "top2": entry["top2"]}
            for tag, entry in knn_headline(knn).items()}


def linear_scores(linear: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per headline tag the linear probe evaluated: final and best validation top-1."""
    return {tag: {"final_top1": linear["tags"][tag]["final_top1"], "best_top1": linear["tags"][tag]["best_top1"]}
            for tag in tags.HEADLINE if tag in linear["tags"]}


def pretrain_compute(layout: RunLayout) -> dict[str, Any]:
    """Pretraining cost: wall seconds of the pretrain step (timings.json, last attempt) times the
    ranks that trained (the checkpoint's world size): GPU-seconds on GPUs (one GPU per rank),
    CPU rank-seconds otherwise (core-seconds when each rank has one core, as with OMP_NUM_THREADS=1)."""
    wall = read_timings(layout).get("pretrain")
    ranks = checkpoint_world_size(layout)
    on_gpu = any(r.get("gpu_mem_gb") is not None for r in read_metrics(layout)) if layout.metrics.is_file() else False
    value = round(wall * ranks, 3) if wall is not None and ranks else None
    return {"pretrain_wall_s": wall, "ranks": ranks, "device": "gpu" if on_gpu else "cpu",
            "unit": "gpu_s" if on_gpu else "cpu_rank_s", "value": value}


def combination_entry(config: Config, layout: RunLayout, combination: str) -> dict[str, Any]:
    """One combination's figures, read from the files its run wrote."""
    run = layout.combination(combination)
    names = config.data.for_combination(combination).channel_names or tuple(f"ch{c}" for c in combination)
    return {"run": run.root.name, "channels": combination, "channel_names": list(names),
            "knn": knn_scores(load_knn(run)), "linear": linear_scores(load_linear(run)),
            "compute": pretrain_compute(run)}


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
    """The comparison of every combination in data.channel_combinations (run on their own)."""
    combinations = config.data.channel_combinations
    entries = {combo: combination_entry(config, layout, combo) for combo in combinations}
    values = [e["compute"]["value"] for e in entries.values()]
    units = sorted({e["compute"]["unit"] for e in entries.values()})
    total = round(sum(values), 3) if values and None not in values else None
    return {"combinations": list(combinations),
            "models": {PER_COMBINATION: {"description": "one pretraining per combination (scDINO)",
                                         "combinations": entries,
                                         "compute_total": {"value": total, "unit": "+".join(units)}}},
            "contribution": contribution(entries)}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def comparison_rows(comparison: dict[str, Any], model: str = PER_COMBINATION) -> tuple[list[str], list[list[str]]]:
    """Header and one row per combination: kNN top-1 / top-2 and linear top-1 of the trained model
    and of both baselines, and the pretraining compute."""
    header = ["channels", *[f"kNN {tags.LABELS[t]}" for t in tags.HEADLINE],
              *[f"linear {tags.LABELS[t]}" for t in tags.HEADLINE], "pretrain compute"]
    rows = []
    for combo, entry in comparison["models"][model]["combinations"].items():
        knn = [f"{_pct(entry['knn'][t]['top1'])} / {_pct(entry['knn'][t]['top2'])}" if t in entry["knn"] else "-"
               for t in tags.HEADLINE]
        linear = [_pct(entry["linear"][t]["final_top1"]) if t in entry["linear"] else "-" for t in tags.HEADLINE]
        compute = entry["compute"]
        cost = "-" if compute["value"] is None else f"{compute['value']:.0f} {compute['unit']}"
        rows.append([f"{combo} ({', '.join(entry['channel_names'])})", *knn, *linear, cost])
    return header, rows


def comparison_markdown(comparison: dict[str, Any]) -> str:
    """comparison.md: the table, then what each channel adds."""
    header, rows = comparison_rows(comparison)
    parts = ["# Channel combinations (kNN top-1 / top-2 % at the best k; linear probe final top-1 %)", "",
             markdown_table(header, rows), ""]
    share = comparison["contribution"]
    if share["all_channels"]:
        parts.append(f"All channels ({share['all_channels']}): trained kNN top-1 {_pct(share['all_top1'])} %.")
        rows = [[c, _pct(v["alone"]), _pct(v["all_but"])] for c, v in share["per_channel"].items()]
        parts += ["", markdown_table(["channel", "alone", "all but it"], rows)]
    return "\n".join(parts) + "\n"
