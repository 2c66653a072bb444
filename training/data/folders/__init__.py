"""Class folders of single-cell TIFFs (scDINO's layout): index.py finds the images and their classes,
pack.py packs them into parts, prepare.py is the run of `prepare`."""
