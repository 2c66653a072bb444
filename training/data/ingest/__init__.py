"""The modules of `ingest` (what it does and writes: training/steps/ingest.py).

table.py reads the load table (CellProfiler's LoadData naming) and the table of centres, paths.py
finds its files (foreign prefixes such as JUMP's s3:// folders mapped by ingest.path_map), fields.py
reads a field's images and label mask, crops.py measures the objects and cuts their crops, part.py
cuts a slice of the table's rows into one part (with its counts), measurements.py measures each cut
cell as CellProfiler does, checks.py refuses settings that cannot work (and proposes a crop size),
and run.py is the run the step calls; training/data/store/merge.py merges the parts."""
