"""Readable tables (Markdown) of kNN and linear-probe results, shared by the steps and the report."""

from __future__ import annotations

from typing import Any

from training.rundir import tags


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _epoch(value: int | None) -> str:
    return "-" if value is None else str(value)


def knn_setup(knn: dict[str, Any]) -> str:
    """One sentence saying how a knn.json was measured: the split, seed, temperature, and whether the
    features were whitened (eval.knn_whiten); knn.md and the report both open their table with it."""
    whitened = ", features whitened (eval.knn_whiten)" if knn.get("whitened") else ""
    if knn.get("folds", 1) > 1:
        split = (f"every one of {knn['n_query']} held-out images a query once, in {knn['folds']} folds each against "
                 f"the others' {knn['n_reference']} or more references (seed {knn['seed']})")
    else:
        split = f"{knn['n_reference']} reference and {knn['n_query']} query images (seed {knn['seed']})"
    return f"{split}, T={knn['temperature']}{whitened}."


def knn_rows(knn: dict[str, Any], part: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per feature tag, one 'top-1 / top-2' column per k; `part`
    "not_same_batch" gives that kNN's figures (tags without them left out)."""
    ks = [int(k) for k in knn["ks"]]
    header = ["features", "epoch", *[f"k={k}" for k in ks], "best k"]
    rows = []
    for tag in sorted(knn["tags"], key=tags.sort_key):
        entry = knn["tags"][tag] if part is None else knn["tags"][tag].get(part)
        if entry is None:
            continue
        cells = [f"{_percent(entry['top1'][str(k)])} / {_percent(entry['top2'][str(k)])}" for k in ks]
        rows.append([tags.title(tag), _epoch(knn["tags"][tag].get("epoch")), *cells, str(entry["best_k"])])
    return header, rows


def best_top1(entry: dict[str, Any] | None) -> str:
    """'top-1 % (k=K)' at the entry's best k; '-' without the entry."""
    if entry is None:
        return "-"
    return f"{_percent(entry['top1'][str(entry['best_k'])])} (k={entry['best_k']})"


def map_cell(entry: dict[str, Any] | None) -> tuple[str, str]:
    """(mAP, 'retrieved / scored') of a tag's "map" or "map_consistency" entry; dashes without one."""
    if not entry or entry.get("mean_map") is None:
        return "-", "-"
    return f"{entry['mean_map']:.3f}", f"{entry['n_significant']} / {entry['n_treatments']}"


def has_screen_measures(knn: dict[str, Any]) -> bool:
    return "not_same_batch" in knn or "map" in knn


def _activity_measured(knn: dict[str, Any]) -> bool:
    return "map" in knn and "skipped" not in knn["map"]


def screen_rows(knn: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows, one per feature tag: plain kNN top-1, not-same-batch kNN top-1 (each at its
    best k), phenotypic-activity mAP with the treatments it retrieves, and consistency mAP with the
    groups it retrieves: the columns the run measured."""
    batches, activity, consistency = "not_same_batch" in knn, _activity_measured(knn), "map_consistency" in knn
    header = ["features", "epoch", "kNN top-1 %", *(["kNN not same batch %"] if batches else []),
              *(["mAP activity", "retrieved (q < 0.05)"] if activity else []),
              *(["mAP consistency", "groups retrieved"] if consistency else [])]
    rows = []
    for tag in sorted(knn["tags"], key=tags.sort_key):
        entry = knn["tags"][tag]
        row = [tags.title(tag), _epoch(entry.get("epoch")), best_top1(entry)]
        row += [best_top1(entry.get("not_same_batch"))] if batches else []
        row += list(map_cell(entry.get("map"))) if activity else []
        row += list(map_cell(entry.get("map_consistency"))) if consistency else []
        rows.append(row)
    return header, rows


def map_detail_rows(knn: dict[str, Any], part: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows, one per treatment ("map") or group ("map_consistency"): its wells and, for
    the final model and each baseline, its mAP and q ("-" where it has no positive to retrieve)."""
    shown = [t for t in (tags.FINAL, *tags.BASELINES)
             if t in knn["tags"] and (knn["tags"][t].get(part) or {}).get("per_treatment")]
    names = sorted({name for t in shown for name in knn["tags"][t][part]["per_treatment"]})
    header = ["treatment" if part == "map" else "group", "wells", *[f"{tags.label(t)} mAP (q)" for t in shown]]
    rows = []
    for name in names:
        cells = []
        for t in shown:
            found = knn["tags"][t][part]["per_treatment"].get(name) or {}
            cells.append("-" if found.get("map") is None else
                         f"{found['map']:.3f} ({found['q_value']:.3f}){' *' if found['significant'] else ''}")
        wells = next(knn["tags"][t][part]["per_treatment"][name]["n_wells"] for t in shown
                     if name in knn["tags"][t][part]["per_treatment"])
        rows.append([name, str(wells), *cells])
    return header, rows


def screen_setup(knn: dict[str, Any]) -> str:
    """How the screen measures were taken, in a sentence or two."""
    parts = []
    if "not_same_batch" in knn:
        parts.append(f"Not same batch: a query never votes with a reference of its own batch "
                     f"({knn['not_same_batch']['batch_column']}, {knn['not_same_batch']['n_batches']} batches).")
    if "map" in knn:
        m = knn["map"]
        on_all = " (on all of a plate's wells)" if m.get("mad_robustize_samples") == "all" else ""
        steps = [s + on_all if s == "mad_robustize" else s for s in m.get("normalization", []) if s != "none"]
        normalised = f", normalised by {' then '.join(steps)}" if steps else ""
        if "skipped" in m:
            parts.append(f"mAP: {m['skipped']}.")
        else:
            cells = ("every cell of the well, a numbered epoch's of its evaluated cells"
                     if m.get("profiles", "").endswith("of each well's cells") else "the evaluated cells")
            parts.append(f"Phenotypic activity (copairs): per-well profiles ({m.get('aggregation', 'median')} of "
                         f"{cells}{normalised}) "
                         f"of each treatment ({m['perturbation_column']}) retrieve its other wells against "
                         f"{m['negatives']} ({m['controls']}), "
                         f"by cosine; mAP is the mean over treatments, "
                         f"retrieved the treatments with an FDR-corrected permutation p (q) below {m['threshold']}.")
    if "map_consistency" in knn:
        c = knn["map_consistency"]
        parts.append(f"Phenotypic consistency: the wells {c['wells']} retrieve the wells of the other treatments of "
                     f"their group ({c['group_column']}) against those of other groups; mean over groups, and the groups "
                     f"retrieved (q < {c['threshold']}).")
    return " ".join(parts)


def knn_markdown(knn: dict[str, Any]) -> str:
    """knn.md: the setup, the plain kNN table, and where measured the not-same-batch table and the
    screen summary (plain against not same batch against mAP)."""
    parts = ["# Global kNN (top-1 / top-2 accuracy, %)", "", knn_setup(knn), "", markdown_table(*knn_rows(knn)), ""]
    if "not_same_batch" in knn:
        parts += ["## Not same batch (top-1 / top-2 accuracy, %)", "", markdown_table(*knn_rows(knn, "not_same_batch")),
                  ""]
    if has_screen_measures(knn):
        parts += ["## Screen measures", "", screen_setup(knn), "", markdown_table(*screen_rows(knn)), ""]
    for part, title in (("map", "Phenotypic activity per treatment"), ("map_consistency", "Phenotypic consistency per group")):
        header, rows = map_detail_rows(knn, part) if part in knn else ([], [])
        if rows:
            parts += [f"## {title} (mAP and q; * retrieved)", "", markdown_table(header, rows), ""]
    return "\n".join(parts)


def linear_rows(linear: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: final and best validation accuracy of the probe per feature tag."""
    header = ["features", "epoch", "final top-1", "best top-1", "probe epochs"]
    rows = []
    for tag in sorted(linear["tags"], key=tags.sort_key):
        entry = linear["tags"][tag]
        rows.append([tags.title(tag), _epoch(entry.get("epoch")), _percent(entry["final_top1"]),
                     _percent(entry["best_top1"]), str(len(entry["history"]))])
    return header, rows


def finetune_rows(finetune: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and one row: the fine-tuned backbone's final and best validation accuracy, and how it
    was trained (from which pretraining epoch, for how many epochs, on how many ranks)."""
    header = ["backbone", "epoch", "final top-1", "best top-1", "fine-tuning epochs", "ranks"]
    row = [f"fine-tuned ({finetune['parallel']})", _epoch(finetune.get("checkpoint_epoch")),
           _percent(finetune["final_top1"]), _percent(finetune["best_top1"]), str(len(finetune["history"])),
           str(finetune["world_size"])]
    return header, [row]


def finetune_history_rows(finetune: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: training loss and validation top-1 of each fine-tuning epoch."""
    rows = [[str(h["epoch"]), f"{h['train_loss']:.4f}", _percent(h["val_top1"])] for h in finetune["history"]]
    return ["epoch", "train loss", "val top-1"], rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-style Markdown table with columns padded to equal width."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
