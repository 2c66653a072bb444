"""scDINO: self-supervised DINO Vision Transformers on multi-channel single-cell images."""

__version__ = "0.1.0"
