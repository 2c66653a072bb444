"""Image-based profiles of a screen's cells, as pycytominer and scanpy read them.

wells.py groups cells by well and takes each well's median profile and shared metadata;
normalization.py normalises per-well profiles on the controls (mad_robustize, spherize, Harmony);
export.py writes <run>/profiles/ (AnnData and Parquet, per cell and per well); hybrid.py puts the
trained features beside CellProfiler's, as labs combine them (eval.hybrid_cellprofiler); new_plates.py
checks a new screen against a trained model's card and configures the steps that profile it with that
model (`python -m training profile`). The retrieval mAP
(training/eval/retrieval.py) scores the same per-well profiles.
"""
