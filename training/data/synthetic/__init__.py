"""Synthetic data with known answers: folders.py draws cells by phenotype and writes them as class
folders of single-cell TIFFs (the demo's dataset, and bad images to test the readers), plates.py
places the same cells into fields of view of a plate screen with a load table and imaging effects."""
