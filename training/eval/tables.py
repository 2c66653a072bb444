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


def knn_rows(knn: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per feature tag, one 'top-1 / top-2' column per k."""
    ks = [int(k) for k in knn["ks"]]
    header = ["features", "epoch", *[f"k={k}" for k in ks], "best k"]
    rows = []
    for tag in sorted(knn["tags"], key=tags.sort_key):
        entry = knn["tags"][tag]
        cells = [f"{_percent(entry['top1'][str(k)])} / {_percent(entry['top2'][str(k)])}" for k in ks]
        rows.append([tags.title(tag), _epoch(entry.get("epoch")), *cells, str(entry["best_k"])])
    return header, rows


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
