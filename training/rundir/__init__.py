"""The run directory: where each file lives (layout.py), the feature tags (tags.py), the readers of
what earlier steps wrote (artifacts.py) and the run summary (summary.py)."""

from training.rundir.layout import RunLayout

__all__ = ["RunLayout"]
