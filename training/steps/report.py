"""report: one self-contained HTML page per run (config, curves, tables, figures, artefacts).

    python -m training report --config run.yaml

Writes <run>/report.html. Run `plots` first so the figures exist; sections whose inputs are
missing say which step fills them.
"""

from __future__ import annotations

import argparse
import logging

from training.config import Config
from training.errors import MissingInputError
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Write report.html from the run's files."""
    from training.report.html import build_report, report_title
    from training.writes.atomic import write_text_atomic

    if not layout.plots_manifest.is_file() and not layout.knn_json.is_file():
        raise MissingInputError("plots and kNN results", layout.plots_manifest, "plots")
    text = build_report(layout, report_title(config.run.name))
    write_text_atomic(layout.report, text)
    log.info("wrote %s (%.1f kB); open it in a browser", layout.report, len(text) / 1024)
    return 0
