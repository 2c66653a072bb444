"""A channel-adaptive ViT: every channel is embedded on its own, so one model encodes any subset.

As in ChannelViT (Bao et al., 2024), written here from the idea: each channel of a (B, C, H, W)
image goes through one shared single-channel patch projection; each patch token then gets the
position embedding of its patch (shared by all channels, resampled for other crop sizes exactly as
the plain backbone does) plus a learned embedding of its channel. The tokens of the channels present
are concatenated after the CLS token, so the sequence holds C x N + 1 tokens and attention mixes
channels and positions alike. A channel's embedding is indexed by its ORIGINAL id (the digit of
data.channels at training time, stored in the `channel_ids` buffer), so channels (0, 2) of a model
trained on 01234 meet exactly the embeddings they were trained with, and a missing channel is simply
absent from the sequence (no zero-filled input that the network would read as "dark").

Parameter names stay DINO's (cls_token, pos_embed, patch_embed.proj, blocks.N..., norm); the new ones
are `channel_embed` (1, C, D) and the buffer `channel_ids` (C,), which a checkpoint carries so that
any reader knows which channel each row belongs to.

Cost: attention grows with (C x N)^2 and the MLPs with C x N, so a 5-channel step costs several
times the plain ViT's at the same size (measured figures in docs/training.md). That is the price of
letting attention see each channel separately; the plain ViT stays the default.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from training.models.vit import DinoVisionTransformer


def init_channel_embedding(embedding: torch.Tensor, how: str, std: float = 0.02) -> None:
    """Fill a (1, C, D) channel embedding: "normal" draws each entry from a truncated normal of
    `std`; "orthogonal" makes the C rows orthogonal, each of the norm a "normal" row has on average
    (std x sqrt(D)), so only their directions differ from the default."""
    if how == "normal":
        nn.init.trunc_normal_(embedding, std=std)
    elif how == "orthogonal":
        with torch.no_grad():
            rows = torch.empty(embedding.shape[1:])
            nn.init.orthogonal_(rows)
            embedding.copy_(rows[None] * std * embedding.shape[-1] ** 0.5)
    else:
        raise ValueError(f"channel embedding init {how!r}; allowed: normal, orthogonal")


class ChannelVisionTransformer(DinoVisionTransformer):
    """forward(x (B, C, H, W), channels) -> normalised CLS features (B, embed_dim).

    `channels` are the original ids of x's channels, in x's order; by default `input_channels`,
    which is every trained channel unless `select_input_channels` chose a subset (evaluation of one
    combination: the data loader then delivers only those channels).
    """

    def __init__(self, *, channel_ids: Sequence[int], channel_embed_init: str = "normal", **kwargs) -> None:
        kwargs["in_chans"] = 1
        super().__init__(**kwargs)
        ids = tuple(int(c) for c in channel_ids)
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"channel_ids must be distinct channel ids, got {ids}")
        self.register_buffer("channel_ids", torch.tensor(ids, dtype=torch.long))
        self.channel_embed = nn.Parameter(torch.zeros(1, len(ids), self.embed_dim))
        init_channel_embedding(self.channel_embed, channel_embed_init)
        self.input_channels: tuple[int, ...] = ids
        self._trained_channels = ids
        self.register_load_state_dict_post_hook(_remember_trained_channels)

    @property
    def trained_channels(self) -> tuple[int, ...]:
        """The `channel_ids` buffer's ids, kept on the host too: every forward asks for them, and
        reading a GPU buffer waits for all the work queued before it."""
        return self._trained_channels

    def select_input_channels(self, channels: Sequence[int]) -> None:
        """Declare which original channels the inputs carry from now on (checked against the model)."""
        self.embedding_rows(channels)
        self.input_channels = tuple(int(c) for c in channels)

    def embedding_rows(self, channels: Sequence[int]) -> list[int]:
        """Rows of `channel_embed` for original channel ids; an unknown or repeated id is an error."""
        trained = self.trained_channels
        unknown = [c for c in channels if c not in trained]
        if unknown or not channels or len(set(channels)) != len(channels):
            allowed = "".join(map(str, trained))
            raise ValueError(f"channels {tuple(channels)}: this channel-adaptive model was trained on channels "
                             f"{allowed!r}; data.channels must be a non-empty subset of them without repeats")
        return [trained.index(c) for c in channels]

    def forward(self, x: torch.Tensor, channels: Sequence[int] | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(x, channels=channels))

    def forward_features(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                         channels: Sequence[int] | None = None) -> torch.Tensor:
        return self._encode(self._tokens(x, channels), attn_mask, is_causal)

    def _tokens(self, x: torch.Tensor, channels: Sequence[int] | None = None) -> torch.Tensor:
        """CLS, then the N patch tokens of each present channel in x's order: (B, 1 + C x N, D)."""
        channels = self.input_channels if channels is None else tuple(channels)
        batch, n_chans, height, width = x.shape
        if n_chans != len(channels):
            raise ValueError(f"the input has {n_chans} channels but {len(channels)} channel ids {channels}")
        x = self._whole_patches(x)
        patches = self.patch_embed(x.reshape(batch * n_chans, 1, *x.shape[-2:]))  # (B*C, rows, cols, D)
        _, grid_h, grid_w, dim = patches.shape
        pos = self._position_embedding((grid_h, grid_w), square_image=height == width)
        patches = patches.reshape(batch, n_chans, grid_h * grid_w, dim) + pos[:, None, 1:]
        # the rows picked one by one (views), not through an index tensor: on a GPU that tensor
        # would be copied from pageable memory, which waits for everything queued before it
        picked = torch.stack([self.channel_embed[:, row] for row in self.embedding_rows(channels)], dim=1)
        patches = patches + picked[:, :, None, :]
        cls = (self.cls_token + pos[:, :1]).expand(batch, -1, -1)
        tokens = torch.cat([cls, patches.reshape(batch, n_chans * grid_h * grid_w, dim)], dim=1)
        return self.norm_pre(self.patch_drop(self.pos_drop(tokens)))

    @torch.no_grad()
    def get_last_selfattention(self, x: torch.Tensor, channels: Sequence[int] | None = None) -> torch.Tensor:
        """Last block's attention folded to patch positions, (B, heads, N + 1, N + 1) like the plain ViT.

        Over keys, a position's weight is the sum over its channels' tokens (rows still sum to 1);
        over queries, the mean over channels. The CLS row, which the attention plots draw, is then
        the CLS token's attention to each patch position, whatever channel it came from.
        """
        n_chans = x.shape[1]
        attention = self._last_attention(self._tokens(x, channels))
        batch, heads, tokens, _ = attention.shape
        positions = (tokens - 1) // n_chans
        cls_query, patch_query = attention[:, :, :1], attention[:, :, 1:]
        patch_query = patch_query.reshape(batch, heads, n_chans, positions, tokens).mean(dim=2)
        folded = torch.cat([cls_query, patch_query], dim=2)
        patch_keys = folded[..., 1:].reshape(batch, heads, positions + 1, n_chans, positions).sum(dim=3)
        return torch.cat([folded[..., :1], patch_keys], dim=3)


def _remember_trained_channels(module: ChannelVisionTransformer, _incompatible_keys: object) -> None:
    """After a checkpoint's `channel_ids` are loaded, the host copy follows them (read once, here)."""
    module._trained_channels = tuple(int(c) for c in module.channel_ids.tolist())
