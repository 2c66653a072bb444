"""Self-attention of the CLS token in the last block, per head, beside each input channel.

As in DINO's visualize_attention: the CLS row of the last block's attention, reshaped to the patch
grid and upsampled to the image; each head tends to attend to a different cell structure.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from training.plots.common import new_figure


@torch.no_grad()
def cls_attention(model: torch.nn.Module, image: torch.Tensor, patch_size: int) -> np.ndarray:
    """(heads, H, W) attention of the CLS token over the patches of one normalised (C, H, W) image."""
    _, height, width = image.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    attention = model.get_last_selfattention(image[None, :, : grid_h * patch_size, : grid_w * patch_size])
    heads = attention.shape[1]
    cls_row = attention[0, :, 0, 1:].reshape(heads, grid_h, grid_w)
    maps = F.interpolate(cls_row[None].float(), scale_factor=patch_size, mode="nearest")[0]
    return maps.cpu().numpy()


def plot_attention(
    image: np.ndarray, maps: np.ndarray, channel_names: list[str], title: str
):
    """Top row: each input channel in grey; bottom row: each head's attention and their mean."""
    channels, heads = image.shape[0], maps.shape[0]
    ncols = max(channels, heads + 1)
    fig, axes = new_figure(1.8 * ncols, 4.4, 2, ncols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for c in range(channels):
        axes[0, c].imshow(image[c], cmap="gray")
        axes[0, c].set_title(channel_names[c], fontsize=9)
    for h in range(heads):
        axes[1, h].imshow(maps[h], cmap="inferno")
        axes[1, h].set_title(f"head {h}", fontsize=9)
    axes[1, heads].imshow(maps.mean(axis=0), cmap="inferno")
    axes[1, heads].set_title("mean of heads", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
