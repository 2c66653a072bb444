"""Image-based profiles of a screen's cells, as pycytominer and scanpy read them.

wells.py groups cells by well and takes each well's median profile and shared metadata;
normalization.py normalises per-well profiles on the controls (mad_robustize, spherize, Harmony);
export.py writes <run>/profiles/ (AnnData and Parquet, per cell and per well). The retrieval mAP
(training/eval/retrieval.py) scores the same per-well profiles.
"""
