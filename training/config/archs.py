"""ViT sizes by `model.arch`: (embed_dim, depth, num_heads), as DINO's vit_tiny / vit_small / vit_base.

Standard library only, so that the FLOP count (training/costs/flops.py) and the planner read
the model's size without importing torch; training/models/vit.py builds the models from it.
"""

from __future__ import annotations

ARCHS: dict[str, tuple[int, int, int]] = {
    "vit_tiny": (192, 12, 3),
    "vit_small": (384, 12, 6),
    "vit_base": (768, 12, 12),
}
