"""compare: every channel combination's run side by side, and what each channel contributes.

    python -m training compare --config run.yaml

Run after each entry of data.channel_combinations has had its chain (slurm/submit_pipeline.sh does
both). Reads channels_<combination>/knn/knn.json, linear/linear.json, timings.json and the checkpoint
of each; with data.compare_channel_adaptive also, for each kind of data.channel_adaptive_kinds,
channel_adaptive_<kind>/'s timings.json and checkpoint and the knn.json and linear.json of its
evaluation on each combination (channel_adaptive_<kind>/channels_<c>/).
Writes <run>/comparison.json and comparison.md and the figure plots/channel_combinations.png
(listed in the plots manifest, so `report` on the run shows it).
"""

from __future__ import annotations

import argparse
import logging

from training.config import Config
from training.errors import UserError
from training.rundir import RunLayout

log = logging.getLogger(__name__)


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    """Gather the combinations' results into comparison.json / .md and draw the figure."""
    from training.eval.compare import build_comparison, comparison_markdown
    from training.plots.figures import comparison_plots
    from training.writes.atomic import write_json_atomic, write_text_atomic

    if config.run.combination or config.run.channel_adaptive or not config.data.channel_combinations:
        raise UserError("compare needs data.channel_combinations and runs on the whole run "
                        f"(run.combination and run.channel_adaptive empty), got "
                        f"{list(config.data.channel_combinations)}, run.combination={config.run.combination!r} "
                        f"and run.channel_adaptive={config.run.channel_adaptive!r}")
    comparison = build_comparison(config, layout)
    write_json_atomic(layout.comparison_json, comparison, indent=2)
    text = comparison_markdown(comparison)
    write_text_atomic(layout.comparison_md, text)
    comparison_plots(layout, comparison)
    print(text)
    log.info("wrote %s and %s", layout.comparison_json, layout.comparison_md.name)
    return 0
