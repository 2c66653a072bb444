"""Benchmarks of what a model is worth: screen.py (`bench screen`: the screen chain's kNN and mAP
read against a ceiling) and recipes.py (scDINO's pretraining recipe against cheaper ones, kNN
accuracy at their FLOPs)."""
