"""Vision Transformer backbone: timm's ViT with the parameter names of facebookresearch/dino.

timm's `VisionTransformer` already names its parameters as DINO's `vision_transformer.py` does
(cls_token, pos_embed, patch_embed.proj, blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2},
norm) and uses PyTorch's scaled-dot-product attention. This module adds what DINO's results depend
on: the position embedding resampled to other crop sizes exactly as DINO does (timm's resampling
gives features about 2 % away at 96 px), the CLS feature as the output and the last block's
attention weights for attention maps.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

import torch
from timm.layers import resample_abs_pos_embed
from timm.models import checkpoint_seq
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.nn import functional as F

from training.config.archs import ARCHS  # (embed_dim, depth, num_heads); torch-free for the planner

PosEmbedInterpolation = Literal["dino", "timm"]


def dino_resample_pos_embed(pos_embed: torch.Tensor, grid: tuple[int, int], square_image: bool = True) -> torch.Tensor:
    """DINO's `interpolate_pos_encoding` for a (rows, cols) patch grid: (1, 1 + N, D) -> (1, 1 + rows*cols, D).

    As in DINO, the stored embedding is kept when the token count is N and the image is square in
    pixels; otherwise the stored sqrt(N) x sqrt(N) grid is resampled bicubically (no antialias) with
    scale factors (rows + 0.1) / sqrt(N) and (cols + 0.1) / sqrt(N), even when a non-square image
    has the stored grid. Passing the scale factor rather than the output size matters: PyTorch maps
    output to input coordinates by 1 / scale, so the result differs from a `size=` resampling.
    """
    stored = pos_embed.shape[1] - 1
    side = math.isqrt(stored)
    rows, cols = grid
    if rows * cols == stored and square_image:
        return pos_embed
    dim = pos_embed.shape[-1]
    patch_grid = pos_embed[:, 1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)
    scale = ((rows + 0.1) / math.sqrt(stored), (cols + 0.1) / math.sqrt(stored))
    resampled = F.interpolate(patch_grid, scale_factor=scale, mode="bicubic")
    if tuple(resampled.shape[-2:]) != (rows, cols):
        raise RuntimeError(f"position embedding resampled to {tuple(resampled.shape[-2:])}, expected {grid}")
    return torch.cat([pos_embed[:, :1], resampled.permute(0, 2, 3, 1).reshape(1, rows * cols, dim)], dim=1)


class DinoVisionTransformer(VisionTransformer):
    """A timm ViT whose forward returns the normalised CLS token, shape (B, embed_dim).

    `pos_embed_interpolation` chooses how the stored position embedding meets other crop sizes:
    "dino" as facebookresearch/dino (a DINO or scDINO checkpoint gives DINO's features at every
    size), "timm" as timm's `dynamic_img_size` (antialiased resampling to the exact grid).
    DINO's rule depends on the image's pixel shape, not only on its patch grid, so the forward
    pass builds its tokens with `_tokens`, which sees the image.
    """

    def __init__(self, *, pos_embed_interpolation: PosEmbedInterpolation = "dino", **kwargs) -> None:
        if pos_embed_interpolation not in ("dino", "timm"):
            raise ValueError(f"pos_embed_interpolation={pos_embed_interpolation!r}; allowed: dino, timm")
        super().__init__(**kwargs)
        self.pos_embed_interpolation = pos_embed_interpolation

    def _pos_embed(self, x: torch.Tensor, square_image: bool | None = None) -> torch.Tensor:
        """Prepend the CLS token and add the position embedding to patch tokens (B, rows, cols, D).

        `square_image` (the pixel shape, for DINO's rule) defaults to a square grid meaning a
        square image, for timm's own callers that only pass the tokens.
        """
        if x.ndim != 4:
            return super()._pos_embed(x)
        batch, rows, cols, dim = x.shape
        square = rows == cols if square_image is None else square_image
        tokens = torch.cat([self.cls_token.expand(batch, -1, -1), x.reshape(batch, rows * cols, dim)], dim=1)
        return self.pos_drop(tokens + self._position_embedding((rows, cols), square))

    def _position_embedding(self, grid: tuple[int, int], square_image: bool) -> torch.Tensor:
        """(1, 1 + rows x cols, D) for a patch grid: DINO's resampling, or timm's (as timm's own
        `_pos_embed` calls it), as pos_embed_interpolation says."""
        if self.pos_embed_interpolation == "dino":
            return dino_resample_pos_embed(self.pos_embed, grid, square_image)
        return resample_abs_pos_embed(self.pos_embed, new_size=grid, old_size=self.patch_embed.grid_size,
                                      num_prefix_tokens=1)

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        """CLS and patch tokens with position embeddings, as DINO's `prepare_tokens`.

        Like DINO's strided convolution, the patch embedding ignores the pixels beyond the last
        whole patch (timm would refuse such a size), e.g. the last 4 of a 100 px image at patch 16.
        """
        height, width = x.shape[-2:]
        x = self._pos_embed(self.patch_embed(self._whole_patches(x)), square_image=height == width)
        x = self.patch_drop(x)
        return self.norm_pre(x)

    def _whole_patches(self, x: torch.Tensor) -> torch.Tensor:
        """x without the rows and columns beyond its last whole patch."""
        height, width = x.shape[-2:]
        patch_h, patch_w = self.patch_embed.patch_size
        return x[..., : height - height % patch_h, : width - width % patch_w]

    def forward_features(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                         is_causal: bool = False) -> torch.Tensor:
        """timm's forward_features, with the tokens built by `_tokens`."""
        return self._encode(self._tokens(x), attn_mask, is_causal)

    def _encode(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """The transformer blocks and the final norm over a token sequence (B, tokens, D)."""
        if attn_mask is not None or is_causal:
            for block in self.blocks:
                x = block(x, attn_mask=attn_mask, is_causal=is_causal)
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    @torch.no_grad()
    def get_last_selfattention(self, x: torch.Tensor) -> torch.Tensor:
        """Attention weights of the last block, shape (B, heads, N+1, N+1), the CLS token first."""
        return self._last_attention(self._tokens(x))

    def _last_attention(self, tokens: torch.Tensor) -> torch.Tensor:
        for block in self.blocks[:-1]:
            tokens = block(tokens)
        last = self.blocks[-1]
        return attention_weights(last.attn, last.norm1(tokens))


def attention_weights(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Recompute softmax(q k^T / sqrt(d)) of a timm Attention module, which fuses it away."""
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def vit_kwargs(arch: str, *, patch_size: int, img_size: int, drop_path_rate: float = 0.0,
               pos_embed_interpolation: PosEmbedInterpolation = "dino") -> dict:
    """The constructor arguments of a DINO-compatible ViT of `arch` (shared by the channel-adaptive one)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; allowed: {', '.join(ARCHS)}")
    embed_dim, depth, num_heads = ARCHS[arch]
    return dict(
        img_size=img_size,
        patch_size=patch_size,
        num_classes=0,
        global_pool="token",
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=4.0,
        qkv_bias=True,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        drop_path_rate=drop_path_rate,
        dynamic_img_size=True,
        dynamic_img_pad=False,
        pos_embed_interpolation=pos_embed_interpolation,
    )


def vit(arch: str, *, patch_size: int, in_chans: int, img_size: int, drop_path_rate: float = 0.0,
        pos_embed_interpolation: PosEmbedInterpolation = "dino") -> DinoVisionTransformer:
    """Build a DINO-compatible ViT; `img_size` only sets the stored position-embedding grid."""
    return DinoVisionTransformer(in_chans=in_chans, **vit_kwargs(
        arch, patch_size=patch_size, img_size=img_size, drop_path_rate=drop_path_rate,
        pos_embed_interpolation=pos_embed_interpolation))
