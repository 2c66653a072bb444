"""Position embeddings at other crop sizes: the backbone resamples them as facebookresearch/dino does.

The references here are written from DINO's published `prepare_tokens` / `interpolate_pos_encoding`
semantics (pixel sizes, w0 = rows // patch, scale factor (w0 + 0.1) / sqrt(N), bicubic without
antialias, the stored embedding kept when the token count matches and the image is square) and
from the definition of bicubic resampling by a scale factor, not from the code under test.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from training.config import ModelConfig
from training.models import build_backbone
from training.models.vit import attention_weights, dino_resample_pos_embed

torch.set_num_threads(1)

SMALL = ModelConfig(arch="vit_small", patch_size=16, out_dim=256, drop_path_rate=0.0)
SIZES = [(96, 96), (112, 112), (224, 224), (480, 480), (96, 160), (224, 236), (112, 448), (100, 100), (100, 150)]
"""Square crop sizes; a rectangle; a rectangle with the stored 14 x 14 grid (DINO resamples it); the
stored token count in a 7 x 28 grid; sizes that are not whole patches (DINO ignores the rest)."""


def dino_tokens(backbone, images: torch.Tensor) -> torch.Tensor:
    """DINO's prepare_tokens: patch tokens after the CLS token, plus the position embedding."""
    batch, _, w, h = images.shape  # DINO calls the row count w and the column count h
    patch = backbone.patch_embed.patch_size[0]
    patches = backbone.patch_embed.proj(images).flatten(2).transpose(1, 2)
    tokens = torch.cat([backbone.cls_token.expand(batch, -1, -1), patches], dim=1)
    stored = backbone.pos_embed
    n = stored.shape[1] - 1
    if tokens.shape[1] - 1 == n and w == h:
        return tokens + stored
    side = int(math.sqrt(n))
    w0, h0 = w // patch + 0.1, h // patch + 0.1
    grid = stored[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, scale_factor=(w0 / math.sqrt(n), h0 / math.sqrt(n)), mode="bicubic")
    assert grid.shape[-2:] == (int(w0), int(h0))
    pos = torch.cat([stored[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, stored.shape[-1])], dim=1)
    return tokens + pos


def dino_cls(backbone, images: torch.Tensor) -> torch.Tensor:
    """DINO's forward: blocks, final norm, CLS token."""
    return backbone.norm(backbone.blocks(dino_tokens(backbone, images)))[:, 0]


def keys_cubic(distance: float, a: float = -0.75) -> float:
    """The cubic convolution kernel PyTorch's bicubic mode uses (Keys, a = -0.75)."""
    x = abs(distance)
    if x <= 1:
        return (a + 2) * x**3 - (a + 3) * x**2 + 1
    if x < 2:
        return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
    return 0.0


def bicubic_by_scale(values: np.ndarray, scale: float) -> np.ndarray:
    """Resample axis 0 by `scale`: output i reads input (i + 0.5) / scale - 0.5, borders clamped."""
    size = values.shape[0]
    rows = []
    for i in range(int(math.floor(size * scale))):
        source = (i + 0.5) / scale - 0.5
        left = math.floor(source)
        taps = [(min(max(left + k, 0), size - 1), keys_cubic(source - (left + k))) for k in (-1, 0, 1, 2)]
        rows.append(sum(weight * values[j] for j, weight in taps))
    return np.stack(rows)


@pytest.fixture(scope="module")
def backbones():
    """The same random weights under both resampling options, stored grid 14 x 14 as DINO's ViT-S/16."""
    torch.manual_seed(0)
    dino = build_backbone(SMALL, in_chans=5, img_size=224).eval()
    timm = build_backbone(dataclasses.replace(SMALL, pos_embed_interpolation="timm"), 5, 224).eval()
    timm.load_state_dict(dino.state_dict())
    return dino, timm


def test_default_is_dino():
    assert ModelConfig().pos_embed_interpolation == "dino"
    assert build_backbone(SMALL, in_chans=3, img_size=32).pos_embed_interpolation == "dino"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tokens_and_cls_equal_dino(backbones, size):
    backbone, _ = backbones
    images = torch.randn(2, 5, *size, generator=torch.Generator().manual_seed(size[0] + size[1]))
    with torch.no_grad():
        expected_tokens = dino_tokens(backbone, images)
        torch.testing.assert_close(backbone._tokens(images), expected_tokens, atol=1e-5, rtol=0)
        torch.testing.assert_close(backbone(images), dino_cls(backbone, images), atol=1e-5, rtol=0)
        tokens = expected_tokens
        for block in backbone.blocks[:-1]:
            tokens = block(tokens)
        expected_attention = attention_weights(backbone.blocks[-1].attn, backbone.blocks[-1].norm1(tokens))
    torch.testing.assert_close(backbone.get_last_selfattention(images), expected_attention, atol=1e-5, rtol=0)


@pytest.mark.parametrize("grid", [(6, 6), (7, 7), (30, 30), (6, 10)])
def test_resampling_is_bicubic_by_dinos_scale_factor(backbones, grid):
    """Separable bicubic resampling by (grid + 0.1) / 14, computed in float64 from its definition."""
    stored = backbones[0].pos_embed.detach()
    table = stored[0, 1:].double().numpy().reshape(14, 14, -1)
    rows = bicubic_by_scale(table, (grid[0] + 0.1) / 14)
    both = bicubic_by_scale(rows.transpose(1, 0, 2), (grid[1] + 0.1) / 14).transpose(1, 0, 2)
    resampled = dino_resample_pos_embed(stored, grid)
    assert resampled.shape == (1, 1 + grid[0] * grid[1], stored.shape[-1])
    np.testing.assert_array_equal(resampled[0, 0].numpy(), stored[0, 0].numpy())
    np.testing.assert_allclose(resampled[0, 1:].double().numpy(), both.reshape(-1, stored.shape[-1]), atol=1e-6)


def test_stored_grid_is_used_unchanged(backbones):
    stored = backbones[0].pos_embed
    assert dino_resample_pos_embed(stored, (14, 14)) is stored


def test_timm_option_resamples_differently(backbones):
    """timm's antialiased `size=` resampling: same shapes, measurably different features at 96 px."""
    dino, timm = backbones
    generator = torch.Generator().manual_seed(1)
    local, full = torch.randn(2, 5, 96, 96, generator=generator), torch.randn(1, 5, 224, 224, generator=generator)
    with torch.no_grad():
        gap = (timm(local) - dino(local)).abs().max().item()
        gap_at_stored_grid = (timm(full) - dino(full)).abs().max().item()
    assert gap > 1e-3
    assert gap_at_stored_grid < 1e-6
