"""The run directory: where each file lives (layout.py), the feature tags (tags.py), the feature-set
format (features.py), the readers of what earlier steps wrote (artifacts.py) and how a damaged file
is recognised (integrity.py). The run summary that ends the pipeline is training/results.py."""

from training.rundir.layout import RunLayout

__all__ = ["RunLayout"]
