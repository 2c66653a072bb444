"""Figures of a run, drawn from the files earlier steps wrote (never from live objects).

Matplotlib runs with the Agg backend so that plots render on compute nodes without a display.
"""

import matplotlib

matplotlib.use("Agg")
