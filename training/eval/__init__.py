"""Downstream evaluation of a pretrained backbone: CLS features, global kNN, linear probe.

The functions here work on arrays and modules; the pipeline steps in training/steps/ wire them to
the run directory (training/rundir/layout.py).
"""
