"""The packed dataset on disk, one room per job: format.py (its files, names and who writes them),
cells.py (the per-cell table), write.py (a part's pixel files and rows), parts.py (a Slurm array's
parts: their slices, folders and checks), merge.py (parts -> one packed dataset), read.py
(PackedImages) and convert.py (v1 packs, once)."""
