"""Class folders of single-cell TIFFs (scDINO's layout): index.py finds the images, their classes
and format, pack.py packs them into parts, prepare.py is the run of `prepare`."""
