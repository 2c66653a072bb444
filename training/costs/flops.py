"""Analytic FLOPs of one DINO training step, per image (standard library only: `bench step` states
them, and the planner and the comparison read them without importing torch). Of the package it reads
only the ViT sizes (training/config/archs.py); the configuration it is given is typed, not imported.

  3 x (student forward on all crops)  [forward + backward = 3 x forward]
  + 1 x (teacher forward on the 2 global crops),
where one ViT forward on a crop of N tokens (N = (side / patch)^2 + 1) costs, per block,
24 N d^2 (qkv, projection, MLP) + 4 N^2 d (attention scores and weighted sum) FLOPs, plus the patch
embedding 2 (N - 1) C p^2 d and the DINO head 2 (d h + h^2 + h b + b K) (h = 2048, b = 256, K = out_dim).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.config.archs import ARCHS

if TYPE_CHECKING:
    from training.config import Config


def vit_forward_flops(arch: str, patch: int, in_chans: int, side: int, token_sets: int = 1) -> float:
    """One forward of a crop; `token_sets` > 1 is a ChannelViT's sequence, one set of patch tokens
    per channel (each embedded from `in_chans` = 1 channel)."""
    embed_dim, depth, _ = ARCHS[arch]
    patches = (side // patch) ** 2 * token_sets
    tokens = patches + 1
    blocks = depth * (24 * tokens * embed_dim**2 + 4 * tokens**2 * embed_dim)
    return blocks + 2 * patches * in_chans * patch**2 * embed_dim


def head_flops(arch: str, out_dim: int, hidden: int = 2048, bottleneck: int = 256) -> float:
    embed_dim = ARCHS[arch][0]
    return 2 * (embed_dim * hidden + hidden * hidden + hidden * bottleneck + bottleneck * out_dim)


def train_flops_per_image(config: Config, in_chans: int) -> float:
    """Analytic FLOPs of one training step per image (see the module docstring), for every
    model.kind: a "bag_of_channels" step encodes model.bag_channels_per_image single-channel images
    per image; a "channel_vit" step one token set per channel of the step's subset, averaged over
    the subset sizes its sampling draws (uniform in 1..C when hierarchical, else C)."""
    model, dino = config.model, config.dino
    head = head_flops(model.arch, model.out_dim)

    def crop(side: int) -> float:
        if model.kind == "bag_of_channels":
            return model.bag_channels_per_image * (vit_forward_flops(model.arch, model.patch_size, 1, side) + head)
        if model.kind == "channel_vit":
            sizes = range(1, in_chans + 1) if model.channel_sampling == "hierarchical" else [in_chans]
            return sum(vit_forward_flops(model.arch, model.patch_size, 1, side, s) for s in sizes) / len(sizes) + head
        return vit_forward_flops(model.arch, model.patch_size, in_chans, side) + head

    global_crops = 2 * crop(dino.global_crop_size)
    local_crops = dino.local_crops_number * crop(dino.local_crop_size)
    return 3 * (global_crops + local_crops) + global_crops


def eval_flops_per_image(config: Config, side: int) -> float:
    """One backbone forward at evaluation (feature extraction): no head, one crop of `side` pixels
    (a bag of channels encodes each channel on its own; a ChannelViT all channels' tokens at once)."""
    model, chans = config.model, config.data.in_chans
    if model.kind == "bag_of_channels":
        return chans * vit_forward_flops(model.arch, model.patch_size, 1, side)
    if model.kind == "channel_vit":
        return vit_forward_flops(model.arch, model.patch_size, 1, side, chans)
    return vit_forward_flops(model.arch, model.patch_size, chans, side)


def params_estimate(config: Config) -> int:
    """Trainable parameters of the student (ViT and DINO head), counted from the shapes: the planner's
    figure when no `bench step` measured them."""
    embed_dim, depth, _ = ARCHS[config.model.arch]
    patch, chans, side = config.model.patch_size, config.data.in_chans, config.dino.global_crop_size
    embedding = chans * patch**2 * embed_dim + embed_dim + ((side // patch) ** 2 + 2) * embed_dim
    blocks = depth * (12 * embed_dim**2 + 13 * embed_dim) + 2 * embed_dim
    hidden, bottleneck = 2048, 256
    head = (embed_dim + 1) * hidden + (hidden + 1) * hidden + (hidden + 1) * bottleneck + bottleneck * config.model.out_dim
    return embedding + blocks + head


def activation_bytes_per_image(config: Config) -> float:
    """Activation memory the student's backward keeps per image: per block s h (34 + 5 a s / h)
    bytes in 16-bit (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", eq. 1, no tensor parallelism), summed over the crops; twice that in fp32."""
    embed_dim, depth, heads = ARCHS[config.model.arch]
    patch, dino = config.model.patch_size, config.dino
    sides = [dino.global_crop_size] * 2 + [dino.local_crop_size] * dino.local_crops_number
    total = 0.0
    for side in sides:
        tokens = (side // patch) ** 2 + 1
        total += depth * tokens * embed_dim * (34 + 5 * heads * tokens / embed_dim)
    return total * (2 if config.train.precision == "fp32" else 1)
