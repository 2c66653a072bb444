"""A bag-of-channels ViT: every channel is an image of its own through one shared single-channel ViT.

The recipe of IC-ViT, CHAMMI-75's released model and "Scaling Channel-Adaptive Self-Supervised
Learning" (TMLR 2025), written here from the idea: pretraining shows the network one channel of an
image at a time (training/dino/channels.py draws which), so it learns what a cell looks like in any
stain without knowing which stain it is; at evaluation each channel of a combination is encoded on
its own and the combination's feature is built from the channels' CLS features (`combine`). One
model trained on data.channels then serves every subset of them, and a training step costs one
channel's tokens per view: the plain ViT's sequence length, not C times it as in ChannelViT.

Parameter names are the plain ViT's (DINO's), with a one-channel patch embedding, plus the buffer
`bag_channel_ids` (the original ids of the channels it was trained on, which a checkpoint carries so
that an evaluation can refuse a channel the model never saw). That buffer is what tells a
bag-of-channels checkpoint from a plain one (training/models/pretrained.py).
"""

from __future__ import annotations

import itertools
from typing import Literal, Sequence, get_args

import torch
from torch.nn import functional as F

from training.models.vit import DinoVisionTransformer

Combine = Literal["concat", "concat_normalized", "mean", "concat_pairs"]
COMBINE_RULES: tuple[str, ...] = get_args(Combine)


def channel_pairs(channels: int) -> list[tuple[int, int]]:
    """The pairs (i, j), i < j, of a combination's channel positions, in the order "concat_pairs" lays
    out their features: (0, 1), (0, 2), ..., (1, 2), ..."""
    return list(itertools.combinations(range(channels), 2))


def combined_dim(embed_dim: int, channels: int, combine: str) -> int:
    """Width of a combination's feature: C x D when concatenated, D when averaged, (C + C(C-1)/2) x D
    with the channel pairs."""
    if combine == "mean" or channels == 1:
        return embed_dim
    return embed_dim * (channels * (channels + 1) // 2 if combine == "concat_pairs" else channels)


class ChannelBagViT(DinoVisionTransformer):
    """forward(x (B, C, H, W)) -> (B, D) for C = 1 (training), else the channels' CLS features combined.

    `combine` is how a multi-channel input's per-channel CLS features (each (B, D), after the final
    norm) become one row: "concat" in x's channel order (B, C x D); "concat_normalized" the same
    after L2-normalising each channel's feature, so every channel weighs the same in a cosine
    similarity whatever its feature norm; "mean" their average (B, D); "concat_pairs" the "concat"
    features followed by one CLS feature per pair of channels (`channel_pairs` order), each pair
    encoded as ONE single-channel image, the mean of its two channels: a picture in which the model
    sees where one stain lies relative to another, which no single channel shows
    (B, (C + C(C-1)/2) x D).
    """

    def __init__(self, *, channel_ids: Sequence[int], combine: Combine = "concat", **kwargs) -> None:
        kwargs["in_chans"] = 1
        super().__init__(**kwargs)
        ids = tuple(int(c) for c in channel_ids)
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"channel_ids must be distinct channel ids, got {ids}")
        if combine not in COMBINE_RULES:
            raise ValueError(f"combine={combine!r}; allowed: {', '.join(COMBINE_RULES)}")
        self.register_buffer("bag_channel_ids", torch.tensor(ids, dtype=torch.long))
        self.combine = combine
        self.input_channels: tuple[int, ...] = ids

    @property
    def trained_channels(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.bag_channel_ids.tolist())

    def select_input_channels(self, channels: Sequence[int]) -> None:
        """Declare which original channels the inputs carry (each must be one the model trained on)."""
        trained = self.trained_channels
        channels = tuple(int(c) for c in channels)
        unknown = [c for c in channels if c not in trained]
        if unknown or not channels or len(set(channels)) != len(channels):
            raise ValueError(f"channels {channels}: this bag-of-channels model was trained on channels "
                             f"{''.join(map(str, trained))!r}; data.channels must be a non-empty subset of them "
                             "without repeats")
        self.input_channels = channels

    def output_dim(self, channels: int) -> int:
        return combined_dim(self.embed_dim, channels, self.combine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            return super().forward(x)
        batch, n_chans = x.shape[:2]
        if self.combine == "concat_pairs":
            first, second = zip(*channel_pairs(n_chans))
            x = torch.cat([x, (x[:, list(first)] + x[:, list(second)]) / 2], dim=1)
            n_chans = x.shape[1]
        features = super().forward(x.reshape(batch * n_chans, 1, *x.shape[-2:])).reshape(batch, n_chans, -1)
        if self.combine == "mean":
            return features.mean(dim=1)
        if self.combine == "concat_normalized":
            features = F.normalize(features, dim=-1)
        return features.reshape(batch, -1)

    @torch.no_grad()
    def get_last_selfattention(self, x: torch.Tensor) -> torch.Tensor:
        """Last block's attention (B, heads, N + 1, N + 1), averaged over the channels, each seen alone."""
        batch, n_chans = x.shape[:2]
        single = x.reshape(batch * n_chans, 1, *x.shape[-2:])
        attention = self._last_attention(self._tokens(single))
        return attention.reshape(batch, n_chans, *attention.shape[1:]).mean(dim=1)
