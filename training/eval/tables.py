"""Readable tables (Markdown) of kNN and linear-probe results, shared by the steps and the report."""

from __future__ import annotations

from typing import Any

from training.eval.store import tag_order

TAG_NAMES = {"raw_pixels": "raw pixels (baseline)", "random_init": "random init (baseline)"}


def tag_title(tag: str) -> str:
    return TAG_NAMES.get(tag, tag)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def knn_rows(knn: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per feature tag, one 'top-1 / top-2' column per k."""
    ks = [int(k) for k in knn["ks"]]
    header = ["features", "epoch", *[f"k={k}" for k in ks], "best k"]
    rows = []
    for tag in sorted(knn["tags"], key=tag_order):
        entry = knn["tags"][tag]
        cells = [f"{_percent(entry['top1'][str(k)])} / {_percent(entry['top2'][str(k)])}" for k in ks]
        epoch = entry.get("epoch")
        rows.append([tag_title(tag), "-" if epoch is None else str(epoch), *cells, str(entry["best_k"])])
    return header, rows


def linear_rows(linear: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: final and best validation accuracy of the probe per feature tag."""
    header = ["features", "epoch", "final top-1", "best top-1", "probe epochs"]
    rows = []
    for tag in sorted(linear["tags"], key=tag_order):
        entry = linear["tags"][tag]
        epoch = entry.get("epoch")
        rows.append([tag_title(tag), "-" if epoch is None else str(epoch), _percent(entry["final_top1"]),
                     _percent(entry["best_top1"]), str(len(entry["history"]))])
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-style Markdown table with columns padded to equal width."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
