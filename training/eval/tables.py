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
    return (f"{knn['n_reference']} reference and {knn['n_query']} query images (seed {knn['seed']}), "
            f"T={knn['temperature']}{whitened}.")


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
    """(mAP, 'significant / treatments') of a tag's "map" entry; dashes without one."""
    if not entry or entry.get("mean_map") is None:
        return "-", "-"
    return f"{entry['mean_map']:.3f}", f"{entry['n_significant']} / {entry['n_treatments']}"


def has_screen_measures(knn: dict[str, Any]) -> bool:
    return "not_same_batch" in knn or "map" in knn


def screen_rows(knn: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows, one per feature tag: plain kNN top-1, not-same-batch kNN top-1 (each at its
    best k) and mAP with its significant treatments, the columns the run measured."""
    batches, retrieval = "not_same_batch" in knn, "map" in knn
    header = ["features", "epoch", "kNN top-1 %", *(["kNN not same batch %"] if batches else []),
              *(["mAP", "treatments q < 0.05"] if retrieval else [])]
    rows = []
    for tag in sorted(knn["tags"], key=tags.sort_key):
        entry = knn["tags"][tag]
        row = [tags.title(tag), _epoch(entry.get("epoch")), best_top1(entry)]
        row += [best_top1(entry.get("not_same_batch"))] if batches else []
        row += list(map_cell(entry.get("map"))) if retrieval else []
        rows.append(row)
    return header, rows


def screen_setup(knn: dict[str, Any]) -> str:
    """How the screen measures were taken, in a sentence or two."""
    parts = []
    if "not_same_batch" in knn:
        parts.append(f"Not same batch: a query never votes with a reference of its own batch "
                     f"({knn['not_same_batch']['batch_column']}, {knn['not_same_batch']['n_batches']} batches).")
    if "map" in knn:
        m = knn["map"]
        sphered = ", sphered on the control wells" if m["normalization"] == "spherize" else ""
        parts.append(f"mAP: per-well profiles (median of the evaluated cells{sphered}) retrieve wells of their "
                     f"treatment ({m['treatment_column']}; positives: same treatment, other well; negatives: other "
                     f"treatment, same plate; cosine); mean over treatments"
                     f"{' but ' + ', '.join(m['controls']) if m.get('controls') else ''}, and how many have an "
                     f"FDR-corrected permutation p below {m['threshold']} (copairs).")
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
