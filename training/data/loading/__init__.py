"""Pretraining batches: sampler.py (which cells each rank reads, batch by batch), augment.py (scDINO's
multi-crop for a whole batch at once), two data paths, torch_loader.py and dali.py, and loaders.py,
the one factory that picks between them (data.loader)."""
