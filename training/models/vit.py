"""Vision Transformer backbone: timm's ViT with the parameter names of facebookresearch/dino.

timm's `VisionTransformer` already names its parameters as DINO's `vision_transformer.py` does
(cls_token, pos_embed, patch_embed.proj, blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2},
norm), uses PyTorch's scaled-dot-product attention and, with `dynamic_img_size`, interpolates the
position embedding to any crop size. This module only adds what DINO's analyses need: the CLS
feature as the output and the last block's attention weights for attention maps.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from timm.models.vision_transformer import VisionTransformer

# (embed_dim, depth, num_heads) as in DINO's vit_tiny / vit_small / vit_base
ARCHS: dict[str, tuple[int, int, int]] = {
    "vit_tiny": (192, 12, 3),
    "vit_small": (384, 12, 6),
    "vit_base": (768, 12, 12),
}


class DinoVisionTransformer(VisionTransformer):
    """A timm ViT whose forward returns the normalised CLS token, shape (B, embed_dim)."""

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        x = self.patch_drop(x)
        return self.norm_pre(x)

    @torch.no_grad()
    def get_last_selfattention(self, x: torch.Tensor) -> torch.Tensor:
        """Attention weights of the last block, shape (B, heads, N+1, N+1), the CLS token first."""
        tokens = self._tokens(x)
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


def vit(arch: str, *, patch_size: int, in_chans: int, img_size: int, drop_path_rate: float = 0.0):
    """Build a DINO-compatible ViT; `img_size` only sets the stored position-embedding grid."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; allowed: {', '.join(ARCHS)}")
    embed_dim, depth, num_heads = ARCHS[arch]
    return DinoVisionTransformer(
        img_size=img_size,
        patch_size=patch_size,
        in_chans=in_chans,
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
    )
