"""Multi-channel single-cell images: reading, indexing, splitting, packing, augmenting, loading.

Two on-disk forms feed training: a folder of TIFFs in class folders (scDINO's layout) and the
packed form written by `prepare` (one flat memory-mapped array plus index.json), which avoids
opening ~100k small files per epoch on FSx or S3.
"""
