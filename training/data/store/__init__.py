"""The packed dataset on disk, one room per job: format.py (its files, names and who writes them),
cells.py (the per-cell table), write.py (a part's pixel files and rows), parts.py (a Slurm array's
parts: their slices, folders and checks), merge.py (the merge of `prepare`'s or `ingest`'s parts into
the run's packed dataset and its split, and their --verify), read.py (PackedImages) and convert.py
(v1 packs, once)."""
